"""MySQL 8 / MariaDB >= 10.5 sink: one XA branch per partition, committed by the driver.

Every partition's slice of a micro-batch is written inside one XA transaction branch and
prepared; the connection is then closed, so any other session (the driver, cleanup) can resolve
the branch: MariaDB cannot detach a prepared branch from a live session. The xid is::

    gtrid = "tph." + txn_id.global_part      (namespace.query.epoch.batch, <= 63 bytes)
    bqual = txn_id.branch_part               (partition.attempt.created, <= 32 bytes)

formatID is left at its default: MariaDB ignores it when matching xids, so nothing relies on it.
The namespace filter of :meth:`MySQLXASink.list_in_doubt` is the gtrid prefix ``tph.<ns>.``.

Inside every branch the sink also inserts one *marker row* into ``_twophase_xa_markers`` (same
database, created if missing). The server answers a second ``XA COMMIT``, a ``XA ROLLBACK`` after
commit and an unknown xid all with 1397 XAER_NOTA; the marker tells them apart: visible means
committed, absent (and the xid not in ``XA RECOVER``) means rolled back or lost. It also keeps
empty partitions from being read-only XA transactions, whose commit fails with 1402.

What a crash leaves behind, phase by phase (client crash = executor or driver process killed;
a server crash rolls back every branch that is not prepared and keeps every prepared one, given
binary logging and durable InnoDB settings):

==========  ========================  ============================  ===========================
phase       statements                a crash here leaves           resolved by
==========  ========================  ============================  ===========================
begin       connect, ``XA START``     an ACTIVE branch, no rows     the server: it rolls back an
                                                                    ACTIVE branch when its
                                                                    connection ends
write       ``LOAD DATA LOCAL`` or    an ACTIVE branch holding row  the server, as above; Spark
            multi-row ``INSERT``      locks until its connection    re-runs the task (a new
            batches                   ends                          attempt id, a new branch)
pre-commit  marker ``INSERT``,        before PREPARE returns: as    an orphan (prepared, no
            ``XA END``,               write, or (reply lost) a      handle in any decision) is
            ``XA PREPARE``, close     prepared branch no handle     aborted by the driver's
                                      names. After: a PREPARED      sweep or by
                                      branch: durable, invisible,   ``twophase.cleanup``; its
                                      row locks held, listed by     xid names query, batch and
                                      ``XA RECOVER``                creation time
commit      [fence check],            before XA COMMIT: still       driver recovery commits it
            ``XA COMMIT``, stamp      prepared. After: visible;     again: 1397 + marker row =
            ``committed_at``          the marker row says so        ALREADY_COMMITTED
abort       ``XA ROLLBACK``           rolled back, or still         repeat it: 1397 means
                                      prepared                      NOT_FOUND
==========  ========================  ============================  ===========================

Bulk path: in ``insert`` mode the rows go in batches of ``batch_size`` through ``LOAD DATA LOCAL
INFILE`` (tab-separated, from a private temporary file) inside the XA branch: measured 2-2.5x
faster than PyMySQL's multi-row ``INSERT`` (see ``bench/mysql_xa.py``). ``LOAD DATA LOCAL``
turns row errors (duplicate key, NULL into NOT NULL, truncation) into *warnings* and skips the
row, so every load checks the affected-row and warning counts and fails the branch on any
warning. ``upsert`` mode uses multi-row ``INSERT ... ON DUPLICATE KEY UPDATE`` (``LOAD DATA``
cannot update). ``bulk="auto"`` falls back to ``INSERT`` when the server refuses local loads.
Enabling local loads lets the server ask the client for any file it can read (PyMySQL does not
check the name the server asks for); use ``bulk="insert"`` with servers you do not trust.

Values: a row holds ``None`` (NULL), ``bool``, ``int``, ``float``, ``decimal.Decimal``, ``str``,
``bytes`` (also ``bytearray``, ``memoryview``), ``datetime.date``, ``datetime.datetime`` (aware
or naive), ``datetime.time`` or ``datetime.timedelta`` (MySQL ``TIME``). Other types (``list``,
``dict``, ...) are not supported: they fail the branch with a SchemaMismatchError (an unknown
class may instead reach the ``INSERT`` path as its ``str()``).

Time zones: every session of the sink (writer, committer, schema check, fence, recovery, purge)
sets ``time_zone = '+00:00'`` (a fixed offset: no time zone tables needed), so ``TIMESTAMP``
columns are written and read in UTC whatever the server's ``time_zone`` or the client's ``TZ``.
An aware ``datetime`` (a Spark ``TIMESTAMP``, an instant; twophase hands it over with
tzinfo=UTC) is sent as its UTC wall-clock time; a naive one (a Spark ``TIMESTAMP_NTZ``, a
wall-clock value) is sent unchanged. Both bulk paths do the same. So a ``TIMESTAMP`` column holds
the right instant of a Spark ``TIMESTAMP``; a ``DATETIME`` column holds its UTC wall-clock time;
a ``TIMESTAMP_NTZ`` is stored as its wall-clock value (in a ``TIMESTAMP`` column: that wall clock
read as UTC). The sink's own times (``created_at``, ``prepared_at``, ``committed_at``,
``fenced_at``) are ``DATETIME(6)`` in UTC.

Fencing (``fencing=True``, opt-in, Estuary's pattern): a row per (namespace, query) in
``_twophase_xa_fence`` holds the epoch of the newest run. :meth:`MySQLXASink.fence` raises it at
run start (and refuses a run older than the row); the sink remembers the epoch it claimed.
``commit`` then, on a second connection, takes a shared lock on that row, checks that it still
holds the claimed epoch, runs ``XA COMMIT``, and only then releases the lock. ``abort`` does the
same when this process claimed an epoch for the query (a zombie run cannot abort either); a
process that never claimed one (cleanup of orphans) may abort, but never commit.
``XA COMMIT`` itself cannot be made conditional, but a newer run's ``fence`` must take the
row's exclusive lock, so it waits for commits already past their check, and every later check
sees the new epoch: once ``fence`` has returned, no older run commits or aborts anything.
Remaining window: the server closes the lock connection after ``FENCE_LOCK_IDLE_TIMEOUT_S`` of
inactivity (so a dead zombie host cannot block a takeover for long); a zombie that stalls longer
than that between its check and its ``XA COMMIT`` can still commit after the takeover. That
case is detected afterwards (the lock connection is gone when it is released) and logged as an
error. Fencing guards commit and abort through this sink only; anyone else with XA rights on
the server can still resolve our branches, and the rows a zombie prepares stay prepared
(invisible) until the newer run's sweep or cleanup aborts them.

Known limitation: an orphan keeps the row locks of what it wrote until the driver's sweep (at
the batch's commit) or cleanup aborts it. A retried task that writes the same keys (upsert, or
a unique key) waits for those locks, fails with 1205 (retryable) after
``lock_wait_timeout_s`` and is retried by Spark; if the orphan outlives Spark's task retries the
query fails and the next run's sweep clears it. Tables whose keys never repeat across attempts
(an auto-increment key) are not affected.

Privileges: INSERT (+UPDATE for upsert) on the table; SELECT, INSERT, UPDATE, DELETE on the
marker and fence tables (CREATE once, or create them from :data:`MARKER_TABLE_DDL`); MySQL 8
also needs ``XA_RECOVER_ADMIN`` for ``XA RECOVER``. The server needs binary logging for crash
safety of prepared branches (MySQL before 8.0.30 has known XA/binlog crash-safety gaps).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import logging
import re
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import pymysql
from pymysql.converters import escape_datetime, escape_time, escape_timedelta

from twophase._handle import NAMESPACE_MAX_LENGTH, Handle, TxnId, query_key, validate_namespace
from twophase.errors import (
    ConfigurationError,
    FatalError,
    FencedError,
    RetryableError,
    SchemaMismatchError,
    TransactionLostError,
    TwoPhaseError,
)
from twophase.sink import (
    AbortOutcome,
    Column,
    CommitOutcome,
    TransactionContext,
    TwoPhaseCommitSink,
)

log = logging.getLogger("twophase.mysql")

SINK_KIND = "mysql"
XID_PREFIX = "tph."
XID_PART_MAX_BYTES = 64
DEFAULT_PORT = 3306
DEFAULT_BATCH_SIZE = 10_000
DEFAULT_MARKER_TABLE = "_twophase_xa_markers"
DEFAULT_FENCE_TABLE = "_twophase_xa_fence"
DEFAULT_CONNECT_TIMEOUT_S = 10
DEFAULT_READ_TIMEOUT_S = 600
FENCE_LOCK_IDLE_TIMEOUT_S = 30
PURGE_CHUNK = 1_000
DETACH_WAIT_S = 2.0  # how long commit/abort wait for a just-closed writer session to end
DETACH_POLL_S = 0.02
CHARSET = "utf8mb4"
TRANSACTIONAL_ENGINES = frozenset({"innodb"})
MIN_MARIADB = (10, 5)
MIN_MYSQL = (8, 0)
FALLBACK_NAMESPACE = SINK_KIND
# Every sink session adds strict mode to the server's sql_mode: a value that does not fit is an
# error, never a silent truncation (multi-row INSERT reports warnings of its last statement only).
STRICT_SQL_MODE = ("SESSION sql_mode = CONCAT_WS(',', NULLIF(@@SESSION.sql_mode, ''), "
                   "'STRICT_TRANS_TABLES')")
# ... and reads and writes TIMESTAMP columns in UTC (a fixed offset: no time zone tables needed).
UTC_TIME_ZONE = "SESSION time_zone = '+00:00'"

Mode = Literal["insert", "upsert"]
Bulk = Literal["auto", "load_data", "insert"]
MODES: tuple[Mode, ...] = ("insert", "upsert")
BULK_METHODS: tuple[Bulk, ...] = ("auto", "load_data", "insert")

# Connection options the sink owns; ``connect_args`` may add others (ssl, ...), not these.
_RESERVED_CONNECT_ARGS = frozenset({
    "host", "port", "user", "password", "passwd", "database", "db", "autocommit",
    "local_infile", "charset", "init_command", "conv",
})

# Only these characters ever reach an XA statement. XA statements cannot take ``%s``
# placeholders on every server (they are not preparable), so xids are validated against this
# strict character set and then embedded as single-quoted literals: nothing in the set needs
# escaping in either quoting mode (with or without NO_BACKSLASH_ESCAPES).
_XID_PART_RE = re.compile(rf"^[A-Za-z0-9_.-]{{1,{XID_PART_MAX_BYTES}}}$")
_NAMESPACE_UNSAFE_RE = re.compile(r"[^A-Za-z0-9_-]")
_MARIADB_VERSION_RE = re.compile(r"(\d+)\.(\d+)\.\d+-MariaDB", re.IGNORECASE)
_MYSQL_VERSION_RE = re.compile(r"^(\d+)\.(\d+)")
_MARIADB_SQL_XID_RE = re.compile(r"^X'([0-9A-Fa-f]*)',X'([0-9A-Fa-f]*)'(?:,\d+)?$")
_MYSQL_HEX_XID_RE = re.compile(r"^0x([0-9A-Fa-f]*)$")

# -- error codes (server ER_* and client CR_*) ------------------------------------------------
XAER_NOTA = 1397
DUPLICATE_KEY = 1062
DEPRECATED_SYNTAX = 1287  # MySQL >= 8.0.20 warns about VALUES() in ON DUPLICATE KEY UPDATE
LOCAL_INFILE_REFUSED = frozenset({1148, 2068, 3948, 4166})  # MySQL 8: 3948, MariaDB: 4166
_LOST_ROLLED_BACK = frozenset({1402, 1613, 1614})  # XA_RBROLLBACK, XA_RBTIMEOUT, XA_RBDEADLOCK

_FIX_RETRY = "retried automatically; if it persists, check the server and the network"
_FIX_LOCKS = (
    "retried automatically; if it persists, another writer or an old prepared XA branch holds "
    "the rows: list them with XA RECOVER and let `python -m twophase.cleanup` resolve them"
)
_FIX_ROWS = "fix the rows (or the table definition) and restart the query"
_UNPREPARED_NOTE = (
    "The branch is discarded (the server rolls back an unprepared branch when its connection "
    "ends) and never committed: the partition must be written again."
)

_ERRORS: dict[int, tuple[type[TwoPhaseError], str]] = {
    1205: (RetryableError, _FIX_LOCKS),  # lock wait timeout
    1213: (RetryableError, _FIX_LOCKS),  # deadlock
    1613: (RetryableError, _FIX_LOCKS),  # XA_RBTIMEOUT: branch rolled back
    1614: (RetryableError, _FIX_LOCKS),  # XA_RBDEADLOCK: branch rolled back
    1040: (RetryableError, "raise max_connections or lower commit/partition parallelism"),
    1053: (RetryableError, _FIX_RETRY),  # server shutdown in progress
    1290: (RetryableError, "the server is read-only (failover?); retried automatically"),
    1836: (RetryableError, "the server is read-only (failover?); retried automatically"),
    1927: (RetryableError, _FIX_RETRY),  # connection killed
    2003: (RetryableError, "check that the server runs and host:port is reachable from here"),
    2006: (RetryableError, _FIX_RETRY),  # server has gone away
    2013: (RetryableError, _FIX_RETRY),  # lost connection during query
    2055: (RetryableError, _FIX_RETRY),  # lost connection (system error)
    0: (RetryableError, _FIX_RETRY),  # PyMySQL InterfaceError: the connection is closed
    1045: (ConfigurationError, "check the user and password given to the sink"),
    1044: (ConfigurationError, "GRANT the sink's user access to the database"),
    1049: (ConfigurationError, "create the database or fix the sink's database name"),
    1142: (ConfigurationError, "GRANT the sink's user the privilege named above on the table"),
    1143: (ConfigurationError, "GRANT the sink's user the privilege named above on the column"),
    1227: (ConfigurationError,
           "GRANT the privilege named above (MySQL 8: XA_RECOVER_ADMIN for XA RECOVER)"),
    1148: (ConfigurationError, "SET GLOBAL local_infile=1 on the server, or bulk='insert'"),
    3948: (ConfigurationError, "SET GLOBAL local_infile=1 on the server, or bulk='insert'"),
    4166: (ConfigurationError, "SET GLOBAL local_infile=1 on the server, or bulk='insert'"),
    1146: (SchemaMismatchError, "create the table, or fix the sink's table name"),
    1054: (SchemaMismatchError, "add the column to the table, or drop/rename it in the rows"),
    1406: (SchemaMismatchError, "widen the column or shorten the values"),
    1048: (SchemaMismatchError, "make the column nullable or fill the NULL values"),
    1263: (SchemaMismatchError, "make the column nullable or fill the NULL values"),
    1364: (SchemaMismatchError, "give the column a default or write it"),
    1366: (SchemaMismatchError, "cast the values to the column's type"),
    1264: (SchemaMismatchError, "widen the column's type or fix the values"),
    1265: (SchemaMismatchError, "widen the column's type or fix the values"),
    1292: (SchemaMismatchError, "cast the values to the column's type"),
    1261: (SchemaMismatchError, "the rows have fewer values than columns: " + _FIX_ROWS),
    1262: (SchemaMismatchError, "the rows have more values than columns: " + _FIX_ROWS),
    DUPLICATE_KEY: (SchemaMismatchError,
                    "the rows repeat a key of the table or of the batch: use mode='upsert' or "
                    "deduplicate the rows"),
    1452: (SchemaMismatchError, "write the referenced parent rows first, or drop the FOREIGN KEY"),
    3819: (SchemaMismatchError, "fix the rows that violate the CHECK constraint"),
    4025: (SchemaMismatchError, "fix the rows that violate the CHECK constraint"),
}

# -- DDL of the sink's own tables --------------------------------------------------------------
MARKER_TABLE_DDL = """CREATE TABLE IF NOT EXISTS {table} (
  txn_id VARCHAR(96) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  namespace VARCHAR(24) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  target_table VARCHAR(200) NOT NULL,
  row_count BIGINT UNSIGNED NOT NULL,
  created_at DATETIME(6) NOT NULL COMMENT 'transaction opened (UTC, from the txn id)',
  prepared_at DATETIME(6) NOT NULL COMMENT 'XA PREPARE (UTC)',
  committed_at DATETIME(6) NULL COMMENT 'set by the committing twophase process (UTC)',
  PRIMARY KEY (txn_id),
  KEY by_namespace_committed (namespace, committed_at)
) ENGINE=InnoDB COMMENT='twophase: one row per XA branch, written inside the branch'"""

FENCE_TABLE_DDL = """CREATE TABLE IF NOT EXISTS {table} (
  namespace VARCHAR(24) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  query CHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  epoch BIGINT UNSIGNED NOT NULL,
  fenced_at DATETIME(6) NOT NULL COMMENT 'last raise of the epoch (UTC)',
  PRIMARY KEY (namespace, query)
) ENGINE=InnoDB COMMENT='twophase: epoch of the newest run of each query'"""


def quote_identifier(name: str) -> str:
    """A MySQL identifier in backticks, any backtick doubled."""
    if not name or "\x00" in name:
        raise ConfigurationError(f"{name!r} is not a usable MySQL identifier.",
                                 fix="name a non-empty table or column without NUL characters")
    return "`" + name.replace("`", "``") + "`"


@dataclass(frozen=True)
class Xid:
    """An XA transaction id restricted to ``[A-Za-z0-9_.-]``, safe to embed in XA statements."""

    gtrid: str
    bqual: str

    def __post_init__(self) -> None:
        for part in (self.gtrid, self.bqual):
            if not _XID_PART_RE.match(part):
                raise ConfigurationError(
                    f"{part!r} cannot be part of an XA xid written by twophase.",
                    fix="the handle is damaged or not from twophase; inspect the state file",
                )

    @classmethod
    def of(cls, txn_id: TxnId) -> Xid:
        return cls(XID_PREFIX + txn_id.global_part, txn_id.branch_part)

    def sql(self) -> str:
        """The xid as XA statements take it; the parts were validated in ``__post_init__``."""
        return f"'{self.gtrid}','{self.bqual}'"

    def __str__(self) -> str:
        return self.sql()


def namespace_prefix(namespace: str) -> str:
    """The gtrid prefix of every branch of ``namespace``."""
    return f"{XID_PREFIX}{validate_namespace(namespace)}."


# -- rows as LOAD DATA text --------------------------------------------------------------------

_TSV_NULL = "\\N"


def _tsv_str(value: str) -> str:
    if "\\" in value or "\t" in value or "\n" in value:
        return value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
    return value


def _tsv_bytes(value: bytes | bytearray | memoryview) -> str:
    # surrogateescape round-trips any byte string through str and back to the same bytes
    return _tsv_str(bytes(value).decode("utf-8", "surrogateescape"))


def _utc_naive(moment: dt.datetime) -> dt.datetime:
    """``moment`` as a naive UTC wall-clock time: aware input converted to UTC, naive unchanged.

    Naive input is a wall-clock value (a Spark TIMESTAMP_NTZ), never read as local time.
    """
    if moment.utcoffset() is None:
        return moment.replace(tzinfo=None)
    return moment.astimezone(dt.UTC).replace(tzinfo=None)


def _tsv_datetime(value: dt.datetime) -> str:
    return _utc_naive(value).isoformat(" ")


def _escape_datetime(value: dt.datetime, mapping: Any = None) -> str:
    """PyMySQL's datetime literal, of :func:`_utc_naive` (PyMySQL itself drops any tzinfo)."""
    return str(escape_datetime(_utc_naive(value), mapping))


#: PyMySQL's conversions, with datetimes sent as naive UTC like the LOAD DATA path sends them.
CONVERSIONS: dict[Any, Any] = {**pymysql.converters.conversions, dt.datetime: _escape_datetime}


def _unquoted(escape: Callable[[Any], str]) -> Callable[[Any], str]:
    return lambda value: escape(value).strip("'")


_TSV_ENCODERS: dict[type, Callable[[Any], str]] = {
    str: _tsv_str,
    int: int.__repr__,
    float: float.__repr__,
    bool: lambda value: "1" if value else "0",
    type(None): lambda value: _TSV_NULL,
    bytes: _tsv_bytes,
    bytearray: _tsv_bytes,
    memoryview: _tsv_bytes,
    decimal.Decimal: lambda value: format(value, "f"),
    dt.datetime: _tsv_datetime,
    dt.date: dt.date.isoformat,
    dt.time: _unquoted(escape_time),
    dt.timedelta: _unquoted(escape_timedelta),
}


def _tsv_value(value: Any, column: str) -> str:
    """Encode one value whose exact type is not in the table (a subclass, or unsupported)."""
    for kind, encode in _TSV_ENCODERS.items():
        if kind is not type(None) and isinstance(value, kind):
            return encode(value)
    raise SchemaMismatchError(
        f"column {column!r} holds a {type(value).__name__} value, which MySQL cannot store.",
        fix="cast the column to a string, number, binary or timestamp (e.g. to_json) first",
    )


def encode_tsv(rows: Sequence[Sequence[Any]], columns: Sequence[str]) -> bytes:
    """Rows as LOAD DATA text: tab-separated, backslash-escaped, ``\\N`` for NULL."""
    encoders = _TSV_ENCODERS
    try:
        text = "".join(["\t".join([encoders[type(v)](v) for v in row]) + "\n" for row in rows])
    except KeyError:
        text = "".join(
            "\t".join(_tsv_value(v, c) for v, c in zip(row, columns, strict=True)) + "\n"
            for row in rows
        )
    return text.encode("utf-8", "surrogateescape")


def _batches(rows: Iterable[Sequence[Any]], size: int) -> Iterator[list[Sequence[Any]]]:
    batch: list[Sequence[Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _error_code(exc: BaseException) -> int:
    args: tuple[Any, ...] = exc.args
    return args[0] if args and isinstance(args[0], int) else 0


def _error_text(exc: BaseException) -> str:
    args: tuple[Any, ...] = exc.args
    return str(args[1]) if len(args) > 1 else str(exc)


def _server_version(server_info: str) -> tuple[str, tuple[int, int]]:
    """("MariaDB" | "MySQL", (major, minor)) from the handshake's version string."""
    maria = _MARIADB_VERSION_RE.search(server_info)
    if maria:
        return "MariaDB", (int(maria.group(1)), int(maria.group(2)))
    mysql = _MYSQL_VERSION_RE.match(server_info)
    if mysql:
        return "MySQL", (int(mysql.group(1)), int(mysql.group(2)))
    return "MySQL", (0, 0)


def _is_mariadb(conn: Any) -> bool:
    return _server_version(conn.get_server_info())[0] == "MariaDB"


# -- low-level statements ----------------------------------------------------------------------

def _query(conn: Any, sql: str, args: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
    with conn.cursor() as cursor:
        cursor.execute(sql, args)
        return list(cursor.fetchall())


def _xa(conn: Any, verb: str, xid: Xid) -> None:
    with conn.cursor() as cursor:
        cursor.execute(f"XA {verb} {xid.sql()}")


def _xa_recover(conn: Any) -> list[tuple[bytes, bytes]]:
    """(gtrid, bqual) of every prepared branch on the server, in hex-safe form per flavour."""
    if _is_mariadb(conn):
        rows = _query(conn, "XA RECOVER FORMAT='SQL'")
        pattern = _MARIADB_SQL_XID_RE
    else:
        rows = _query(conn, "XA RECOVER CONVERT XID")
        pattern = _MYSQL_HEX_XID_RE
    xids = []
    for _format_id, gtrid_length, _bqual_length, data in rows:
        text = data.decode("ascii") if isinstance(data, bytes) else str(data)
        match = pattern.match(text)
        if match is None:
            log.warning("XA RECOVER returned an xid this sink cannot read: %r", text)
            continue
        raw = b"".join(bytes.fromhex(group) for group in match.groups())
        xids.append((raw[:gtrid_length], raw[gtrid_length:]))
    return xids


def _is_prepared(conn: Any, xid: Xid) -> bool:
    wanted = (xid.gtrid.encode(), xid.bqual.encode())
    return wanted in _xa_recover(conn)


def _check_warnings(cursor: Any, *, expected: int | None, affected: int, what: str) -> None:
    """Fail on any warning (LOAD DATA LOCAL downgrades row errors to warnings) or lost row."""
    if cursor.warning_count == 0 and expected in (None, affected):
        return
    cursor.execute("SHOW WARNINGS")
    warnings = [(code, message) for _level, code, message in cursor.fetchall()
                if code != DEPRECATED_SYNTAX]
    if not warnings and expected in (None, affected):
        return
    code = warnings[0][0] if warnings else 0
    kind, fix = _ERRORS.get(code, (SchemaMismatchError, _FIX_ROWS))
    if not issubclass(kind, FatalError):
        kind, fix = SchemaMismatchError, _FIX_ROWS
    detail = ("; ".join(f"{c}: {m}" for c, m in warnings[:3])
              or f"{affected} of {expected} rows applied")
    raise kind(f"{what}: the server did not take the rows as given ({detail}).", fix=fix)


# -- connections -------------------------------------------------------------------------------

_tls_lock = threading.Lock()
_default_tls: list[ssl.SSLContext] = []


class _Connection(pymysql.connections.Connection):  # type: ignore[misc]
    """PyMySQL's connection, sharing one process-wide context for TLS-preferred mode.

    Without TLS options PyMySQL (>= 1.2) tries TLS and falls back to plain text, and builds a
    fresh default ``SSLContext`` for that on every connection: loading the system CA store costs
    about 30 ms of CPU, more than a whole small branch. The sink opens a connection per branch
    and per commit, so it builds that context once. Explicit TLS options are left to PyMySQL.
    """

    def _create_ssl_ctx(self, sslp: Any) -> Any:
        if sslp != {}:
            return super()._create_ssl_ctx(sslp)
        with _tls_lock:
            if not _default_tls:
                _default_tls.append(super()._create_ssl_ctx({}))
            return _default_tls[0]


def open_connection(**options: Any) -> Any:
    """``pymysql.connect(**options)`` without rebuilding the default TLS context every time.

    Parameters are escaped with :data:`CONVERSIONS` (aware datetimes as naive UTC) unless
    ``conv`` is given.
    """
    return _Connection(**{"conv": CONVERSIONS, **options})


# -- the two bulk paths (also used by bench/mysql_xa.py for its baselines) ---------------------

def _column_list(columns: Sequence[str]) -> str:
    return ", ".join(quote_identifier(column) for column in columns)


def load_rows(conn: Any, target: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], *,
              what: str) -> None:
    """``LOAD DATA LOCAL INFILE`` the rows into ``target`` (quoted) in the open transaction.

    The rows go through a private temporary file (PyMySQL sends local files by name). Any
    warning or skipped row fails the load: LOCAL implies IGNORE, so the server reports
    duplicate keys, NULLs in NOT NULL columns and truncations only as warnings.
    """
    with tempfile.NamedTemporaryFile(prefix="twophase-", suffix=".tsv") as spool:
        spool.write(encode_tsv(rows, columns))
        spool.flush()
        sql = (f"LOAD DATA LOCAL INFILE {conn.escape(spool.name)} INTO TABLE {target} "
               f"CHARACTER SET {CHARSET} FIELDS TERMINATED BY X'09' ESCAPED BY X'5C' "
               f"LINES TERMINATED BY X'0A' ({_column_list(columns)})")
        with conn.cursor() as cursor:
            affected = cursor.execute(sql)
            _check_warnings(cursor, expected=len(rows), affected=affected, what=what)


def insert_rows(conn: Any, target: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], *,
                upsert: bool, what: str) -> None:
    """Multi-row ``INSERT`` (PyMySQL's executemany packs rows up to ~1 MB per statement)."""
    placeholders = ", ".join(["%s"] * len(columns))
    sql = f"INSERT INTO {target} ({_column_list(columns)}) VALUES ({placeholders})"
    if upsert:
        sql += " ON DUPLICATE KEY UPDATE " + ", ".join(
            f"{quote_identifier(c)} = VALUES({quote_identifier(c)})" for c in columns)
    with conn.cursor() as cursor:
        affected = cursor.executemany(sql, rows)
        _check_warnings(cursor, expected=None if upsert else len(rows), affected=affected,
                        what=what)


# -- the executor-side transaction -------------------------------------------------------------

@dataclass
class MySQLBranch:
    """One partition's open XA branch (lives on the executor between begin and pre-commit)."""

    txn_id: TxnId
    xid: Xid
    columns: tuple[str, ...]
    conn: Any
    use_load_data: bool
    rows: int = 0

    @property
    def open(self) -> bool:
        return self.conn is not None


class MySQLXASink(TwoPhaseCommitSink[MySQLBranch]):
    """Exactly-once rows into one MySQL/MariaDB table, one XA branch per partition.

    ``host``/``port``/``user``/``password``/``database``: where to connect (TCP).
    ``table``: the target table in ``database``; it must exist and be InnoDB.
    ``mode``: ``"insert"`` (a repeated key is an error) or ``"upsert"`` (``INSERT ... ON
    DUPLICATE KEY UPDATE`` every written column; the table needs a PRIMARY or UNIQUE key).
    ``batch_size``: rows per statement (LOAD DATA or multi-row INSERT).
    ``bulk``: ``"auto"`` (LOAD DATA LOCAL in insert mode, falling back to INSERT if the server
    refuses it), ``"load_data"`` (insist), ``"insert"`` (never read local files).
    ``fencing``: check the fence row in every commit/abort; the driver must call :meth:`fence`.
    ``lock_wait_timeout_s``: the session's ``innodb_lock_wait_timeout`` (server default if None).
    ``connect_args``: further PyMySQL ``connect`` options (``ssl``, ...).
    """

    kind: ClassVar[str] = SINK_KIND

    def __init__(
        self,
        *,
        host: str,
        user: str,
        password: str,
        database: str,
        table: str,
        port: int = DEFAULT_PORT,
        mode: Mode = "insert",
        batch_size: int = DEFAULT_BATCH_SIZE,
        bulk: Bulk = "auto",
        fencing: bool = False,
        marker_table: str = DEFAULT_MARKER_TABLE,
        fence_table: str = DEFAULT_FENCE_TABLE,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        read_timeout_s: float | None = DEFAULT_READ_TIMEOUT_S,
        lock_wait_timeout_s: int | None = None,
        connect_args: Mapping[str, Any] | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.user = user
        self._password = password
        self.database = database
        self.table = table
        self.mode = mode
        self.batch_size = batch_size
        self.bulk = bulk
        self.fencing = fencing
        self.marker_table = marker_table
        self.fence_table = fence_table
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.lock_wait_timeout_s = lock_wait_timeout_s
        self.connect_args = dict(connect_args or {})
        self._fenced_epochs: dict[tuple[str, str], int] = {}
        self._validate()

    def _validate(self) -> None:
        problems = []
        if self.mode not in MODES:
            problems.append(f"mode={self.mode!r} (use one of {MODES})")
        if self.bulk not in BULK_METHODS:
            problems.append(f"bulk={self.bulk!r} (use one of {BULK_METHODS})")
        if self.mode == "upsert" and self.bulk == "load_data":
            problems.append("bulk='load_data' with mode='upsert' (LOAD DATA cannot update)")
        if self.batch_size < 1:
            problems.append(f"batch_size={self.batch_size} (must be >= 1)")
        if reserved := sorted(_RESERVED_CONNECT_ARGS & set(self.connect_args)):
            problems.append(f"connect_args {reserved} (set by the sink itself)")
        if problems:
            raise ConfigurationError("MySQLXASink: invalid " + "; ".join(problems) + ".",
                                     fix="correct the sink's options")
        for name in (self.table, self.marker_table, self.fence_table, self.database):
            quote_identifier(name)

    def __repr__(self) -> str:
        return (f"MySQLXASink(host={self.host!r}, port={self.port}, user={self.user!r}, "
                f"password='***', database={self.database!r}, table={self.table!r}, "
                f"mode={self.mode!r}, bulk={self.bulk!r}, fencing={self.fencing})")

    # -- names ---------------------------------------------------------------------------------

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _qualified(self, table: str) -> str:
        return f"{quote_identifier(self.database)}.{quote_identifier(table)}"

    @property
    def target(self) -> str:
        """The target table, quoted and qualified: `db`.`table`."""
        return self._qualified(self.table)

    def default_namespace(self) -> str:
        """The table name, reduced to ``[A-Za-z0-9_-]`` and 24 characters."""
        cleaned = _NAMESPACE_UNSAFE_RE.sub("_", self.table)[:NAMESPACE_MAX_LENGTH]
        return cleaned or FALLBACK_NAMESPACE

    # -- connections and errors ----------------------------------------------------------------

    def _connect(self, *, local_infile: bool = False, idle_timeout_s: int | None = None) -> Any:
        """A new connection; PyMySQL never reconnects by itself (we never call ping).

        The only place the sink connects: every session is strict and in UTC (see the module
        docstring, "Time zones").
        """
        settings = {"innodb_lock_wait_timeout": self.lock_wait_timeout_s,
                    "wait_timeout": idle_timeout_s}
        init_command = ", ".join([STRICT_SQL_MODE, UTC_TIME_ZONE] + [
            f"SESSION {name} = {int(value)}" for name, value in settings.items()
            if value is not None])
        try:
            return open_connection(
                host=self.host, port=self.port, user=self.user, password=self._password,
                database=self.database, charset=CHARSET, autocommit=True,
                local_infile=local_infile, connect_timeout=self.connect_timeout_s,
                read_timeout=self.read_timeout_s, write_timeout=self.read_timeout_s,
                init_command=f"SET {init_command}",
                **self.connect_args,
            )
        except pymysql.err.MySQLError as exc:
            raise self._classify(exc, f"connecting as user {self.user!r}") from exc

    def _classify(self, exc: BaseException, what: str) -> TwoPhaseError:
        """Turn a PyMySQL error into a twophase error naming the server, the step and the fix."""
        code = _error_code(exc)
        kind, fix = _ERRORS.get(code, (FatalError, "look up the server error code and fix it"))
        return kind(f"{what} on MySQL server {self.address} failed: [{code}] {_error_text(exc)}.",
                    fix=fix)

    @contextlib.contextmanager
    def _session(self, what: str, *, idle_timeout_s: int | None = None) -> Iterator[Any]:
        """A short-lived driver-side connection; errors inside are classified, then it closes."""
        conn = self._connect(idle_timeout_s=idle_timeout_s)
        try:
            yield conn
        except pymysql.err.MySQLError as exc:
            raise self._classify(exc, what) from exc
        finally:
            _close_quietly(conn)

    # -- driver: schema, tables ----------------------------------------------------------------

    def create_tables(self) -> None:
        """Create the marker table (and the fence table if fencing) unless they exist."""
        with self._session("creating twophase's tables") as conn:
            self._create_tables(conn)

    def _create_tables(self, conn: Any) -> None:
        """CREATE only what is missing: a DBA may create them and grant no CREATE right."""
        wanted = {self.marker_table: MARKER_TABLE_DDL}
        if self.fencing:
            wanted[self.fence_table] = FENCE_TABLE_DDL
        for name, ddl in wanted.items():
            if self._table_engine(conn, name) is None:
                log.info("creating %s", self._qualified(name))
                _query(conn, ddl.format(table=self._qualified(name)))

    def _table_engine(self, conn: Any, table: str) -> str | None:
        """The table's storage engine, or None if it does not exist."""
        found = _query(conn, "SELECT ENGINE FROM information_schema.TABLES "
                             "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                       (self.database, table))
        return str(found[0][0] or "") if found else None

    def check_schema(self, columns: Sequence[Column]) -> None:
        """Check server, table, columns (and key for upsert); create the marker/fence tables."""
        with self._session(f"checking {self.target}") as conn:
            self._check_server(conn)
            self._create_tables(conn)
            self._check_table(conn)
            self._check_columns(conn, [column.name for column in columns])
            if self.mode == "upsert":
                self._check_upsert_key(conn, [column.name for column in columns])
            self._check_load_data(conn)
            _xa_recover(conn)  # needs XA_RECOVER_ADMIN on MySQL 8: fail now, not in recovery

    def _check_server(self, conn: Any) -> None:
        flavour, version = _server_version(conn.get_server_info())
        minimum = MIN_MARIADB if flavour == "MariaDB" else MIN_MYSQL
        if version < minimum:
            raise ConfigurationError(
                f"{flavour} {conn.get_server_info()} at {self.address} is too old for XA: "
                f"prepared branches do not survive a disconnect before {flavour} "
                f"{'.'.join(map(str, minimum))}.",
                fix=f"upgrade to {flavour} >= {'.'.join(map(str, minimum))}",
            )

    def _check_table(self, conn: Any) -> None:
        engine = self._table_engine(conn, self.table)
        if engine is None:
            raise SchemaMismatchError(
                f"table {self.target} does not exist on {self.address}.",
                fix=f"create it (CREATE TABLE {self.target} (...) ENGINE=InnoDB) or fix table=",
            )
        if engine.lower() not in TRANSACTIONAL_ENGINES:
            raise SchemaMismatchError(
                f"table {self.target} uses the {engine} engine, which ignores transactions: "
                "rows would be visible before commit and survive an abort.",
                fix=f"ALTER TABLE {self.target} ENGINE=InnoDB",
            )

    def _check_columns(self, conn: Any, names: Sequence[str]) -> None:
        rows = _query(conn, "SELECT COLUMN_NAME, IS_NULLABLE, COLUMN_DEFAULT, EXTRA "
                            "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s "
                            "AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
                      (self.database, self.table))
        existing = {str(row[0]).lower(): row for row in rows}
        if missing := [name for name in names if name.lower() not in existing]:
            raise SchemaMismatchError(
                f"table {self.target} has no column {', '.join(map(repr, missing))} "
                f"(it has {', '.join(str(row[0]) for row in rows)}).",
                fix=f"ALTER TABLE {self.target} ADD COLUMN ..., or rename/drop the column "
                "in the DataFrame",
            )
        given = {name.lower() for name in names}
        required = [str(name) for name, nullable, default, extra in rows
                    if str(name).lower() not in given and nullable == "NO" and default is None
                    and "auto_increment" not in str(extra) and "GENERATED" not in str(extra)]
        if required:
            raise SchemaMismatchError(
                f"table {self.target} requires column {', '.join(map(repr, required))} "
                "(NOT NULL without default), which the rows do not have.",
                fix="add the column to the DataFrame, or give it a default in the table",
            )

    def _check_upsert_key(self, conn: Any, names: Sequence[str]) -> None:
        rows = _query(conn, "SELECT INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS "
                            "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s AND NON_UNIQUE = 0",
                      (self.database, self.table))
        keys: dict[str, set[str]] = {}
        for index, column in rows:
            keys.setdefault(str(index), set()).add(str(column).lower())
        given = {name.lower() for name in names}
        if not any(columns <= given for columns in keys.values()):
            raise SchemaMismatchError(
                f"mode='upsert' needs a PRIMARY or UNIQUE key of {self.target} made only of "
                f"written columns; keys: {sorted(map(sorted, keys.values())) or 'none'}.",
                fix="write the key columns, add a unique key, or use mode='insert'",
            )

    def _check_load_data(self, conn: Any) -> None:
        if self.bulk == "load_data" and not _query(conn, "SELECT @@GLOBAL.local_infile")[0][0]:
            raise ConfigurationError(
                f"bulk='load_data' but the server {self.address} refuses LOAD DATA LOCAL.",
                fix="SET GLOBAL local_infile=1, or use bulk='auto' or 'insert'",
            )

    # -- executor: begin, write, pre-commit ----------------------------------------------------

    @property
    def _uses_load_data(self) -> bool:
        return self.mode == "insert" and self.bulk != "insert"

    def begin_transaction(self, ctx: TransactionContext) -> MySQLBranch:
        xid = Xid.of(ctx.txn_id)
        conn = self._connect(local_infile=self._uses_load_data)
        branch = MySQLBranch(ctx.txn_id, xid, ctx.column_names, conn, self._uses_load_data)
        with self._guard(branch, "starting"):
            _xa(conn, "START", xid)
        return branch

    def write(self, txn: MySQLBranch, rows: Iterable[Sequence[Any]]) -> None:
        self._require_open(txn)
        with self._guard(txn, "writing"):
            for batch in _batches(rows, self.batch_size):
                self._write_batch(txn, batch)

    def pre_commit(self, txn: MySQLBranch) -> Handle:
        self._require_open(txn)
        with self._guard(txn, "preparing (the branch may be prepared: then cleanup aborts it)"):
            self._insert_marker(txn)
            _xa(txn.conn, "END", txn.xid)
            _xa(txn.conn, "PREPARE", txn.xid)
        self._close(txn)  # never reuse a connection after PREPARE; closing detaches the branch
        log.debug("prepared %s: %d rows, xid %s", txn.txn_id, txn.rows, txn.xid)
        return self.handle(txn.txn_id, rows=txn.rows, gtrid=txn.xid.gtrid, bqual=txn.xid.bqual)

    def discard(self, txn: MySQLBranch) -> None:
        """Roll back an unprepared branch and close its connection; never raises."""
        if not txn.open:
            return
        for verb in ("END", "ROLLBACK"):
            with contextlib.suppress(Exception):
                _xa(txn.conn, verb, txn.xid)
        self._close(txn)

    @staticmethod
    def _close(txn: MySQLBranch) -> None:
        _close_quietly(txn.conn)
        txn.conn = None

    def _require_open(self, txn: MySQLBranch) -> None:
        if not txn.open:
            raise FatalError(f"transaction {txn.txn_id} is already prepared or discarded.",
                             fix="begin a new transaction for every partition attempt")

    @contextlib.contextmanager
    def _guard(self, txn: MySQLBranch, step: str) -> Iterator[None]:
        """Any failure discards the branch (it is never committed) and is classified."""
        try:
            yield
        except BaseException as exc:
            self.discard(txn)
            if not isinstance(exc, pymysql.err.MySQLError):
                raise
            error = self._classify(exc, f"{step} transaction {txn.txn_id} into {self.target}")
            if isinstance(error, RetryableError):
                error = RetryableError(f"{error.cause} {_UNPREPARED_NOTE}", fix=error.fix)
            raise error from exc

    def _write_batch(self, txn: MySQLBranch, batch: list[Sequence[Any]]) -> None:
        width = len(txn.columns)
        if bad := next((row for row in batch if len(row) != width), None):
            raise SchemaMismatchError(
                f"a row of transaction {txn.txn_id} has {len(bad)} values for {width} "
                f"columns {txn.columns}.", fix=_FIX_ROWS)
        if txn.use_load_data:
            try:
                self._load_batch(txn, batch)
            except pymysql.err.MySQLError as exc:
                if self.bulk != "auto" or _error_code(exc) not in LOCAL_INFILE_REFUSED:
                    raise
                log.warning("%s refuses LOAD DATA LOCAL (%s); writing with INSERT instead",
                            self.address, _error_text(exc))
                txn.use_load_data = False
        if not txn.use_load_data:
            self._insert_batch(txn, batch)
        txn.rows += len(batch)

    def _load_batch(self, txn: MySQLBranch, batch: list[Sequence[Any]]) -> None:
        try:
            load_rows(txn.conn, self.target, txn.columns, batch,
                      what=f"loading transaction {txn.txn_id} into {self.target}")
        except OverflowError as exc:  # an aware datetime whose UTC time is out of range
            raise _unsendable(txn, exc) from exc

    def _insert_batch(self, txn: MySQLBranch, batch: list[Sequence[Any]]) -> None:
        try:
            insert_rows(txn.conn, self.target, txn.columns, batch, upsert=self.mode == "upsert",
                        what=f"inserting transaction {txn.txn_id} into {self.target}")
        except (TypeError, ValueError, OverflowError) as exc:
            raise _unsendable(txn, exc) from exc

    def _insert_marker(self, txn: MySQLBranch) -> None:
        created = _utc_naive(dt.datetime.fromtimestamp(txn.txn_id.created, dt.UTC))
        try:
            _query(txn.conn,
                   f"INSERT INTO {self._qualified(self.marker_table)} (txn_id, namespace, "
                   "target_table, row_count, created_at, prepared_at) "
                   "VALUES (%s, %s, %s, %s, %s, UTC_TIMESTAMP(6))",
                   (str(txn.txn_id), txn.txn_id.namespace, self.target, txn.rows, created))
        except pymysql.err.MySQLError as exc:
            if _error_code(exc) == DUPLICATE_KEY:
                raise FatalError(
                    f"transaction id {txn.txn_id} was already used and committed in "
                    f"{self.target}: a state file restored from an older copy reuses ids.",
                    fix="restore the newest state file of this checkpoint; never reuse an old "
                    "one") from exc
            if _error_code(exc) == 1146:
                raise ConfigurationError(
                    f"marker table {self._qualified(self.marker_table)} is missing.",
                    fix="call sink.check_schema()/create_tables() first (twophase.spark does), "
                    "or create it with sinks.mysql.MARKER_TABLE_DDL") from exc
            raise

    # -- driver: commit, abort, in-doubt -------------------------------------------------------

    def _xid(self, handle: Handle) -> Xid:
        self.require_own(handle)
        gtrid, bqual = handle.data.get("gtrid"), handle.data.get("bqual")
        if isinstance(gtrid, str) and isinstance(bqual, str):
            return Xid(gtrid, bqual)
        return Xid.of(handle.txn_id)

    def commit(self, handle: Handle) -> CommitOutcome:
        xid = self._xid(handle)
        what = f"commit of transaction {handle.txn_id} (xid {xid})"
        with self._fenced(handle.txn_id, what, required=True), self._session(what) as conn:
            try:
                resolved = self._resolve(conn, "COMMIT", handle.txn_id, xid)
            except pymysql.err.MySQLError as exc:
                if _error_code(exc) in _LOST_ROLLED_BACK:
                    raise self._lost(handle, xid, f"the server rolled it back ({exc})") from exc
                raise
            outcome = CommitOutcome.COMMITTED
            if not resolved:  # 1397: already committed (marker visible) or lost
                if not self._marker_visible(conn, handle.txn_id):
                    raise self._lost(handle, xid,
                                     "XA RECOVER does not list it and its marker row is absent")
                outcome = CommitOutcome.ALREADY_COMMITTED
            self._stamp(conn, handle.txn_id)
            return outcome

    def abort(self, handle: Handle) -> AbortOutcome:
        xid = self._xid(handle)
        what = f"abort of transaction {handle.txn_id} (xid {xid})"
        with self._fenced(handle.txn_id, what, required=False), self._session(what) as conn:
            if self._resolve(conn, "ROLLBACK", handle.txn_id, xid):
                return AbortOutcome.ABORTED
            if self._marker_visible(conn, handle.txn_id):
                log.warning("abort of %s: it is committed already, nothing to roll back",
                            handle.txn_id)
            return AbortOutcome.NOT_FOUND

    def _resolve(self, conn: Any, verb: str, txn_id: TxnId, xid: Xid) -> bool:
        """``XA COMMIT``/``XA ROLLBACK``; False if the server does not know the xid (1397).

        A 1397 while ``XA RECOVER`` still lists the branch means the session that prepared it
        has not ended yet: its writer closed the connection a moment ago and the server is
        still tearing the session down. That resolves within milliseconds, so wait for it (up
        to ``DETACH_WAIT_S``) before calling it a retryable error.
        """
        deadline = time.monotonic() + DETACH_WAIT_S
        while True:
            try:
                _xa(conn, verb, xid)
                return True
            except pymysql.err.MySQLError as exc:
                if _error_code(exc) != XAER_NOTA:
                    raise
            if not _is_prepared(conn, xid):
                return False
            if time.monotonic() > deadline:
                raise RetryableError(
                    f"transaction {txn_id} (xid {xid}) is prepared on {self.address} but still "
                    f"attached to the session that prepared it after {DETACH_WAIT_S:.0f}s, so "
                    "no other session can resolve it (MariaDB does not detach prepared "
                    "branches).",
                    fix="retried automatically; it resolves when that session disconnects",
                )
            time.sleep(DETACH_POLL_S)

    def _marker_visible(self, conn: Any, txn_id: TxnId) -> bool:
        return bool(_query(conn, f"SELECT 1 FROM {self._qualified(self.marker_table)} "
                                 "WHERE txn_id = %s", (str(txn_id),)))

    def _stamp(self, conn: Any, txn_id: TxnId) -> None:
        _query(conn, f"UPDATE {self._qualified(self.marker_table)} "
                     "SET committed_at = UTC_TIMESTAMP(6) "
                     "WHERE txn_id = %s AND committed_at IS NULL", (str(txn_id),))

    def _lost(self, handle: Handle, xid: Xid, why: str) -> TransactionLostError:
        txn, markers = handle.txn_id, self._qualified(self.marker_table)
        return TransactionLostError(
            f"transaction {txn} (XA xid {xid}) on {self.address} is neither prepared nor "
            f"provably committed: {why}. Either it was rolled back outside this commit (XA "
            "ROLLBACK by an operator or another job's cleanup, or an abort of this very "
            f"transaction): then its {handle.rows} rows of batch {txn.batch}, partition "
            f"{txn.partition} are NOT in {self.target}; or its marker row in {markers} was "
            "purged after it committed: then they are.",
            fix=f"find out which (the server's general or audit log for XA ROLLBACK {xid}, or "
            f"look for the rows); if they are missing, replay batch {txn.batch} of query "
            f"{txn.query} from the source; purge commit markers only long after any recovery "
            "could still run",
        )

    def list_in_doubt(self, namespace: str) -> list[Handle]:
        prefix = namespace_prefix(namespace).encode()
        with self._session(f"listing in-doubt XA branches of namespace {namespace!r}") as conn:
            xids = _xa_recover(conn)
        handles = []
        for gtrid, bqual in xids:
            if not gtrid.startswith(prefix):
                continue
            try:
                xid = Xid(gtrid.decode("ascii"), bqual.decode("ascii"))
                txn_id = TxnId.from_parts(xid.gtrid[len(XID_PREFIX):], xid.bqual)
            except (ValueError, ConfigurationError):
                log.warning("prepared XA branch %r,%r looks like twophase's but does not parse; "
                            "leaving it alone", gtrid, bqual)
                continue
            handles.append(self.handle(txn_id, rows=0, gtrid=xid.gtrid, bqual=xid.bqual))
        return handles

    def purge_commit_records(self, namespace: str, older_than: dt.datetime) -> int:
        """Delete markers of ``namespace`` committed before ``older_than`` (naive = UTC).

        Reads candidates with a non-locking read, then deletes them one primary key at a time:
        any DELETE that scans (even ``WHERE txn_id IN (...)`` on a small table) waits for the
        row locks that prepared branches hold on their own, invisible, marker rows.
        """
        validate_namespace(namespace)
        markers = self._qualified(self.marker_table)
        cutoff = _utc_naive(older_than)
        with self._session(f"purging commit markers of namespace {namespace!r}") as conn:
            ids = [(row[0],) for row in _query(
                conn, f"SELECT txn_id FROM {markers} WHERE namespace = %s AND committed_at < %s",
                (namespace, cutoff))]
            for start in range(0, len(ids), PURGE_CHUNK):
                conn.begin()
                with conn.cursor() as cursor:
                    cursor.executemany(f"DELETE FROM {markers} WHERE txn_id = %s",
                                       ids[start:start + PURGE_CHUNK])
                conn.commit()
        log.info("purged %d commit markers of namespace %s older than %s UTC",
                 len(ids), namespace, cutoff)
        return len(ids)

    # -- fencing -------------------------------------------------------------------------------

    def fence(self, namespace: str, query_id: str, epoch: int) -> None:
        """Claim ``epoch`` for this query: raise the fence row to it, or FencedError if older.

        Call on the driver when a run starts (the same epoch again is fine, e.g. for cleanup
        joining a live run), before any commit or abort of that run. Waits for commits of older
        runs that are past their fence check. Does nothing unless ``fencing=True``.
        """
        key = (validate_namespace(namespace), query_key(query_id))
        if not self.fencing:
            log.debug("fencing is off for %r: not fencing query %s", self, key[1])
            return
        table = self._qualified(self.fence_table)
        with self._session(f"fencing query {key[1]} of namespace {namespace!r}") as conn:
            conn.begin()
            _query(conn, f"INSERT INTO {table} (namespace, query, epoch, fenced_at) "
                         "VALUES (%s, %s, %s, UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE "
                         "fenced_at = IF(epoch < %s, UTC_TIMESTAMP(6), fenced_at), "
                         "epoch = GREATEST(epoch, %s)", (*key, epoch, epoch, epoch))
            current = int(_query(conn, f"SELECT epoch FROM {table} "
                                       "WHERE namespace = %s AND query = %s", key)[0][0])
            conn.commit()
        if current > epoch:
            raise self._fenced_error(key, epoch, current)
        self._fenced_epochs[key] = epoch
        log.info("fenced query %s of namespace %s at epoch %d", key[1], key[0], epoch)

    @contextlib.contextmanager
    def _fenced(self, txn_id: TxnId, what: str, *, required: bool) -> Iterator[None]:
        """Hold a shared lock on the fence row, checked, around the XA COMMIT/ROLLBACK.

        ``required``: refuse if this process never claimed an epoch for the query (commits);
        otherwise (aborts) an unclaimed query is not checked, so cleanup can abort orphans.
        """
        key = (txn_id.namespace, txn_id.query)
        mine = self._fenced_epochs.get(key)
        if not self.fencing or (mine is None and not required):
            yield
            return
        if mine is None:
            raise ConfigurationError(
                f"{what}: fencing=True, but this process never called "
                f"sink.fence({key[0]!r}, <query id>, <epoch>) for query {key[1]}.",
                fix="call sink.fence() with the run's epoch when the run starts",
            )
        with self._session(f"fence check for {what}",
                           idle_timeout_s=FENCE_LOCK_IDLE_TIMEOUT_S) as lock:
            lock.begin()
            rows = _query(lock, f"SELECT epoch FROM {self._qualified(self.fence_table)} "
                                "WHERE namespace = %s AND query = %s LOCK IN SHARE MODE", key)
            current = int(rows[0][0]) if rows else 0
            if current != mine:
                raise self._fenced_error(key, mine, current)
            yield
            try:
                lock.commit()
            except pymysql.err.MySQLError:
                log.error("%s: the fence lock was lost before the XA statement finished; a "
                          "newer run may have taken over meanwhile", what)

    def _fenced_error(self, key: tuple[str, str], mine: int, current: int) -> FencedError:
        namespace, query = key
        return FencedError(
            f"run with epoch {mine} of query {query} (namespace {namespace!r}) is fenced: "
            f"{self._qualified(self.fence_table)} on {self.address} is at epoch {current}, so a "
            "newer run took over (or this run's state file was restored from an older copy).",
            fix="stop this run; the newer run finishes every decided batch. Only if no other "
            f"run is alive: DELETE FROM {self._qualified(self.fence_table)} WHERE "
            f"namespace = '{namespace}' AND query = '{query}'",
        )


def _unsendable(txn: MySQLBranch, exc: Exception) -> SchemaMismatchError:
    return SchemaMismatchError(
        f"a value of transaction {txn.txn_id} cannot be sent to MySQL: {exc}.",
        fix="cast the columns to strings, numbers, binary or timestamps")


def _close_quietly(conn: Any) -> None:
    if conn is None:
        return
    with contextlib.suppress(Exception):
        conn.close()
