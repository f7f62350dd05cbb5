"""Every PostgreSQL error the sink meets, classified once, here: by SQLSTATE, its condition
and its class (the first two characters).

=================================  ============================================================
what went wrong                    what the sink raises
=================================  ============================================================
a server error (a SQLSTATE)        the verdict of :data:`ERRORS`: a condition of the code (its
                                   message), else the code, else its class (``08``
                                   connection, ``22`` data, ``23`` integrity, ``40``
                                   rollback, ``53`` resources, ``57`` operator), else fatal
a client error (no SQLSTATE)       by psycopg's exception type: a lost or closed connection is
                                   retryable (an unprepared transaction ended with its
                                   session; every driver step is idempotent), a value psycopg
                                   cannot send is a schema mismatch, TLS or a password is
                                   configuration
23505 on the marker row            :func:`marker_error`: the id was used once (kit wording)
42704 on ``COMMIT PREPARED``       no such gid: the committer reads the marker (committed) or
                                   calls it :func:`lost` (kit wording)
a certificate refused (another CA, :class:`ConfigurationError` naming ``ca_bundle=`` (or
another host name, no CA given)    ``host=``) and ``tls='require'``: never retried, never a
                                   fall back
a server without TLS               :class:`ConfigurationError` naming both ways out: TLS on the
                                   server (with a ``hostssl`` line), or ``tls='off'``
                                   on a trusted network; never a mode that needs TLS too
no pg_hba.conf line (for plain     :class:`ConfigurationError`: the ``hostssl`` line takes TLS
text, or for any encryption)       only (``tls='verify'``), else the line to add
a client certificate required      :class:`ConfigurationError` naming ``client_cert=`` and
(none given, another CA's, another ``client_key=`` and what the certificate
user's under ``verify-full``)      must be: issued by the server's CA, named for the user
55P03 (a lock wait ran out) in a   :func:`sinks.postgres.locks.classify_lock_wait`: the
writer                             holder named (a prepared transaction of the same batch:
                                   fatal, the stream is not routed by key; an orphan; another
                                   client), each with its fix; elsewhere :data:`FIX_LOCKS`
42501 (a privilege denied)         :class:`ConfigurationError` with the ``GRANT`` to run
a refused password after the      the session is opened once more with the new password
password's Secret changed          (:func:`refused_credentials`); unchanged: as above
the password in a message          :func:`twophase.kit.scrubbed` over :func:`classify`: ``***``
                                   (also in the driver's exception the error is chained to)
=================================  ============================================================
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg

from twophase import (
    ConfigurationError,
    FatalError,
    Handle,
    RetryableError,
    SchemaMismatchError,
    TransactionLostError,
    TwoPhaseError,
    TxnId,
)
from twophase.kit import Condition, ErrorTable, transaction_id_reused, transaction_lost

SYSTEM = "PostgresSink"

# -- codes the sink steers by ------------------------------------------------------------------
UNDEFINED_OBJECT = "42704"  # COMMIT/ROLLBACK PREPARED of a gid the server does not know
UNIQUE_VIOLATION = "23505"
UNDEFINED_TABLE = "42P01"
LOCK_NOT_AVAILABLE = "55P03"  # lock_timeout ran out
#: A refused login: SQLSTATE 28P01 (invalid password), or libpq's words for it at connect time
#: (where psycopg carries no SQLSTATE).
REFUSED_LOGIN = "28P01"
REFUSED_LOGIN_WORDS = "password authentication failed"

FIX_RETRY = "retried automatically; if it persists, check the server and the network"
FIX_LOCKS = (
    "retried automatically; if it persists, another writer or an old prepared transaction "
    "holds the rows: list them in pg_prepared_xacts (an orphan of this query: `python -m "
    "twophase.status` names it and `python -m twophase.cleanup` resolves it) and "
    "pg_stat_activity (another client: end its transaction); a prepared transaction of the "
    "same batch means a keyed stream is not routed by key (route_by_key=False?)")
FIX_ROWS = "fix the rows (or the table definition) and restart the query"
FIX_PREPARED_OFF = ("set max_prepared_transactions to at least twice the partitions of a "
                    "batch in postgresql.conf and restart the server")
FIX_PRIVILEGE = ("GRANT the sink's user the privilege named above (the grants the sink needs "
                 "are listed in docs/sinks/postgres.md, 'Grants')")
FIX_TLS = (
    "the server's certificate must be issued by a CA of ca_bundle= (libpq's sslrootcert) and, "
    "with tls='verify' (the default), name the host the sink connects to: pass "
    "ca_bundle= the CA that issued it, or connect by a name the certificate holds; only on a "
    "network you trust, tls='require' encrypts without verifying")
FIX_HOST_NAME = (
    "the server's certificate does not name the host the sink connects to: connect by a name "
    "it holds (host=), or have the server present a certificate for this name (ca_bundle= is "
    "right: the issuer was verified); only on a network you trust, tls='require' encrypts "
    "without verifying")
FIX_NO_CA = (
    "no CA to check the server's certificate with (libpq looked for ~/.postgresql/root.crt): "
    "pass ca_bundle= the CA that issued it (a PEM file, or 'system' for the system's CA store "
    "with libpq >= 16); only on a network you trust, tls='require' encrypts without "
    "verifying")
#: The server has no TLS at all: every mode but plain text fails the same way, so this names
#: the two ways out and no other mode (a fix that names one leads the user in a circle).
FIX_TLS_OFF = (
    "the server has TLS turned off. Either turn it on at the server (ssl=on, ssl_cert_file and "
    "ssl_key_file in postgresql.conf; a 'hostssl' line for this host, user and database in "
    "pg_hba.conf in place of its 'host' line, so that plain text is refused; then reload) and "
    "pass ca_bundle= the CA that issued its certificate; or, only on a network you trust, "
    "tls='off' (plain text)")
FIX_HBA_TLS_ONLY = (
    "the server's pg_hba.conf takes this host, user and database over TLS only ('hostssl' "
    "lines) or not at all: use tls='verify' (the default) with ca_bundle= the CA that "
    "issued the server's certificate; if it has no 'hostssl' line for them either, the "
    "server's administrator must add one")
FIX_HBA = (
    "the server's pg_hba.conf has no line for this host, user and database with TLS: the "
    "server's administrator must add one ('hostssl <database> <user> <address> scram-sha-256' "
    "takes TLS connections only, as the sink makes them) and reload the server "
    "(SELECT pg_reload_conf())")
_CLIENT_CERT_OPTIONS = ("client_cert= <the client certificate, PEM> and client_key= <its key, "
                        "readable by the owner only>")
FIX_CLIENT_CERT_MISSING = (
    "the server's pg_hba.conf line for this host, user and database requires a client "
    "certificate (clientcert=verify-ca/verify-full, or the cert method): pass "
    f"{_CLIENT_CERT_OPTIONS}, a certificate issued by a CA of the server's ssl_ca_file (with "
    "verify-full or cert, its common name the user name)")
FIX_CLIENT_CERT_UNTRUSTED = (
    "the server does not accept the client certificate given (client_cert=): it is not "
    "issued by a CA of the server's ssl_ca_file; pass "
    f"{_CLIENT_CERT_OPTIONS} with a certificate issued by that CA")
FIX_CLIENT_CERT_NAME = (
    "the client certificate's common name must be the user name (clientcert=verify-full, or "
    f"the cert method): pass {_CLIENT_CERT_OPTIONS} with a certificate issued for this user, "
    "or have a pg_ident.conf map name it")
UNPREPARED_NOTE = (
    "The transaction is discarded (PostgreSQL rolls back an unprepared transaction when its "
    "session ends) and never committed: the partition must be written again.")

_RETRY: tuple[type[TwoPhaseError], str] = (RetryableError, FIX_RETRY)

ERRORS = ErrorTable(
    system=SYSTEM,
    default=(FatalError, "look up the SQLSTATE in PostgreSQL's appendix A and fix the cause"),
    classes={
        "08": _RETRY,                                            # connection exception
        "22": (SchemaMismatchError, "cast or fix the values named above: " + FIX_ROWS),
        "23": (SchemaMismatchError, "fix the rows that violate the constraint: " + FIX_ROWS),
        "40": (RetryableError, FIX_LOCKS),                       # serialization, deadlock
        "53": (RetryableError, "the server is short of a resource; retried automatically"),
        "57": _RETRY,                                            # shutdown, cancel, crash
        "28": (ConfigurationError, "check the user and password given to the sink"),
        "3D": (ConfigurationError, "create the database or fix the sink's database="),
        "42": (SchemaMismatchError, "make the table match the rows, then restart"),
    },
    rules={
        LOCK_NOT_AVAILABLE: (RetryableError, FIX_LOCKS),         # lock_timeout
        "25006": (RetryableError, "the server is a read-only standby (failover?); retried"),
        "42501": (ConfigurationError, FIX_PRIVILEGE),
        "42710": (FatalError, "a prepared transaction of this id exists already: let "
                  "`python -m twophase.cleanup` resolve it, then restart the query"),
        "23505": (SchemaMismatchError, "the rows repeat a key of the table or of the batch: "
                  "use mode='upsert' with key=, or deduplicate the rows"),
        "InterfaceError": (RetryableError, FIX_RETRY),           # the connection is closed
        "OperationalError": _RETRY,                              # lost before a reply
        "ProgrammingError": (SchemaMismatchError,
                             "cast the column to a string, number, binary or timestamp"),
        "DataError": (SchemaMismatchError, "cast the column to a type PostgreSQL can store"),
    },
    conditions={
        "55000": (Condition("are disabled", (ConfigurationError, FIX_PREPARED_OFF)),
                  Condition("is busy", (RetryableError, "another session is resolving the "
                                        "same prepared transaction; retried automatically"))),
        "53200": (Condition("prepared transactions", (ConfigurationError, FIX_PREPARED_OFF)),),
        "OperationalError": (
            Condition("does not support SSL", (ConfigurationError, FIX_TLS_OFF)),
            Condition("root certificate file", (ConfigurationError, FIX_NO_CA)),
            Condition("does not match host name", (ConfigurationError, FIX_HOST_NAME)),
            Condition("no encryption", (ConfigurationError, FIX_HBA_TLS_ONLY)),
            Condition("requires a valid client certificate",
                      (ConfigurationError, FIX_CLIENT_CERT_MISSING)),
            Condition("alert unknown ca", (ConfigurationError, FIX_CLIENT_CERT_UNTRUSTED)),
            Condition("alert bad certificate", (ConfigurationError, FIX_CLIENT_CERT_UNTRUSTED)),
            Condition("clientcert=verify-full", (ConfigurationError, FIX_CLIENT_CERT_NAME)),
            Condition("no pg_hba.conf entry", (ConfigurationError, FIX_HBA)),
            Condition("SSL", (ConfigurationError, FIX_TLS)),
            Condition("certificate", (ConfigurationError, FIX_TLS)),
            Condition(REFUSED_LOGIN_WORDS,
                      (ConfigurationError, "check the user and password given to the sink")),
            Condition("does not exist",
                      (ConfigurationError, "create it, or fix the sink's database= or user=")),
        ),
    },
)


def error_code(exc: BaseException) -> str:
    """The SQLSTATE of a psycopg error, else the name of its psycopg exception type."""
    state = getattr(exc, "sqlstate", None)
    if isinstance(state, str) and state:
        return state
    for kind in type(exc).__mro__:
        if kind.__module__.startswith("psycopg") and kind.__name__ in ERRORS.rules:
            return kind.__name__
    return type(exc).__name__


def classify(exc: BaseException, what: str) -> TwoPhaseError:
    """A psycopg error as a twophase error naming the step (``what``, with the server)."""
    code = error_code(exc)
    message = str(exc).strip() or type(exc).__name__
    return ERRORS.error(code, what, f"[{code}] {message}")


def refused_credentials(exc: BaseException) -> bool:
    """Whether the server refused the password: a rotated one is read again
    (:func:`twophase.kit.retried_if_rotated`)."""
    return error_code(exc) == REFUSED_LOGIN or REFUSED_LOGIN_WORDS in str(exc)


def classify_unprepared(exc: BaseException, what: str) -> TwoPhaseError:
    """:func:`classify` for a writer before PREPARE: a retryable error says the transaction
    is gone and the partition must be written again."""
    error = classify(exc, what)
    if isinstance(error, RetryableError):
        return RetryableError(f"{error.cause} {UNPREPARED_NOTE}", fix=error.fix)
    return error


def marker_error(exc: psycopg.Error, txn_id: TxnId, *, where: str,
                 markers: str) -> TwoPhaseError | None:
    """What a failed marker INSERT means beyond :func:`classify`; None: nothing special."""
    if exc.sqlstate == UNIQUE_VIOLATION:
        return transaction_id_reused(txn_id, where=where)
    if exc.sqlstate == UNDEFINED_TABLE:
        return ConfigurationError(
            f"marker table {markers} is missing.",
            fix="call sink.check_schema()/create_tables() first (twophase.spark does), or "
            "create it with sinks.postgres.MARKER_TABLE_DDL")
    return None


def wrong_width(width: int, columns: Sequence[str]) -> SchemaMismatchError:
    return SchemaMismatchError(
        f"a row has {width} values for the {len(columns)} columns {tuple(columns)}.",
        fix="write rows of the columns the transaction's context names")


def lost(handle: Handle, gid: str, *, where: str, markers: str) -> TransactionLostError:
    """A decided transaction that is neither prepared nor provably committed (kit wording)."""
    return transaction_lost(handle, where=where, why=(
        f"gid {gid} is not in pg_prepared_xacts and its marker row is not in {markers}. "
        "Either it was rolled back outside this commit (ROLLBACK PREPARED by an operator or "
        "another job's cleanup): then its rows are NOT in the table; or its marker was purged "
        "after it committed (purge only long after any recovery could still run): then they "
        "are"))


def lost_staged(handle: Handle, found: int, *, where: str, staging: str) -> TransactionLostError:
    """A decided staged transaction whose staged rows are not all there and whose marker is
    not written (kit wording)."""
    return transaction_lost(handle, where=where, why=(
        f"{staging} holds {found} of its {handle.rows} staged rows and its marker row is not "
        "written: the staged rows were deleted outside this commit (an abort by another job's "
        "cleanup, or by hand); nothing of its batch was published by this commit"))
