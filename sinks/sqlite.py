"""``SQLiteSink``: exactly-once into a table of a local SQLite database (the embedded default).

It is also the reference for writing a sink: each phase is a few lines of SQL.

Every transaction stages its rows in a table of its own, ``"_twophase_stage:<txn id>:<table>"``
(untyped columns: values keep their type until they reach the target). Two bookkeeping tables
live beside the target: ``_twophase_prepared`` (one marker per pre-committed transaction) and
``_twophase_committed`` (one record per committed transaction: the proof that a second commit is
a no-op). Every phase is one local SQLite transaction, so it happens entirely or not at all.

===========  ========================================  =====================================
phase        what it does                              a crash here leaves behind
===========  ========================================  =====================================
begin        creates the staging table                 an empty staging table without a
                                                       marker: in doubt, listed by
                                                       ``list_in_doubt``, dropped by the
                                                       next sweep or by cleanup
write        appends rows to it, ``chunk_size`` rows   staged rows without a marker: as above
             per transaction (converted before the
             write lock is taken)
pre-commit   one transaction: trial-insert the staged  as above (rolled back), or a prepared
             rows into the target and roll that back   marker: durable, invisible; committed
             (a constraint violation fails *now*, not  or aborted by the driver's decision
             after the decision), write the marker
commit       one transaction: copy the staged rows     nothing (rolled back) or everything;
             into the target, drop the staging table   the commit record makes a repeated
             and the marker, write the commit record   commit answer ALREADY_COMMITTED
abort        one transaction: drop the staging table   nothing (rolled back) or nothing left
             and the marker
===========  ========================================  =====================================

The driver commits and aborts through :class:`SQLiteCommitter`: one connection for a whole
batch, recovery or cleanup pass (``commit_on`` / ``abort_on`` are the one home of both steps).
``commit`` of a transaction with neither a marker nor a commit record raises
:class:`~twophase.errors.TransactionLostError` (someone aborted a decided transaction).
Values: SQLite has no date, time or decimal types, so those become ISO 8601 text that sorts
in time order and that SQLite's date functions read: a Spark ``TIMESTAMP`` (an instant) as UTC
with its offset, ``2026-11-01T09:30:00.000000+00:00``, whatever the workers' time zone; a
``TIMESTAMP_NTZ`` (a wall-clock value) without one, ``2026-11-01T09:30:00.000000``; a ``DATE``
as ``2026-11-01``; a ``DECIMAL`` as its exact digits. Everything else is stored as it comes.

Modes: ``insert`` appends; ``upsert`` replaces rows with the same ``key`` (later rows win,
batches apply in order).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import date, datetime
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
    ErrorTable,
    Mode,
    TableColumn,
    as_utc,
    check_columns,
    chunks,
    classified,
    namespace_from,
    transaction_id_reused,
    transaction_lost,
    validate_chunk_size,
    validate_mode,
)

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

DEFAULT_BUSY_TIMEOUT_S = 60.0
PREPARED_TABLE = "_twophase_prepared"
COMMITTED_TABLE = "_twophase_committed"
STAGE_PREFIX = "_twophase_stage:"
STAGE_SEPARATOR = ":"  # never in a transaction id


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


class SQLiteSink(TwoPhaseCommitSink[SQLiteTransaction]):
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
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
    ) -> None:
        if not table:
            raise ConfigurationError("SQLiteSink needs a table name.", fix="pass table='...'")
        self.path = str(path)
        self.table = table
        self.mode = validate_mode("SQLiteSink", mode, key)
        self.key = tuple(key)
        self.chunk_size = validate_chunk_size("SQLiteSink", chunk_size)
        self.busy_timeout_s = busy_timeout_s

    def __repr__(self) -> str:
        return f"SQLiteSink(path={self.path!r}, table={self.table!r}, mode={self.mode!r})"

    def default_namespace(self) -> str:
        return namespace_from(self.table, self.kind)

    @property
    def where(self) -> str:
        """The target, as messages name it."""
        return f"table {self.table!r} of SQLite database {self.path}"

    def stage_table(self, txn_id: TxnId) -> str:
        """The staging table of one transaction of this sink."""
        return f"{STAGE_PREFIX}{txn_id}{STAGE_SEPARATOR}{self.table}"

    # -- driver: before the first write ----------------------------------------------------

    def check_schema(self, columns: Sequence[Column]) -> None:
        """The kit's column checks (:func:`twophase.kit.check_columns`) on the table."""
        with self._reading("schema check") as connection:
            catalog = [TableColumn(name, required=bool(not_null) and default is None
                                   and not primary_key)
                       for _cid, name, _type, not_null, default, primary_key
                       in connection.execute(f"PRAGMA table_info({quote(self.table)})")]
            unique_keys = self._unique_keys(connection) if self.mode == "upsert" else []
        check_columns(self.where, catalog, columns,
                      upsert_key=self.key if self.mode == "upsert" else None,
                      unique_keys=unique_keys)

    # -- executor --------------------------------------------------------------------------

    def begin_transaction(self, ctx: TransactionContext) -> SQLiteTransaction:
        stage = self.stage_table(ctx.txn_id)
        connection = self._connect(f"begin of {ctx.txn_id}")
        with self._transaction(f"begin of {ctx.txn_id}", connection):
            self._create_bookkeeping(connection)
            names = ", ".join(map(quote, ctx.column_names))  # untyped: values keep their type
            connection.execute(f"CREATE TABLE {quote(stage)} ({names})")
        return SQLiteTransaction(ctx, connection, stage)

    def write(self, txn: SQLiteTransaction, rows: Iterable[Sequence[Any]]) -> None:
        convert = _row_converter(txn.ctx.columns)
        for chunk in chunks(rows, self.chunk_size):
            self._stage(txn, [convert(row) for row in chunk])

    def write_arrow(self, txn: SQLiteTransaction, batches: Iterable[pa.RecordBatch]) -> None:
        """Record batches, their dates, times and decimals made text by Arrow, not per row."""
        for batch in batches:
            for start in range(0, batch.num_rows, self.chunk_size):
                columns = _as_sqlite_values(batch.slice(start, self.chunk_size))
                self._stage(txn, list(zip(*(c.to_pylist() for c in columns), strict=True)))

    def _stage(self, txn: SQLiteTransaction, chunk: Sequence[Sequence[Any]]) -> None:
        """One chunk of rows into the staging table, in a local transaction of its own."""
        insert = (f"INSERT INTO {quote(txn.stage)} "
                  f"VALUES ({', '.join('?' * len(txn.ctx.columns))})")
        with self._transaction(f"write of {txn.ctx.txn_id}", txn.connection) as connection:
            connection.executemany(insert, chunk)
        txn.rows += len(chunk)

    def pre_commit(self, txn: SQLiteTransaction) -> Handle:
        txn_id = str(txn.ctx.txn_id)
        with self._transaction(f"pre-commit of {txn_id}", txn.connection) as connection:
            if self._recorded(connection, COMMITTED_TABLE, txn_id):
                raise transaction_id_reused(txn.ctx.txn_id, where=self.where)
            connection.execute("SAVEPOINT trial")
            self._apply_staged(connection, txn.stage)  # raises now if a row does not fit
            connection.execute("ROLLBACK TO trial")
            connection.execute(
                f"INSERT INTO {PREPARED_TABLE} (txn_id, target, rows, prepared_at) "
                "VALUES (?, ?, ?, ?)",
                (txn_id, self.table, txn.rows, time.time()),
            )
        txn.connection.close()
        return self.handle(txn.ctx.txn_id, txn.rows)

    def discard(self, txn: SQLiteTransaction) -> None:
        """Drop the staging table now; if that fails too, a sweep or cleanup drops it later."""
        try:
            with self._transaction(f"discard of {txn.ctx.txn_id}", txn.connection) as connection:
                self._drop_staged(connection, str(txn.ctx.txn_id), txn.stage)
        except TwoPhaseError as exc:
            log.warning("could not discard %s, it stays in doubt: %s", txn.ctx.txn_id, exc)
        finally:
            txn.connection.close()

    # -- driver ----------------------------------------------------------------------------

    def committer(self) -> SQLiteCommitter:
        return SQLiteCommitter(self)

    def commit(self, handle: Handle) -> CommitOutcome:
        return self.commit_on(handle)

    def abort(self, handle: Handle) -> AbortOutcome:
        return self.abort_on(handle)

    def commit_on(self, handle: Handle, connection: sqlite3.Connection | None = None
                  ) -> CommitOutcome:
        """Commit ``handle`` in one transaction (on ``connection``, else a fresh one): what
        ``commit`` and the committer both run, so a subclass overrides this one."""
        txn_id, stage = str(handle.txn_id), self.stage_table(handle.txn_id)
        with self._transaction(f"commit of {txn_id}", connection) as active:
            if self._recorded(active, COMMITTED_TABLE, txn_id):
                return CommitOutcome.ALREADY_COMMITTED
            if not self._recorded(active, PREPARED_TABLE, txn_id):
                raise transaction_lost(
                    handle, where=self.where,
                    why="it is neither prepared nor recorded as committed: aborted outside "
                    "this query (a cleanup with a too short threshold?), or its proof of "
                    "commit was purged")
            self._apply_staged(active, stage)
            self._drop_staged(active, txn_id, stage)
            active.execute(
                f"INSERT INTO {COMMITTED_TABLE} (txn_id, target, rows, committed_at) "
                "VALUES (?, ?, ?, ?)",
                (txn_id, self.table, handle.rows, time.time()),
            )
            return CommitOutcome.COMMITTED

    def abort_on(self, handle: Handle, connection: sqlite3.Connection | None = None
                 ) -> AbortOutcome:
        """Abort ``handle`` in one transaction (on ``connection``, else a fresh one): what
        ``abort`` and the committer both run, so a subclass overrides this one."""
        txn_id = str(handle.txn_id)
        with self._transaction(f"abort of {txn_id}", connection) as active:
            if self._recorded(active, COMMITTED_TABLE, txn_id):
                raise FatalError(
                    f"refusing to abort transaction {txn_id}: it is already committed.",
                    fix="this is a bug in the caller: a committed transaction was decided",
                )
            dropped = self._drop_staged(active, txn_id, self.stage_table(handle.txn_id))
            return AbortOutcome.ABORTED if dropped else AbortOutcome.NOT_FOUND

    def list_in_doubt(self, namespace: str) -> list[Handle]:
        prefix = f"{namespace}."
        with self._reading("listing of in-doubt transactions") as connection:
            prepared = dict(connection.execute(
                f"SELECT txn_id, rows FROM {PREPARED_TABLE} WHERE target = ?", (self.table,)
            ).fetchall()) if self._has_table(connection, PREPARED_TABLE) else {}
            staged = [name[len(STAGE_PREFIX):].partition(STAGE_SEPARATOR)[0]
                      for (name,) in connection.execute(
                          "SELECT name FROM sqlite_master WHERE type = 'table' AND "
                          "substr(name, 1, ?) = ? AND substr(name, -?) = ?",
                          (len(STAGE_PREFIX), STAGE_PREFIX, len(self.table) + 1,
                           STAGE_SEPARATOR + self.table))]
        in_doubt = {txn_id: prepared.get(txn_id, 0) for txn_id in [*prepared, *staged]
                    if txn_id.startswith(prefix)}
        return [self.handle(TxnId.parse(txn_id), rows) for txn_id, rows in in_doubt.items()]

    def purge_commit_records(self, namespace: str, older_than: datetime) -> int:
        with self._transaction("purge of commit records") as connection:
            self._create_bookkeeping(connection)
            cursor = connection.execute(
                f"DELETE FROM {COMMITTED_TABLE} WHERE target = ? AND "
                "substr(txn_id, 1, ?) = ? AND committed_at < ?",
                (self.table, len(namespace) + 1, f"{namespace}.", as_utc(older_than).timestamp()),
            )
            return cursor.rowcount

    # -- SQL pieces ------------------------------------------------------------------------

    def _connect(self, what: str) -> sqlite3.Connection:
        with self._guarded(what):
            connection = sqlite3.connect(self.path, timeout=self.busy_timeout_s,
                                         isolation_level=None, check_same_thread=False)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=FULL")
            return connection

    @contextlib.contextmanager
    def _transaction(
        self, what: str, connection: sqlite3.Connection | None = None
    ) -> Iterator[sqlite3.Connection]:
        """One write transaction; on a fresh connection (closed after) unless one is given."""
        active = connection or self._connect(what)
        try:
            with self._guarded(what):
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
    def _reading(self, what: str) -> Iterator[sqlite3.Connection]:
        connection = self._connect(what)
        try:
            with self._guarded(what):
                yield connection
        finally:
            connection.close()

    @staticmethod
    def _create_bookkeeping(connection: sqlite3.Connection) -> None:
        connection.execute(
            f"CREATE TABLE IF NOT EXISTS {PREPARED_TABLE} (txn_id TEXT PRIMARY KEY, "
            "target TEXT NOT NULL, rows INTEGER NOT NULL, prepared_at REAL NOT NULL)"
        )
        connection.execute(
            f"CREATE TABLE IF NOT EXISTS {COMMITTED_TABLE} (txn_id TEXT PRIMARY KEY, "
            "target TEXT NOT NULL, rows INTEGER NOT NULL, committed_at REAL NOT NULL)"
        )

    def _apply_staged(self, connection: sqlite3.Connection, stage: str) -> None:
        """Insert (or upsert) the staged rows into the target, in the order they were written."""
        columns = self._columns(connection, stage)
        names = ", ".join(map(quote, columns))
        sql = (f"INSERT INTO {quote(self.table)} ({names}) SELECT {names} "
               f"FROM {quote(stage)} WHERE true ORDER BY rowid")
        if self.mode == "upsert":
            updates = ", ".join(f"{quote(c)} = excluded.{quote(c)}"
                                for c in columns if c not in self.key)
            sql += f" ON CONFLICT ({', '.join(map(quote, self.key))}) DO " + (
                f"UPDATE SET {updates}" if updates else "NOTHING")
        connection.execute(sql)

    def _drop_staged(self, connection: sqlite3.Connection, txn_id: str, stage: str) -> bool:
        """Drop the staging table and the marker of ``txn_id``; True if there was either."""
        existed = self._has_table(connection, stage)
        connection.execute(f"DROP TABLE IF EXISTS {quote(stage)}")
        marker = connection.execute(
            f"DELETE FROM {PREPARED_TABLE} WHERE txn_id = ?", (txn_id,)).rowcount
        return existed or bool(marker)

    @staticmethod
    def _recorded(connection: sqlite3.Connection, table: str, txn_id: str) -> bool:
        query = f"SELECT 1 FROM {table} WHERE txn_id = ?"
        return connection.execute(query, (txn_id,)).fetchone() is not None

    @staticmethod
    def _has_table(connection: sqlite3.Connection, table: str) -> bool:
        query = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
        return connection.execute(query, (table,)).fetchone() is not None

    @staticmethod
    def _columns(connection: sqlite3.Connection, table: str) -> list[str]:
        return [row[1] for row in connection.execute(f"PRAGMA table_info({quote(table)})")]

    def _unique_keys(self, connection: sqlite3.Connection) -> list[tuple[str, ...]]:
        table = quote(self.table)
        primary_key = tuple(row[1] for row in connection.execute(f"PRAGMA table_info({table})")
                            if row[5])
        return [primary_key] + [
            tuple(row[2] for row in connection.execute(f"PRAGMA index_info({quote(index[1])})"))
            for index in connection.execute(f"PRAGMA index_list({table})") if index[2]
        ]

    def _guarded(self, what: str) -> contextlib.AbstractContextManager[None]:
        return classified(_classify, f"{what} on {self.path}", sqlite3.Error)


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
    """One connection for every commit and abort of a batch, a recovery or a cleanup pass,
    lent to one thread at a time (SQLite has one writer: parallel commits would only queue).
    A fresh connection per handle would re-read the schema (every staging table) and
    checkpoint the write-ahead log at each close: a recovery of 1,000 handles took 3.4 s that
    way, 0.5 s on one connection."""

    sink: SQLiteSink

    def __init__(self, sink: SQLiteSink) -> None:
        super().__init__(sink)
        self._connection: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def commit(self, handle: Handle) -> CommitOutcome:
        with self._lock:
            return self.sink.commit_on(handle, self._connected(f"commit of {handle.txn_id}"))

    def abort(self, handle: Handle) -> AbortOutcome:
        with self._lock:
            return self.sink.abort_on(handle, self._connected(f"abort of {handle.txn_id}"))

    def _connected(self, what: str) -> sqlite3.Connection:
        if self._connection is None:
            self._connection = self.sink._connect(what)
        return self._connection

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None
