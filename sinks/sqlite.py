"""``SQLiteSink``: exactly-once into a table of a local SQLite database (the embedded default).

It is also the reference for writing a sink: each phase is a few lines of SQL. The sink writes;
its driver side (commit, abort, the listing in doubt, the purges) lives in
:class:`SQLiteCommitter`, which holds one connection for a batch's handles (the shape of a sink
that shares something per batch; a sink without that need puts them on the sink, as
``tests/user_sink.py`` does: see :mod:`twophase.sink`).

Every transaction stages its rows in a table of its own, ``"_twophase_stage:<txn id>:<table>"``
(untyped columns: values keep their type until they reach the target). Two bookkeeping tables
live beside the target: ``_twophase_prepared`` (one marker per pre-committed transaction) and
``_twophase_committed`` (one record per committed transaction: the proof that a second commit is
a no-op). Every phase is one local SQLite transaction, so it happens entirely or not at all.

==========  ====================  ====================  ====================  ====================
phase       calls                 a crash here leaves   resolved by           raises
==========  ====================  ====================  ====================  ====================
begin       ``CREATE TABLE`` the  an empty staging      the driver's sweep    RetryableError
            staging table         table, no marker: in  or                    (busy, locked),
                                  doubt, listed by      ``twophase.cleanup``  ConfigurationError
                                  ``list_in_doubt``     drops it              (path, permission)
write       ``INSERT`` into it,   staged rows without   as begin; Spark re-   SchemaMismatchError
            ``chunk_size`` rows   a marker: as begin    runs the task         (a value sqlite3
            per local                                                         cannot store),
            transaction                                                       RetryableError
            (converted before
            the write lock is
            taken)
pre-commit  one transaction:      nothing new (rolled   an orphan (a marker   SchemaMismatchError
            trial-insert the      back), or a prepared  no decision names)    (a constraint
            staged rows into the  marker: durable,      is aborted by the     violation fails now,
            target and roll       invisible             sweep or cleanup; a   not after the
            back, write the                             decided one is        decision),
            marker                                      committed             FatalError (the id
                                                                              was committed once)
commit      one transaction:      nothing (rolled       driver recovery       TransactionLostError
            copy the staged rows  back) or everything;  commits again: the    (neither marker nor
            into the target,      the commit record     record answers        record: aborted
            drop the staging      makes a repeated      ALREADY_COMMITTED     outside),
            table and marker,     commit                                      RetryableError
            record it             ALREADY_COMMITTED
abort       one transaction:      nothing (rolled       repeat it: nothing    FatalError (it is
            drop the staging      back) or nothing      left is NOT_FOUND     committed),
            table and the marker  left                                        RetryableError
==========  ====================  ====================  ====================  ====================

In doubt: the committer's ``list_in_doubt`` lists prepared markers and staging tables of the
namespace (a staging table outlives its writer). Fencing: none beyond the state file's epoch
(one host reaches a local file). Privileges: write access to the database file and its
directory (WAL).

Values: SQLite has no date, time or decimal types, so those become ISO 8601 text that sorts
in time order and that SQLite's date functions read: a Spark ``TIMESTAMP`` (an instant) as UTC
with its offset, ``2026-11-01T09:30:00.000000+00:00``, whatever the workers' time zone; a
``TIMESTAMP_NTZ`` (a wall-clock value) without one, ``2026-11-01T09:30:00.000000``; a ``DATE``
as ``2026-11-01``; a ``DECIMAL`` as its exact digits. Everything else is stored as it comes.

Modes: ``insert`` appends; ``upsert`` replaces rows with the same ``key`` (later rows win,
batches apply in order); ``keyed`` keeps the latest state of each ``key`` by ``version``
(:mod:`twophase._keyed`: a late or repeated change is a no-op, a delete keeps a tombstone in
``"_twophase_tombstones_<table>"``). The keyed mode changes no phase: the staged rows are
applied at commit, reduced to the newest change per key in SQL, so rows need no routing by key.
"""
from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twophase import (
    AbortOutcome,
    Column,
    CommitOutcome,
    Committer,
    ConfigurationError,
    FatalError,
    Handle,
    RetryableError,
    SchemaMismatchError,
    TransactionContext,
    TwoPhaseCommitSink,
    TwoPhaseError,
    TxnId,
)
from twophase.kit import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_TOMBSTONE_RETENTION_S,
    ErrorTable,
    Keyed,
    Mode,
    NamespaceOfTarget,
    TableColumn,
    as_utc,
    check_columns,
    chunks,
    classified,
    transaction_id_reused,
    transaction_lost,
    validate_chunk_size,
    validate_keyed,
    validate_mode,
)
from twophase.kit.sql import TOMBSTONE_TIME_COLUMN, keyed_apply_statements, tombstone_table_name

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

DEFAULT_BUSY_TIMEOUT_S = 60.0
SQLITE_MAX_NAME = 128  # SQLite sets no limit; long names are cut like other databases'
PREPARED_TABLE = "_twophase_prepared"
COMMITTED_TABLE = "_twophase_committed"
STAGE_PREFIX = "_twophase_stage:"
STAGE_SEPARATOR = ":"  # never in a transaction id
#: The keyed mode's scratch table of one commit (temporary: the connection's own).
CHANGES_TABLE = "_twophase_changes"
#: SQLite's current time in seconds since the epoch (a tombstone's ``deleted_at``).
NOW_SQL = "((julianday('now') - 2440587.5) * 86400.0)"


def quote(identifier: str) -> str:
    """Quote an SQLite identifier."""
    return '"' + identifier.replace('"', '""') + '"'


@dataclass
class SQLiteTransaction:
    """An open transaction: its id, its staging table and how many rows it staged."""

    ctx: TransactionContext
    connection: sqlite3.Connection
    stage: str
    rows: int = 0


class SQLiteSink(NamespaceOfTarget, TwoPhaseCommitSink[SQLiteTransaction]):
    """Exactly-once into ``table`` of the SQLite database at ``path`` (see the module docstring)."""

    kind = "sqlite"
    commit_parallelism = 1  # SQLite has one writer at a time: parallel commits only queue

    def __init__(
        self,
        path: str | Path,
        table: str,
        *,
        mode: Mode = "insert",
        key: Sequence[str] = (),
        version: str | None = None,
        deleted: str | None = None,
        tombstone_retention_s: float = DEFAULT_TOMBSTONE_RETENTION_S,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
    ) -> None:
        if not table:
            raise ConfigurationError("SQLiteSink needs a table name.", fix="pass table='...'")
        self.database = SQLiteDatabase(str(path), busy_timeout_s)
        self.table = table
        self.mode = validate_mode("SQLiteSink", mode, key)
        self.key = tuple(key)
        self.keyed = validate_keyed("SQLiteSink", mode, key, version, deleted,
                                    tombstone_retention_s=tombstone_retention_s)
        self.chunk_size = validate_chunk_size("SQLiteSink", chunk_size)

    def __repr__(self) -> str:
        return f"SQLiteSink(path={self.path!r}, table={self.table!r}, mode={self.mode!r})"

    @property
    def path(self) -> str:
        return self.database.path

    @property
    def where(self) -> str:
        """The target, as messages name it."""
        return f"table {self.table!r} of SQLite database {self.path}"

    def target_name_and_place(self) -> tuple[str, ...]:
        """The table's name and the database file's path (as given)."""
        return (self.table, self.database.path)

    def stage_table(self, txn_id: TxnId) -> str:
        """The staging table of one transaction of this sink."""
        return f"{STAGE_PREFIX}{txn_id}{STAGE_SEPARATOR}{self.table}"

    # -- driver: before the first write ----------------------------------------------------

    @property
    def tombstones(self) -> str:
        """The keyed mode's table of deleted keys (key, version, ``deleted_at``)."""
        return tombstone_table_name(self.table, max_length=SQLITE_MAX_NAME)

    def check_schema(self, columns: Sequence[Column]) -> None:
        """The kit's column checks (:func:`twophase.kit.check_columns`) on the table; in the
        keyed mode on the written columns (not the delete marker), the key a unique key."""
        if self.keyed is not None:
            self.keyed.check_columns(self.where, columns)
            columns = [c for c in columns if c.name != self.keyed.deleted]
        with self.database.reading("schema check") as connection:
            catalog = table_columns(connection, self.table)
            unique_keys = unique_keys_of(connection, self.table) if self.upsert_key else []
        check_columns(self.where, catalog, columns, upsert_key=self.upsert_key,
                      unique_keys=unique_keys)

    # -- executor --------------------------------------------------------------------------

    def begin_transaction(self, ctx: TransactionContext) -> SQLiteTransaction:
        stage = self.stage_table(ctx.txn_id)
        connection = self.database.connect(f"begin of {ctx.txn_id}")
        with self.database.transaction(f"begin of {ctx.txn_id}", connection):
            create_bookkeeping(connection)
            names = ", ".join(map(quote, ctx.column_names))  # untyped: values keep their type
            connection.execute(f"CREATE TABLE {quote(stage)} ({names})")
        return SQLiteTransaction(ctx, connection, stage)

    def write(self, txn: SQLiteTransaction, rows: Iterable[Sequence[Any]]) -> None:
        convert = _row_converter(txn.ctx.columns)
        if self.keyed is not None:
            rows = self.keyed.require_present(rows, txn.ctx.column_names)
        for chunk in chunks(rows, self.chunk_size):
            self._stage(txn, [convert(row) for row in chunk])

    def write_arrow(self, txn: SQLiteTransaction, batches: Iterable[pa.RecordBatch]) -> None:
        """Record batches, their dates, times and decimals made text by Arrow, not per row."""
        for batch in batches:
            if self.keyed is not None:
                self.keyed.require_present_arrow(batch)
            for start in range(0, batch.num_rows, self.chunk_size):
                columns = _as_sqlite_values(batch.slice(start, self.chunk_size))
                self._stage(txn, list(zip(*(c.to_pylist() for c in columns), strict=True)))

    def _stage(self, txn: SQLiteTransaction, chunk: Sequence[Sequence[Any]]) -> None:
        """One chunk of rows into the staging table, in a local transaction of its own."""
        insert = (f"INSERT INTO {quote(txn.stage)} "
                  f"VALUES ({', '.join('?' * len(txn.ctx.columns))})")
        with self.database.transaction(f"write of {txn.ctx.txn_id}", txn.connection) as conn:
            conn.executemany(insert, chunk)
        txn.rows += len(chunk)

    def pre_commit(self, txn: SQLiteTransaction) -> Handle:
        txn_id = str(txn.ctx.txn_id)
        with self.database.transaction(f"pre-commit of {txn_id}", txn.connection) as conn:
            if recorded(conn, COMMITTED_TABLE, txn_id):
                raise transaction_id_reused(txn.ctx.txn_id, where=self.where)
            conn.execute("SAVEPOINT trial")
            self.apply_staged(conn, txn.stage)  # a bad row fails now
            conn.execute("ROLLBACK TO trial")
            conn.execute(f"INSERT INTO {PREPARED_TABLE} (txn_id, target, rows, prepared_at) "
                         "VALUES (?, ?, ?, ?)", (txn_id, self.table, txn.rows, time.time()))
        txn.connection.close()
        return self.handle(txn.ctx.txn_id, txn.rows)

    def discard(self, txn: SQLiteTransaction) -> None:
        """Drop the staging table now; if that fails too, a sweep or cleanup drops it later."""
        try:
            with self.database.transaction(f"discard of {txn.ctx.txn_id}", txn.connection) as c:
                drop_staged(c, str(txn.ctx.txn_id), txn.stage)
        except TwoPhaseError as exc:
            log.warning("could not discard %s, it stays in doubt: %s", txn.ctx.txn_id, exc)
        finally:
            txn.connection.close()

    # -- driver: everything in the committer -------------------------------------------------

    #: Deprecated on the sink (removed in 0.6.0): call them on ``sink.committer()``.
    moved_to_committer = frozenset({"list_in_doubt", "purge_commit_records"})

    def committer(self) -> SQLiteCommitter:
        return SQLiteCommitter(self)

    @property
    def upsert_key(self) -> tuple[str, ...] | None:
        """The key rows are upserted on (or kept by, in the keyed mode), None in insert mode."""
        return self.key if self.mode != "insert" else None

    def apply_staged(self, connection: sqlite3.Connection, stage: str) -> None:
        """The staged rows into the table, as the mode says, in the caller's transaction."""
        if self.keyed is None:
            apply_staged(connection, self.table, stage, self.upsert_key)
            return
        create_tombstones(connection, self.tombstones, self.keyed)
        for statement in keyed_statements(self.keyed, self.table, self.tombstones,
                                          stage, column_names(connection, stage)):
            connection.execute(statement)


@dataclass(frozen=True)
class SQLiteDatabase:
    """Connections to one database file and its local transactions, errors classified."""

    path: str
    busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S

    def connect(self, what: str) -> sqlite3.Connection:
        with self.guarded(what):
            connection = sqlite3.connect(self.path, timeout=self.busy_timeout_s,
                                         isolation_level=None, check_same_thread=False)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=FULL")
            return connection

    @contextlib.contextmanager
    def transaction(
        self, what: str, connection: sqlite3.Connection | None = None
    ) -> Iterator[sqlite3.Connection]:
        """One write transaction; on a fresh connection (closed after) unless one is given."""
        active = connection or self.connect(what)
        try:
            with self.guarded(what):
                active.execute("BEGIN IMMEDIATE")
                try:
                    yield active
                except BaseException:
                    active.rollback()
                    raise
                active.commit()
        finally:
            if connection is None:
                active.close()

    @contextlib.contextmanager
    def reading(self, what: str) -> Iterator[sqlite3.Connection]:
        connection = self.connect(what)
        try:
            with self.guarded(what):
                yield connection
        finally:
            connection.close()

    def guarded(self, what: str) -> contextlib.AbstractContextManager[None]:
        return classified(_classify, f"{what} on {self.path}", sqlite3.Error)


# -- SQL pieces ------------------------------------------------------------------------------

def apply_staged(connection: sqlite3.Connection, table: str, stage: str,
                 upsert_key: Sequence[str] | None) -> None:
    """Insert (or upsert on ``upsert_key``) the staged rows into ``table``, in the order they
    were written."""
    columns = column_names(connection, stage)
    names = ", ".join(map(quote, columns))
    sql = (f"INSERT INTO {quote(table)} ({names}) SELECT {names} "
           f"FROM {quote(stage)} WHERE true ORDER BY rowid")
    if upsert_key:
        updates = ", ".join(f"{quote(c)} = excluded.{quote(c)}"
                            for c in columns if c not in upsert_key)
        sql += f" ON CONFLICT ({', '.join(map(quote, upsert_key))}) DO " + (
            f"UPDATE SET {updates}" if updates else "NOTHING")
    connection.execute(sql)


def keyed_statements(keyed: Keyed, table: str, tombstones: str, stage: str,
                     staged: Sequence[str]) -> list[str]:
    """The keyed mode's statements (:func:`twophase.kit.sql.keyed_apply_statements`) over one
    staging table: a row is a delete where its marker is true (1) or ``'d'``; rows of one
    version apply in the order they were staged."""
    marker = quote(keyed.deleted) if keyed.deleted else None
    return keyed_apply_statements(
        keyed, quote=quote, source=quote(stage), target=quote(table),
        tombstones=quote(tombstones), scratch=quote(CHANGES_TABLE),
        columns=keyed.written(staged), order="rowid", now=NOW_SQL,
        deleted=f"COALESCE({marker} IN (1, 'd'), 0)" if marker else "0")


def create_tombstones(connection: sqlite3.Connection, tombstones: str, keyed: Keyed) -> None:
    """The keyed mode's table of deleted keys, unless it exists."""
    key = ", ".join(map(quote, keyed.key))
    connection.execute(
        f"CREATE TABLE IF NOT EXISTS {quote(tombstones)} ({key}, {quote(keyed.version)}, "
        f"{quote(TOMBSTONE_TIME_COLUMN)} REAL NOT NULL, PRIMARY KEY ({key}))")


def create_bookkeeping(connection: sqlite3.Connection) -> None:
    for table, stamp in ((PREPARED_TABLE, "prepared_at"), (COMMITTED_TABLE, "committed_at")):
        connection.execute(
            f"CREATE TABLE IF NOT EXISTS {table} (txn_id TEXT PRIMARY KEY, "
            f"target TEXT NOT NULL, rows INTEGER NOT NULL, {stamp} REAL NOT NULL)")


def drop_staged(connection: sqlite3.Connection, txn_id: str, stage: str) -> bool:
    """Drop the staging table and the marker of ``txn_id``; True if there was either."""
    existed = has_table(connection, stage)
    connection.execute(f"DROP TABLE IF EXISTS {quote(stage)}")
    marker = connection.execute(
        f"DELETE FROM {PREPARED_TABLE} WHERE txn_id = ?", (txn_id,)).rowcount
    return existed or bool(marker)


def recorded(connection: sqlite3.Connection, table: str, txn_id: str) -> bool:
    query = f"SELECT 1 FROM {table} WHERE txn_id = ?"
    return connection.execute(query, (txn_id,)).fetchone() is not None


def has_table(connection: sqlite3.Connection, table: str) -> bool:
    query = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
    return connection.execute(query, (table,)).fetchone() is not None


def prepared_rows(connection: sqlite3.Connection, target: str) -> dict[str, int]:
    """Row counts of the prepared markers of ``target``, by transaction id."""
    if not has_table(connection, PREPARED_TABLE):
        return {}
    return dict(connection.execute(
        f"SELECT txn_id, rows FROM {PREPARED_TABLE} WHERE target = ?", (target,)).fetchall())


def staged_txn_ids(connection: sqlite3.Connection, target: str) -> list[str]:
    """The transaction ids of every staging table of ``target``."""
    suffix = STAGE_SEPARATOR + target
    return [name[len(STAGE_PREFIX):].partition(STAGE_SEPARATOR)[0]
            for (name,) in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND "
                "substr(name, 1, ?) = ? AND substr(name, -?) = ?",
                (len(STAGE_PREFIX), STAGE_PREFIX, len(suffix), suffix))]


def column_names(connection: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in connection.execute(f"PRAGMA table_info({quote(table)})")]


def table_columns(connection: sqlite3.Connection, table: str) -> list[TableColumn]:
    """The table's columns as :func:`twophase.kit.check_columns` reads them."""
    return [TableColumn(name, required=bool(not_null) and default is None and not primary_key)
            for _cid, name, _type, not_null, default, primary_key
            in connection.execute(f"PRAGMA table_info({quote(table)})")]


def unique_keys_of(connection: sqlite3.Connection, table: str) -> list[tuple[str, ...]]:
    quoted = quote(table)
    primary_key = tuple(row[1] for row in connection.execute(f"PRAGMA table_info({quoted})")
                        if row[5])
    return [primary_key] + [
        tuple(row[2] for row in connection.execute(f"PRAGMA index_info({quote(index[1])})"))
        for index in connection.execute(f"PRAGMA index_list({quoted})") if index[2]
    ]


#: SQLite's primary result codes (``sqlite_errorcode & 0xFF``), classified once.
SQLITE_ERRORS = ErrorTable("SQLite", {
    5: (RetryableError, "another process holds the database (SQLITE_BUSY); it is retried"),
    6: (RetryableError, "a table is locked (SQLITE_LOCKED); it is retried"),
    19: (SchemaMismatchError, "a row violates a constraint of the target (SQLITE_CONSTRAINT): "
         "correct or filter the offending rows, then restart"),
    20: (SchemaMismatchError, "a value does not fit its column's type (SQLITE_MISMATCH): cast it"),
    18: (SchemaMismatchError, "a value is too big for SQLite (SQLITE_TOOBIG)"),
    1: (SchemaMismatchError, "make the table match the rows (a missing table or column?), "
        "then restart"),
    14: (ConfigurationError, "check the path exists and is writable by the job (SQLITE_CANTOPEN)"),
    8: (ConfigurationError, "make the database writable by the job (SQLITE_READONLY)"),
    3: (ConfigurationError, "give the job access to the database file (SQLITE_PERM)"),
    23: (ConfigurationError, "give the job access to the database file (SQLITE_AUTH)"),
    13: (FatalError, "free disk space for the database (SQLITE_FULL), then restart"),
    10: (FatalError, "check the disk under the database (SQLITE_IOERR), then restart"),
    11: (FatalError, "the database file is damaged (SQLITE_CORRUPT): restore it from a backup"),
})


def _classify(exc: BaseException, what: str) -> TwoPhaseError:
    """An sqlite3 error by its result code; one without a code (a value sqlite3 cannot bind,
    a closed connection) is fatal with its message."""
    code = getattr(exc, "sqlite_errorcode", None)
    name = getattr(exc, "sqlite_errorname", type(exc).__name__)
    primary = code & 0xFF if isinstance(code, int) else None
    return SQLITE_ERRORS.error(primary, what, f"{name}: {exc}")


def _as_sqlite_values(batch: pa.RecordBatch) -> list[pa.Array]:
    """The columns of ``batch`` as values sqlite3 stores: dates, times, decimals as text."""
    import pyarrow as pa  # noqa: PLC0415 - only the Arrow path needs pyarrow
    import pyarrow.compute as pc  # noqa: PLC0415

    def sqlite_value(column: pa.Array) -> pa.Array:
        kind = column.type
        if pa.types.is_timestamp(kind):
            zone = "+00:00" if kind.tz is not None else ""
            return pc.strftime(column, format=f"%Y-%m-%dT%H:%M:%S{zone}")
        if pa.types.is_date(kind) or pa.types.is_decimal(kind):
            return column.cast(pa.string())
        return column

    return [sqlite_value(column) for column in batch.columns]


def _row_converter(columns: Sequence[Column]) -> Callable[[Sequence[Any]], Sequence[Any]]:
    """Turn the values sqlite3 cannot store (timestamps, dates, decimals) into text."""
    needs = [i for i, c in enumerate(columns)
             if c.type in ("timestamp", "timestamp_ntz", "date") or c.type.startswith("decimal")]
    if not needs:
        return lambda row: row

    def convert(row: Sequence[Any]) -> Sequence[Any]:
        values = list(row)
        for i in needs:
            values[i] = _to_text(values[i])
        return values

    return convert


def _to_text(value: Any) -> Any:
    if isinstance(value, datetime):
        return as_utc(value).isoformat(timespec="microseconds") if value.tzinfo else (
            value.isoformat(timespec="microseconds"))
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    return value


class SQLiteCommitter(Committer):
    """The driver side of :class:`SQLiteSink`: every commit and abort of a batch, a recovery
    or a cleanup pass, the listing in doubt and the purges, on one connection lent to one
    thread at a time (SQLite has one writer: parallel commits would only queue).

    Why not on the sink: a fresh connection per handle re-reads the schema (one staging table
    per pending transaction) and checkpoints the write-ahead log when it closes; a recovery of
    1,000 handles took 4.6 s that way, 0.5 s on one connection (``bench/scaling.py``).
    """

    sink: SQLiteSink

    def __init__(self, sink: SQLiteSink) -> None:
        super().__init__(sink)
        self._connection: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def commit(self, handle: Handle) -> CommitOutcome:
        sink, txn_id, stage = self.sink, str(handle.txn_id), self.sink.stage_table(handle.txn_id)
        with self._lock, sink.database.transaction(f"commit of {txn_id}", self._connected()) as c:
            create_bookkeeping(c)  # a database that lost them lost the transaction too
            if recorded(c, COMMITTED_TABLE, txn_id):
                return CommitOutcome.ALREADY_COMMITTED
            if not recorded(c, PREPARED_TABLE, txn_id):
                raise transaction_lost(
                    handle, where=sink.where,
                    why="it is neither prepared nor recorded as committed: aborted outside "
                    "this query (a cleanup with a too short threshold?), or its proof of "
                    "commit was purged")
            sink.apply_staged(c, stage)
            drop_staged(c, txn_id, stage)
            c.execute(f"INSERT INTO {COMMITTED_TABLE} (txn_id, target, rows, committed_at) "
                      "VALUES (?, ?, ?, ?)", (txn_id, sink.table, handle.rows, time.time()))
            return CommitOutcome.COMMITTED

    def abort(self, handle: Handle) -> AbortOutcome:
        txn_id = str(handle.txn_id)
        with self._lock, self.sink.database.transaction(f"abort of {txn_id}",
                                                         self._connected()) as c:
            create_bookkeeping(c)
            if recorded(c, COMMITTED_TABLE, txn_id):
                raise FatalError(
                    f"refusing to abort transaction {txn_id}: it is already committed.",
                    fix="this is a bug in the caller: a committed transaction was decided")
            dropped = drop_staged(c, txn_id, self.sink.stage_table(handle.txn_id))
            return AbortOutcome.ABORTED if dropped else AbortOutcome.NOT_FOUND

    def list_in_doubt(self, namespace: str) -> list[Handle]:
        """The namespace's prepared markers and staging tables (a staging table outlives its
        writer), on the committer's connection."""
        sink = self.sink
        with self._lock, sink.database.guarded("listing of in-doubt transactions"):
            conn = self._connected()
            prepared = prepared_rows(conn, sink.table)
            staged = staged_txn_ids(conn, sink.table)
        in_doubt = {txn_id: prepared.get(txn_id, 0) for txn_id in [*prepared, *staged]
                    if txn_id.startswith(f"{namespace}.")}
        return [sink.handle(TxnId.parse(txn_id), rows) for txn_id, rows in in_doubt.items()]

    def purge_commit_records(self, namespace: str, older_than: datetime) -> int:
        """Forget the commit records of ``namespace`` committed before ``older_than``."""
        sink = self.sink
        with self._lock, sink.database.transaction("purge of commit records",
                                                    self._connected()) as conn:
            create_bookkeeping(conn)
            return conn.execute(
                f"DELETE FROM {COMMITTED_TABLE} WHERE target = ? AND "
                "substr(txn_id, 1, ?) = ? AND committed_at < ?",
                (sink.table, len(namespace) + 1, f"{namespace}.", as_utc(older_than).timestamp()),
            ).rowcount

    def purge_tombstones(self, older_than: datetime) -> int:
        """Delete the keyed mode's tombstones of deletes applied before ``older_than``."""
        sink = self.sink
        if sink.keyed is None:
            return 0
        with self._lock, sink.database.transaction("purge of tombstones", self._connected()) as c:
            create_tombstones(c, sink.tombstones, sink.keyed)
            return c.execute(f"DELETE FROM {quote(sink.tombstones)} WHERE "
                             f"{quote(TOMBSTONE_TIME_COLUMN)} < ?",
                             (as_utc(older_than).timestamp(),)).rowcount

    def tombstones(self) -> tuple[int, datetime | None]:
        """How many tombstones the keyed mode keeps, and when the oldest one's delete was
        applied (None without any)."""
        sink = self.sink
        if sink.keyed is None:
            return 0, None
        with sink.database.reading("count of tombstones") as c:
            if not has_table(c, sink.tombstones):
                return 0, None
            count, oldest = c.execute(
                f"SELECT count(*), min({quote(TOMBSTONE_TIME_COLUMN)}) "
                f"FROM {quote(sink.tombstones)}").fetchone()
        return count, None if oldest is None else datetime.fromtimestamp(oldest, UTC)

    def _connected(self) -> sqlite3.Connection:
        if self._connection is None:
            self._connection = self.sink.database.connect("commit")
        return self._connection

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None
