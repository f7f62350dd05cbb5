"""Every Redis error the sink meets, classified once, here.

redis-py raises an exception class per kind of failure and, for the server's error replies, a
:class:`redis.exceptions.ResponseError` whose message begins with the server's error code
(``OOM``, ``BUSY``, ``NOPERM`` ...). An error is looked up by that code (:func:`code_of`),
else by its class:

=============================================  ================================================
what went wrong                                what the sink raises
=============================================  ================================================
no connection, a timeout, ``LOADING``,         :class:`RetryableError`: the server restarts,
``BUSY`` (another script runs), ``TRYAGAIN``,  loads its AOF, fails over or is busy; retried
``CLUSTERDOWN``, ``MASTERDOWN``, ``READONLY``  with backoff by twophase
(a replica after a failover), too many
connections
``OOM`` (``maxmemory`` reached)                :class:`RetryableError` naming ``maxmemory``:
                                               nothing of the step was written (every check
                                               of the commit runs before its first write)
a refused login (``WRONGPASS``, ``NOAUTH``)    :class:`ConfigurationError` naming
                                               ``username=``/``password=``; after the
                                               password's ``Secret`` changed, the client is
                                               made again with the new one first
``NOPERM`` (the ACL)                           :class:`ConfigurationError` naming the rule to
                                               grant (:func:`acl_rules`)
``WRONGTYPE`` (the stream's key holds another  :class:`ConfigurationError`: write to a stream
type)                                          or a key that does not exist yet
``CROSSSLOT`` (keys of two cluster slots)      :class:`ConfigurationError`
a TLS handshake refused                        :class:`ConfigurationError` naming ``ca_bundle``
                                               and the host name
:data:`STAGING_INCOMPLETE` (the commit found   never classified: the committer raises
fewer staged chunks than the handle names)     :class:`TransactionLostError`
:data:`COMMIT_IN_PROGRESS` (an abort of a      :class:`FatalError` (:func:`abort_refused`):
decided transaction part moved)                recovery commits the rest
anything else                                  :class:`FatalError` (never retried blindly)
=============================================  ================================================

Messages carry the server's words, never a password (redis-py's errors do not carry it; the
classifier is :func:`twophase.kit.scrubbed` where a password is in use).
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence

import redis.exceptions as rexc

from twophase import ConfigurationError, FatalError, RetryableError, TwoPhaseError
from twophase.kit import ErrorTable

SYSTEM = "RedisStreamSink"

#: The commit script's refusal when a staging stream holds fewer chunks than its handle says.
STAGING_INCOMPLETE = "TWOPHASE_STAGING_INCOMPLETE"
#: The abort script's refusal for a transaction whose commit has begun (part of it moved).
COMMIT_IN_PROGRESS = "TWOPHASE_COMMIT_IN_PROGRESS"
#: What the sink catches around redis-py calls and hands to :func:`classify`.
ERRORS_CAUGHT: tuple[type[BaseException], ...] = (rexc.RedisError, rexc.RedisClusterException,
                                                  ssl.SSLError)

#: The commands the sink's ACL user runs (scripts run as the user: the commands they call
#: count too), by what needs them.
ACL_COMMANDS: Sequence[str] = (
    "+ping", "+info", "+config|get",  # the preflight: durability settings
    "+xadd", "+xlen", "+xrange", "+xtrim", "+type",  # staging, the commit, the preflight
    "+hset", "+hget", "+hexists", "+hdel", "+hkeys", "+hscan", "+del", "+time",
    "+eval", "+evalsha", "+script|load", "+cluster|slots", "+cluster|shards")

FIX_RETRY = "retried automatically; if it persists, check that the Redis server is up"
FIX_MEMORY = ("raise the server's maxmemory (or free memory): nothing of this step was "
              "written; it is retried")
FIX_LOGIN = ("check username= and password= (a Secret: its file or variable); the user must "
             "exist and be 'on' in the server's ACL")
FIX_TLS = ("check ca_bundle= (the CA that signed the server's certificate) and that the "
           "certificate names the host connected to; tls='require' skips the check on a "
           "network you trust")
FIX_TYPE = "write to a key that holds a stream, or to one that does not exist yet"
FIX_SLOT = ("keep the stream and the sink's keys in one slot: the sink derives its keys from "
            "the stream's hash tag; do not rename them")

_RETRY: tuple[type[TwoPhaseError], str] = (RetryableError, FIX_RETRY)


def acl_rules(stream: str, tag_pattern: str) -> list[str]:
    """The ACL rules of the sink's least-privileged user: its keys, then its commands."""
    return [f"~{stream}", f"~{tag_pattern}", *ACL_COMMANDS]


def fix_acl(stream: str = "<stream>", tag_pattern: str = "{<stream>}:twophase:*") -> str:
    return ("grant the sink's user the README's ACL: ACL SETUSER <user> "
            + " ".join(acl_rules(stream, tag_pattern)))


ERRORS = ErrorTable(
    system=SYSTEM,
    default=(FatalError, "fix the cause named above, then restart the query"),
    rules={
        "ConnectionError": _RETRY, "TimeoutError": _RETRY, "BusyLoadingError": _RETRY,
        "MaxConnectionsError": _RETRY, "ClusterDownError": _RETRY, "MasterDownError": _RETRY,
        "TryAgainError": _RETRY, "ReadOnlyError": _RETRY, "SlotNotCoveredError": _RETRY,
        "LOADING": _RETRY, "BUSY": _RETRY, "TRYAGAIN": _RETRY, "CLUSTERDOWN": _RETRY,
        "MASTERDOWN": _RETRY, "READONLY": _RETRY,
        "OOM": (RetryableError, FIX_MEMORY), "OutOfMemoryError": (RetryableError, FIX_MEMORY),
        "AuthenticationError": (ConfigurationError, FIX_LOGIN),
        "AuthenticationWrongNumberOfArgsError": (ConfigurationError, FIX_LOGIN),
        "WRONGPASS": (ConfigurationError, FIX_LOGIN), "NOAUTH": (ConfigurationError, FIX_LOGIN),
        "NOPERM": (ConfigurationError, fix_acl()),
        "NoPermissionError": (ConfigurationError, fix_acl()),
        "WRONGTYPE": (ConfigurationError, FIX_TYPE),
        "CROSSSLOT": (ConfigurationError, FIX_SLOT),
        "ClusterCrossSlotError": (ConfigurationError, FIX_SLOT),
        "SSLError": (ConfigurationError, FIX_TLS),
        "SSLCertVerificationError": (ConfigurationError, FIX_TLS),
    },
)


def code_of(exc: BaseException) -> str:
    """The server's error code of an error reply (its message's first word, as redis-py
    keeps it), else the most specific class the table knows."""
    if isinstance(exc, rexc.ResponseError) and not isinstance(exc, rexc.ClusterDownError):
        word = (str(exc).split() or [""])[0]
        if word.isupper():
            return word
    if isinstance(exc, rexc.ConnectionError) and isinstance(exc.__context__, ssl.SSLError):
        return "SSLError"
    return ERRORS.class_code(exc)


def classify(exc: BaseException, what: str) -> TwoPhaseError:
    """The sink's one classifier: ``exc`` raised while doing ``what``."""
    code = code_of(exc)
    message = (str(exc).strip() or type(exc).__name__).splitlines()[0]
    return ERRORS.error(code, what, f"[{code}] {message}")


def is_refused_login(exc: BaseException) -> bool:
    """Whether the server refused the credentials (a rotated password may be retried)."""
    return code_of(exc) in ("AuthenticationError", "WRONGPASS", "NOAUTH")


def script_refusal(exc: BaseException, code: str) -> str | None:
    """The detail of one of the sink's own script refusals (``code ...``), else None."""
    if isinstance(exc, rexc.ResponseError) and str(exc).startswith(code):
        return str(exc)[len(code):].strip()
    return None


def abort_refused(txn: str, detail: str, where: str) -> FatalError:
    """An abort of a decided transaction whose commit has begun (:data:`COMMIT_IN_PROGRESS`)."""
    return FatalError(f"{SYSTEM}: abort of {txn} refused: {detail} (part of it is in {where}).",
                      fix="it was decided: let the query's recovery commit the rest (restart "
                          "the query)")


def refused(message: str, fix: str) -> ConfigurationError:
    return ConfigurationError(f"{SYSTEM}: {message}", fix=fix)
