"""Every MySQL/MariaDB error the sink meets, classified once, here (as Flink's ``XaFacade`` does).

=================================  ============================================================
what went wrong                    what the sink raises
=================================  ============================================================
a server or client error code      the verdict of :data:`ERRORS` (unknown codes are fatal)
no error code, ``InterfaceError``  :class:`RetryableError`: the connection was closed before
                                   the statement was sent (see :func:`classify`)
no error code, anything else       :class:`FatalError`: the outcome is unknown, never retried
a warning of ``LOAD DATA`` or of   :func:`rejected_rows`: the first warning's code, as a
``INSERT`` (or a missing row)      :class:`SchemaMismatchError` unless the table says fatal
a value Python cannot send         :func:`unsendable`: :class:`SchemaMismatchError`
1062 on the marker row             :func:`marker_error`: the id was used once (kit wording)
1402/1613/1614 on ``XA COMMIT``    :func:`lost`: the server rolled the branch back (kit wording)
a certificate refused (2003 with   :class:`ConfigurationError` naming ``tls=``/``ca_bundle=``
OpenSSL's reason), no TLS offered  (``host=`` for a name the certificate lacks): never retried,
(2026), plain text refused (4151)  never a fall back to plain text
the client certificate refused     :class:`ConfigurationError` naming ``client_cert=`` and
                                   ``client_key=``
(2003/2006/2013 with its alert);    (1045 names the password and the client certificate: the
none given to a user REQUIRE X509  server answers both alike); MariaDB closing the TLS
(1045), closed without an alert    connection at the login (TLS 1.3, another CA's certificate)
(2006/2013 with SSLEOFError)       stays retryable, its fix naming ``client_cert=`` too
``mode="keyed"``'s READ COMMITTED  :class:`ConfigurationError` naming ``binlog_format``
refused by a server logging
statements (1665)
a denied privilege (1044, 1142,    :class:`ConfigurationError` with the ``GRANT`` to run
1143, 1227)
a refused login (1045) after the   the connection is opened once more with the new password
password's Secret changed          (:func:`refused_credentials`); unchanged: as above
the password in a message          :func:`twophase.kit.scrubbed` over :func:`classify`: ``***``
                                   (also in the driver's exception the error is chained to)
=================================  ============================================================

The other modules use the codes below only to steer (1397: "no such xid", the refusal of
``LOAD DATA LOCAL``), never to build an error of their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pymysql

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

SYSTEM = "MySQLXASink"

# -- codes the sink steers by (server ER_* and client CR_*) -----------------------------------
XAER_NOTA = 1397  # unknown xid: committed, rolled back, or never prepared
DUPLICATE_KEY = 1062
NO_SUCH_TABLE = 1146
DEPRECATED_SYNTAX = 1287  # MySQL >= 8.0.20 warns about VALUES() in ON DUPLICATE KEY UPDATE
LOCAL_INFILE_REFUSED = frozenset({1148, 2068, 3948, 4166})  # MySQL 8: 3948, MariaDB: 4166
ROLLED_BACK = frozenset({1402, 1613, 1614})  # XA_RBROLLBACK, XA_RBTIMEOUT, XA_RBDEADLOCK
ACCESS_DENIED = 1045  # a refused login: the password (or a client certificate REQUIREd)
LOCK_WAIT_TIMEOUT = 1205
DATABASE_ACCESS_DENIED = 1044  # a database-level privilege (CREATE TEMPORARY TABLES) refused
#: ER_BINLOG_STMT_MODE_AND_ROW_ENGINE: binlog_format=STATEMENT refuses InnoDB writes under
#: READ COMMITTED (the keyed mode's isolation)
STATEMENT_BINLOG_REFUSED = 1665

FIX_RETRY = "retried automatically; if it persists, check the server and the network"
FIX_LOCKS = (
    "retried automatically; if it persists, another writer or an old prepared XA branch holds "
    "the rows: list them with XA RECOVER and let `python -m twophase.cleanup` resolve them. "
    "In mode='keyed' a key of one batch written by two tasks waits for the other task's "
    "prepared branch until the batch is decided: keep the rows routed by key "
    "(route_by_key= of twophase.spark.write_stream/write, on by default)"
)
FIX_STATEMENT_BINLOG = (
    "mode='keyed' writes under READ COMMITTED, which InnoDB cannot log as statements: SET "
    "GLOBAL binlog_format = 'ROW' (or 'MIXED', MariaDB's default) on the server (and in its "
    "configuration file), then restart the query"
)
FIX_ROWS = "fix the rows (or the table definition) and restart the query"
FIX_LOCAL_INFILE = "SET GLOBAL local_infile=1 on the server, or bulk='insert'"
FIX_UNKNOWN_CODE = "look up the server error code and fix it"
FIX_TLS_VERIFY = (
    "the server's certificate must be issued by a CA in ca_bundle= (the system's CA store if "
    "None) and name the host the sink connects to: pass ca_bundle= the CA that issued it, or "
    "connect by a name the certificate holds; only on a network you trust, tls='require' "
    "encrypts without verifying")
FIX_TLS_HOST_NAME = (
    "the server's certificate does not name the host the sink connects to: connect by a name "
    "it holds (host=), or have the server present a certificate for this name (ca_bundle= "
    "is right: the issuer was verified); only on a network you trust, tls='require' encrypts "
    "without verifying")
FIX_TLS_OFFERED = (
    "configure TLS on the server (its ssl_cert and ssl_key; require_secure_transport=ON), or, "
    "only on "
    "a network you trust, tls='off'")
FIX_TLS_REQUIRED = "the server accepts TLS connections only: use tls='verify' (the default)"
#: MariaDB and MySQL answer a login without the client certificate a user REQUIREs (or with
#: one of another subject) with the same 1045 as a wrong password: the fix names both.
FIX_ACCESS_DENIED = (
    "check the user and password given to the sink; if the user is created REQUIRE X509, "
    "SUBJECT or ISSUER, the server requires a client certificate too (it denies a login "
    "without one this way): pass client_cert= the client certificate (issued by a CA of the "
    "server's ssl_ca, of the subject it REQUIREs) and client_key= its key. MariaDB also answers "
    "a plain-text login this way when it has require_secure_transport=ON: then use "
    "tls='verify', the default, not tls='off'")
#: The server's TLS refused the certificate the sink presented (an alert in the handshake).
FIX_CLIENT_CERT = (
    "the server does not accept the client certificate client_cert= (it is not issued by a CA of "
    "the server's ssl_ca): pass client_cert= and client_key= a certificate issued by the CA the "
    "server trusts for clients")
#: A TLS connection the server closed without a word (no close_notify): a crash or the network
#: mid-session; and at the login, with TLS 1.3, MariaDB's refusal of a client certificate when
#: its alert is lost (it closes the socket with the login unread: the reset may overtake the
#: alert). Retried, the fix naming both.
FIX_TLS_CLOSED = (
    f"{FIX_RETRY}; if it happens at every login with client_cert= given, the server does not "
    "accept that client certificate (it is not issued by a CA of the server's ssl_ca): pass "
    "client_cert= and client_key= a certificate issued by the CA the server trusts for clients")
#: With TLS 1.3 the server's alert refusing the client certificate comes after the client's
#: side of the handshake: PyMySQL reports it as a lost connection (2006, 2013).
_CLIENT_CERT_ALERTS = (Condition("ALERT_UNKNOWN_CA", (ConfigurationError, FIX_CLIENT_CERT)),
                       Condition("ALERT_BAD_CERTIFICATE", (ConfigurationError, FIX_CLIENT_CERT)))
_LOST_AT_TLS = (*_CLIENT_CERT_ALERTS, Condition("SSLEOFError", (RetryableError, FIX_TLS_CLOSED)))
FIX_GRANT = ("GRANT the sink's user the privilege named above (the grants the sink needs are "
             "listed in docs/sinks/mysql.md, 'Grants')")
FIX_GRANT_DATABASE = (
    f"{FIX_GRANT}; MariaDB refuses a database that does not exist this way too, to a user "
    "without privileges there: check the sink's database name first")
FIX_NO_CODE = (
    "check what sits between this host and the server (a proxy, a load balancer, TLS "
    "offloading) and the PyMySQL version, then restart the query: recovery commits or aborts "
    "whatever was prepared"
)
UNPREPARED_NOTE = (
    "The branch is discarded (the server rolls back an unprepared branch when its connection "
    "ends) and never committed: the partition must be written again."
)

ERRORS = ErrorTable(
    system=SYSTEM,
    default=(FatalError, FIX_UNKNOWN_CODE),
    rules={
        LOCK_WAIT_TIMEOUT: (RetryableError, FIX_LOCKS),
        1213: (RetryableError, FIX_LOCKS),  # deadlock
        1613: (RetryableError, FIX_LOCKS),  # XA_RBTIMEOUT: branch rolled back
        1614: (RetryableError, FIX_LOCKS),  # XA_RBDEADLOCK: branch rolled back
        1040: (RetryableError, "raise max_connections or lower commit/partition parallelism"),
        1053: (RetryableError, FIX_RETRY),  # server shutdown in progress
        1290: (RetryableError, "the server is read-only (failover?); retried automatically"),
        1836: (RetryableError, "the server is read-only (failover?); retried automatically"),
        1927: (RetryableError, FIX_RETRY),  # connection killed
        2003: (RetryableError, "check that the server runs and host:port is reachable from here"),
        2026: (ConfigurationError, FIX_TLS_OFFERED),  # TLS asked for, the server offers none
        4151: (ConfigurationError, FIX_TLS_REQUIRED),  # MariaDB: require_secure_transport
        2006: (RetryableError, FIX_RETRY),  # server has gone away
        2013: (RetryableError, FIX_RETRY),  # lost connection during query
        2055: (RetryableError, FIX_RETRY),  # lost connection (system error)
        ACCESS_DENIED: (ConfigurationError, FIX_ACCESS_DENIED),
        DATABASE_ACCESS_DENIED: (ConfigurationError, FIX_GRANT_DATABASE),  # also: no such database
        1049: (ConfigurationError, "create the database or fix the sink's database name"),
        1142: (ConfigurationError, FIX_GRANT),
        1143: (ConfigurationError, FIX_GRANT),
        1227: (ConfigurationError, FIX_GRANT + "; MySQL 8: XA_RECOVER_ADMIN for XA RECOVER"),
        STATEMENT_BINLOG_REFUSED: (ConfigurationError, FIX_STATEMENT_BINLOG),
        1148: (ConfigurationError, FIX_LOCAL_INFILE),
        3948: (ConfigurationError, FIX_LOCAL_INFILE),
        4166: (ConfigurationError, FIX_LOCAL_INFILE),
        NO_SUCH_TABLE: (SchemaMismatchError, "create the table, or fix the sink's table name"),
        1054: (SchemaMismatchError, "add the column to the table, or drop/rename it in the rows"),
        1406: (SchemaMismatchError, "widen the column or shorten the values"),
        1048: (SchemaMismatchError, "make the column nullable or fill the NULL values"),
        1263: (SchemaMismatchError, "make the column nullable or fill the NULL values"),
        1364: (SchemaMismatchError, "give the column a default or write it"),
        1366: (SchemaMismatchError, "cast the values to the column's type"),
        1264: (SchemaMismatchError, "widen the column's type or fix the values"),
        1265: (SchemaMismatchError, "widen the column's type or fix the values"),
        1292: (SchemaMismatchError, "cast the values to the column's type"),
        1261: (SchemaMismatchError, "the rows have fewer values than columns: " + FIX_ROWS),
        1262: (SchemaMismatchError, "the rows have more values than columns: " + FIX_ROWS),
        DUPLICATE_KEY: (SchemaMismatchError,
                        "the rows repeat a key of the table or of the batch: use mode='upsert' "
                        "or deduplicate the rows"),
        1452: (SchemaMismatchError,
               "write the referenced parent rows first, or drop the FOREIGN KEY"),
        3819: (SchemaMismatchError, "fix the rows that violate the CHECK constraint"),
        4025: (SchemaMismatchError, "fix the rows that violate the CHECK constraint"),
    },
    conditions={
        2006: _LOST_AT_TLS,
        2013: _LOST_AT_TLS,
        # PyMySQL reports a failed TLS handshake as "can't connect" (2003) with OpenSSL's words
        2003: (*_CLIENT_CERT_ALERTS,
               Condition("mismatch, certificate is not valid for",
                         (ConfigurationError, FIX_TLS_HOST_NAME)),
               Condition("CERTIFICATE_VERIFY_FAILED", (ConfigurationError, FIX_TLS_VERIFY)),
               Condition("[SSL", (ConfigurationError, FIX_TLS_VERIFY))),
    },
)


def error_code(exc: BaseException) -> int | None:
    """The server or client error number of a PyMySQL error; None if it carries none.

    PyMySQL puts the number first in ``args``; its own client-side errors either use a
    ``CR_*`` number (2013: lost connection) or none at all (``InterfaceError(0, '')``,
    ``InternalError('Packet sequence number wrong ...')``).
    """
    args: tuple[Any, ...] = exc.args
    code = args[0] if args else None
    return code if isinstance(code, int) and code > 0 else None


def error_text(exc: BaseException) -> str:
    args: tuple[Any, ...] = exc.args
    if len(args) > 1:
        return str(args[1])
    return str(args[0]) if args else ""


def classify(exc: BaseException, what: str) -> TwoPhaseError:
    """A PyMySQL error as a twophase error naming the step (``what``, with the server) and fix.

    An error without a code is classified by its type. PyMySQL raises ``InterfaceError``
    without a code only when a statement is about to be sent on a connection whose socket is
    already gone (closed by an earlier network error), so the statement never ran: a retry is
    provably safe wherever the sink uses a connection. A writer's unprepared branch ended with
    its session (the server rolls it back), a prepared one is never touched through its
    writer's connection again, and every driver step (commit, abort, fence, purge) is
    idempotent and opens a fresh connection when retried. Any other error without a code means
    the client and the server disagree about the protocol (a sequence error, an unexpected
    packet): what the statement did is unknown, so it is fatal, not retried blindly.
    """
    code = error_code(exc)
    if code is not None:
        return ERRORS.error(code, what, f"[{code}] {error_text(exc)}")
    if isinstance(exc, pymysql.err.InterfaceError):
        return RetryableError(
            f"{SYSTEM}: {what} failed: the connection was already closed (PyMySQL "
            "InterfaceError, no error code), so the statement was never sent.", fix=FIX_RETRY)
    return FatalError(
        f"{SYSTEM}: {what} failed: PyMySQL raised {type(exc).__name__} without an error code "
        f"({error_text(exc) or 'no message'}): the client and the server disagree about the "
        "protocol, so what the statement did is unknown; it is not retried.", fix=FIX_NO_CODE)


def refused_credentials(exc: BaseException) -> bool:
    """Whether the server refused the login (1045): a rotated password is read again
    (:func:`twophase.kit.retried_if_rotated`)."""
    return error_code(exc) == ACCESS_DENIED


def classify_unprepared(exc: BaseException, what: str) -> TwoPhaseError:
    """:func:`classify` for a writer's branch before it is prepared: retryable errors say that
    the branch is gone and the partition must be written again."""
    error = classify(exc, what)
    if isinstance(error, RetryableError):
        return RetryableError(f"{error.cause} {UNPREPARED_NOTE}", fix=error.fix)
    return error


def rejected_rows(warnings: Sequence[tuple[int, str]], *, affected: int,
                  expected: int | None, what: str) -> FatalError:
    """The server took a statement but not its rows as given (``LOAD DATA LOCAL`` turns row
    errors into warnings and skips the row): fatal, of the first warning's kind."""
    code = warnings[0][0] if warnings else None
    kind, fix = ERRORS.verdict(code) if code is not None else (SchemaMismatchError, FIX_ROWS)
    if not issubclass(kind, FatalError):
        kind, fix = SchemaMismatchError, FIX_ROWS
    detail = ("; ".join(f"{c}: {m}" for c, m in warnings[:3])
              or f"{affected} of {expected} rows applied")
    return kind(f"{what}: the server did not take the rows as given ({detail}).", fix=fix)


def unsendable(txn_id: TxnId, exc: Exception) -> SchemaMismatchError:
    """A value Python cannot put into a statement (an instant whose UTC time has no year)."""
    return SchemaMismatchError(
        f"a value of transaction {txn_id} cannot be sent to MySQL: {exc}.",
        fix="cast the columns to strings, numbers, binary or timestamps")


def unsupported_value(column: str, value: object) -> SchemaMismatchError:
    return SchemaMismatchError(
        f"column {column!r} holds a {type(value).__name__} value, which MySQL cannot store.",
        fix="cast the column to a string, number, binary or timestamp (e.g. to_json) first")


def wrong_width(txn_id: TxnId, width: int, columns: Sequence[str]) -> SchemaMismatchError:
    return SchemaMismatchError(
        f"a row of transaction {txn_id} has {width} values for {len(columns)} columns "
        f"{tuple(columns)}.", fix=FIX_ROWS)


def marker_error(exc: BaseException, txn_id: TxnId, *, where: str,
                 markers: str) -> TwoPhaseError | None:
    """What a failed marker INSERT means beyond :func:`classify`; None: nothing special."""
    code = error_code(exc)
    if code == DUPLICATE_KEY:
        return transaction_id_reused(txn_id, where=where)
    if code == NO_SUCH_TABLE:
        return ConfigurationError(
            f"marker table {markers} is missing.",
            fix="call sink.check_schema()/create_tables() first (twophase.spark does), "
            "or create it with sinks.mysql.MARKER_TABLE_DDL")
    return None


def lost(handle: Handle, xid: str, *, where: str, markers: str,
         why: str) -> TransactionLostError:
    """A decided branch that is neither prepared nor provably committed (kit wording)."""
    return transaction_lost(handle, where=where, why=(
        f"XA xid {xid}: {why}. Either it was rolled back outside this commit (XA ROLLBACK by "
        "an operator or another job's cleanup, or an abort of this very transaction): then "
        f"its rows are NOT in the table; or its marker row in {markers} was purged after it "
        "committed (purge markers only long after any recovery could still run): then they "
        "are. The server's general or audit log shows which"))
