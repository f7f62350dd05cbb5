"""``SQLiteSink``: exactly-once into a table of a local SQLite database (the embedded default).

It is also the reference for writing a sink: each phase is a few lines of SQL.

Three tables live beside the target: ``_twophase_staged_<table>`` (rows written but not
visible), ``_twophase_prepared`` (one marker per pre-committed transaction) and
``_twophase_committed`` (one record per committed transaction: the proof that a second commit is
a no-op). All phases are local SQLite transactions, so each one happens entirely or not at all.

===============  =====================================  ===================================
phase            what it does                           a crash here leaves behind
===============  =====================================  ===================================
begin / write    appends rows to the staging table in   staged rows without a marker: in
                 short transactions of ``chunk_size``   doubt, found by ``list_in_doubt``
                                                        and aborted by the next batch's
                                                        sweep or by cleanup
pre-commit       one transaction: trial-insert the      nothing new (rolled back), or a
                 staged rows into the target and roll   prepared marker: invisible, durable,
                 that back (so a constraint violation   committed or aborted by the driver's
                 fails *now*, not after the decision),  decision
                 then write the prepared marker
commit           one transaction: move the staged rows  nothing (rolled back) or everything:
                 into the target, drop the marker,      the commit record makes a repeated
                 write the commit record                commit answer ALREADY_COMMITTED
abort            one transaction: delete staged rows    nothing (rolled back) or nothing
                 and marker                             left at all
===============  =====================================  ===================================

``commit`` of a transaction with neither a marker nor a commit record raises
:class:`~twophase.errors.TransactionLostError` (someone aborted a decided transaction).
Modes: ``insert`` appends; ``upsert`` replaces rows with the same ``key`` (later rows win,
batches apply in order).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from itertools import islice
from pathlib import Path
from typing import Any, Literal

from twophase import (
    AbortOutcome,
    Column,
    CommitOutcome,
    ConfigurationError,
    FatalError,
    Handle,
    RetryableError,
    SchemaMismatchError,
    TransactionContext,
    TransactionLostError,
    TwoPhaseCommitSink,
    TwoPhaseError,
    TxnId,
)

log = logging.getLogger("twophase.sinks.sqlite")

DEFAULT_CHUNK_SIZE = 10_000
DEFAULT_BUSY_TIMEOUT_S = 60.0
PREPARED_TABLE = "_twophase_prepared"
COMMITTED_TABLE = "_twophase_committed"
STAGED_TABLE_PREFIX = "_twophase_staged_"
TXN_COLUMN = "_twophase_txn"

Mode = Literal["insert", "upsert"]


def quote(identifier: str) -> str:
    """Quote an SQLite identifier."""
    return '"' + identifier.replace('"', '""') + '"'


@dataclass
class SQLiteTransaction:
    """An open transaction: the connection and how many rows it staged."""

    ctx: TransactionContext
    connection: sqlite3.Connection
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
        if mode not in ("insert", "upsert"):
            raise ConfigurationError(f"unknown mode {mode!r} for SQLiteSink.",
                                     fix="use mode='insert' or mode='upsert'")
        if mode == "upsert" and not key:
            raise ConfigurationError("mode='upsert' needs the key columns.",
                                     fix="pass key=('id',) naming a unique key of the table")
        if chunk_size < 1:
            raise ConfigurationError(f"chunk_size={chunk_size} must be at least 1.",
                                     fix=f"leave it at {DEFAULT_CHUNK_SIZE} or pass a positive int")
        self.path = str(path)
        self.table = table
        self.mode: Mode = mode
        self.key = tuple(key)
        self.chunk_size = chunk_size
        self.busy_timeout_s = busy_timeout_s

    def __repr__(self) -> str:
        return f"SQLiteSink(path={self.path!r}, table={self.table!r}, mode={self.mode!r})"

    def default_namespace(self) -> str:
        return re.sub(r"[^A-Za-z0-9_-]", "_", self.table)[:24]

    @property
    def staged_table(self) -> str:
        return STAGED_TABLE_PREFIX + self.table

    # -- driver: before the first write ----------------------------------------------------

    def check_schema(self, columns: Sequence[Column]) -> None:
        with self._reading("schema check") as connection:
            target = self._target_columns(connection)
            missing = [c.name for c in columns if c.name not in target]
            if missing:
                raise SchemaMismatchError(
                    f"column(s) {missing} of the rows are not in table {self.table!r} of "
                    f"{self.path} (its columns: {list(target)}).",
                    fix="add the columns to the table, or select/rename them in the DataFrame",
                )
            if self.mode == "upsert":
                self._require_unique_key(connection)

    # -- executor --------------------------------------------------------------------------

    def begin_transaction(self, ctx: TransactionContext) -> SQLiteTransaction:
        connection = self._connect(f"begin of {ctx.txn_id}")
        with self._transaction(f"begin of {ctx.txn_id}", connection):
            self._ensure_tables(connection, ctx.column_names)
        return SQLiteTransaction(ctx, connection)

    def write(self, txn: SQLiteTransaction, rows: Iterable[Sequence[Any]]) -> None:
        names = (TXN_COLUMN, *txn.ctx.column_names)
        insert = (f"INSERT INTO {quote(self.staged_table)} ({', '.join(map(quote, names))}) "
                  f"VALUES ({', '.join('?' * len(names))})")
        convert = _row_converter(str(txn.ctx.txn_id), txn.ctx.columns)
        iterator = iter(rows)
        while chunk := [convert(row) for row in islice(iterator, self.chunk_size)]:
            with self._transaction(f"write of {txn.ctx.txn_id}", txn.connection) as connection:
                connection.executemany(insert, chunk)
            txn.rows += len(chunk)

    def pre_commit(self, txn: SQLiteTransaction) -> Handle:
        txn_id = str(txn.ctx.txn_id)
        columns = list(txn.ctx.column_names)
        with self._transaction(f"pre-commit of {txn_id}", txn.connection) as connection:
            if self._is_committed(connection, txn_id):
                raise FatalError(
                    f"transaction id {txn_id} was already committed once; committing it again "
                    "would silently drop these rows (a state file restored from a backup?).",
                    fix="restart the query so it opens transactions under a new epoch",
                )
            connection.execute("SAVEPOINT trial")
            self._apply_staged(connection, txn_id, columns)  # raises now if a row does not fit
            connection.execute("ROLLBACK TO trial")
            connection.execute(
                f"INSERT INTO {PREPARED_TABLE} (txn_id, target, rows, columns, prepared_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (txn_id, self.table, txn.rows, json.dumps(columns), time.time()),
            )
        txn.connection.close()
        return self.handle(txn.ctx.txn_id, txn.rows)

    def discard(self, txn: SQLiteTransaction) -> None:
        """Drop the staged chunks now; if that fails too, a sweep or cleanup drops them later."""
        try:
            with self._transaction(f"discard of {txn.ctx.txn_id}", txn.connection) as connection:
                self._drop_staged(connection, str(txn.ctx.txn_id))
        except TwoPhaseError as exc:
            log.warning("could not discard %s, it stays in doubt: %s", txn.ctx.txn_id, exc)
        finally:
            txn.connection.close()

    # -- driver ----------------------------------------------------------------------------

    def commit(self, handle: Handle) -> CommitOutcome:
        self.require_own(handle)
        txn_id = str(handle.txn_id)
        with self._transaction(f"commit of {txn_id}") as connection:
            if self._is_committed(connection, txn_id):
                return CommitOutcome.ALREADY_COMMITTED
            columns = self._prepared_columns(connection, txn_id)
            if columns is None:
                raise TransactionLostError(
                    f"transaction {txn_id} ({handle.rows} rows for {self.table!r}) was decided "
                    f"but is neither prepared nor committed in {self.path}: it was aborted "
                    "outside this query (a cleanup with a too short threshold?).",
                    fix="re-deliver the rows of that batch from the source, then run "
                    "`python -m twophase.cleanup --forget-batch` for it",
                )
            self._apply_staged(connection, txn_id, columns)
            self._drop_staged(connection, txn_id)
            connection.execute(
                f"INSERT INTO {COMMITTED_TABLE} (txn_id, target, rows, committed_at) "
                "VALUES (?, ?, ?, ?)",
                (txn_id, self.table, handle.rows, time.time()),
            )
            return CommitOutcome.COMMITTED

    def abort(self, handle: Handle) -> AbortOutcome:
        self.require_own(handle)
        txn_id = str(handle.txn_id)
        with self._transaction(f"abort of {txn_id}") as connection:
            if self._is_committed(connection, txn_id):
                raise FatalError(
                    f"refusing to abort transaction {txn_id}: it is already committed.",
                    fix="this is a bug in the caller: a committed transaction was decided",
                )
            dropped = self._drop_staged(connection, txn_id)
            return AbortOutcome.ABORTED if dropped else AbortOutcome.NOT_FOUND

    def list_in_doubt(self, namespace: str) -> list[Handle]:
        with self._reading("listing of in-doubt transactions") as connection:
            if not self._has_table(connection, PREPARED_TABLE):
                return []
            prefix = f"{namespace}.%"
            rows = connection.execute(
                f"SELECT txn_id, rows FROM {PREPARED_TABLE} WHERE target = ? AND txn_id LIKE ? "
                f"UNION SELECT DISTINCT {TXN_COLUMN}, 0 FROM {quote(self.staged_table)} "
                f"WHERE {TXN_COLUMN} LIKE ? AND {TXN_COLUMN} NOT IN "
                f"(SELECT txn_id FROM {PREPARED_TABLE})",
                (self.table, prefix, prefix),
            ).fetchall()
        return [self.handle(TxnId.parse(txn_id), rows) for txn_id, rows in rows]

    def purge_commit_records(self, namespace: str, older_than: datetime) -> int:
        with self._transaction("purge of commit records") as connection:
            if not self._has_table(connection, COMMITTED_TABLE):
                return 0
            cursor = connection.execute(
                f"DELETE FROM {COMMITTED_TABLE} WHERE target = ? AND txn_id LIKE ? "
                "AND committed_at < ?",
                (self.table, f"{namespace}.%", older_than.timestamp()),
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

    def _ensure_tables(self, connection: sqlite3.Connection, columns: Sequence[str]) -> None:
        staged = quote(self.staged_table)
        connection.execute(
            f"CREATE TABLE IF NOT EXISTS {PREPARED_TABLE} (txn_id TEXT PRIMARY KEY, "
            "target TEXT NOT NULL, rows INTEGER NOT NULL, columns TEXT NOT NULL, "
            "prepared_at REAL NOT NULL)"
        )
        connection.execute(
            f"CREATE TABLE IF NOT EXISTS {COMMITTED_TABLE} (txn_id TEXT PRIMARY KEY, "
            "target TEXT NOT NULL, rows INTEGER NOT NULL, committed_at REAL NOT NULL)"
        )
        connection.execute(f"CREATE TABLE IF NOT EXISTS {staged} ({TXN_COLUMN} TEXT NOT NULL)")
        connection.execute(
            f"CREATE INDEX IF NOT EXISTS {quote(self.staged_table + '_txn')} "
            f"ON {staged} ({TXN_COLUMN})"
        )
        present = {row[1] for row in connection.execute(f"PRAGMA table_info({staged})")}
        for column in columns:
            if column not in present:  # untyped: values keep their type until the target
                connection.execute(f"ALTER TABLE {staged} ADD COLUMN {quote(column)}")

    def _apply_staged(
        self, connection: sqlite3.Connection, txn_id: str, columns: Sequence[str]
    ) -> None:
        """Insert (or upsert) the staged rows of ``txn_id`` into the target, in staging order."""
        names = ", ".join(map(quote, columns))
        sql = (f"INSERT INTO {quote(self.table)} ({names}) SELECT {names} "
               f"FROM {quote(self.staged_table)} WHERE {TXN_COLUMN} = ? ORDER BY rowid")
        if self.mode == "upsert":
            updates = ", ".join(f"{quote(c)} = excluded.{quote(c)}"
                                for c in columns if c not in self.key)
            sql += f" ON CONFLICT ({', '.join(map(quote, self.key))}) DO " + (
                f"UPDATE SET {updates}" if updates else "NOTHING")
        connection.execute(sql, (txn_id,))

    def _drop_staged(self, connection: sqlite3.Connection, txn_id: str) -> bool:
        """Delete the staged rows and the marker of ``txn_id``; True if there was anything."""
        rows = connection.execute(
            f"DELETE FROM {quote(self.staged_table)} WHERE {TXN_COLUMN} = ?", (txn_id,)).rowcount
        marker = connection.execute(
            f"DELETE FROM {PREPARED_TABLE} WHERE txn_id = ?", (txn_id,)).rowcount
        return bool(rows or marker)

    def _is_committed(self, connection: sqlite3.Connection, txn_id: str) -> bool:
        return self._exists(connection, COMMITTED_TABLE, txn_id)

    @staticmethod
    def _prepared_columns(connection: sqlite3.Connection, txn_id: str) -> list[str] | None:
        """The columns of prepared ``txn_id``, or None if it is not prepared."""
        row = connection.execute(
            f"SELECT columns FROM {PREPARED_TABLE} WHERE txn_id = ?", (txn_id,)).fetchone()
        return None if row is None else list(json.loads(row[0]))

    @staticmethod
    def _exists(connection: sqlite3.Connection, table: str, txn_id: str) -> bool:
        query = f"SELECT 1 FROM {table} WHERE txn_id = ?"
        return connection.execute(query, (txn_id,)).fetchone() is not None

    @staticmethod
    def _has_table(connection: sqlite3.Connection, table: str) -> bool:
        query = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
        return connection.execute(query, (table,)).fetchone() is not None

    def _target_columns(self, connection: sqlite3.Connection) -> list[str]:
        columns = [row[1] for row in connection.execute(f"PRAGMA table_info({quote(self.table)})")]
        if not columns:
            raise SchemaMismatchError(f"table {self.table!r} does not exist in {self.path}.",
                                      fix="create it before starting the query")
        return columns

    def _require_unique_key(self, connection: sqlite3.Connection) -> None:
        table = quote(self.table)
        primary_key = tuple(row[1] for row in connection.execute(f"PRAGMA table_info({table})")
                            if row[5])
        unique_keys = [primary_key] + [
            tuple(row[2] for row in connection.execute(f"PRAGMA index_info({quote(index[1])})"))
            for index in connection.execute(f"PRAGMA index_list({table})") if index[2]
        ]
        if not any(set(keys) == set(self.key) for keys in unique_keys):
            raise SchemaMismatchError(
                f"upsert key {list(self.key)} is not a primary or unique key of {self.table!r}.",
                fix=f"create a unique index on {list(self.key)} or pass the table's key",
            )

    def _guarded(self, what: str) -> _ErrorClassifier:
        return _ErrorClassifier(f"SQLite {what} on {self.path}")


class _ErrorClassifier:
    """Turns sqlite3 errors into the twophase taxonomy, naming the step that failed."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        if exc is None or isinstance(exc, TwoPhaseError) or not isinstance(exc, sqlite3.Error):
            return
        raise _classify(self.what, exc) from exc


def _classify(what: str, exc: sqlite3.Error) -> TwoPhaseError:
    message = str(exc)
    if isinstance(exc, sqlite3.IntegrityError):
        return SchemaMismatchError(f"{what}: a row violates a constraint of the target: "
                                   f"{message}.",
                                   fix="correct or filter the offending rows, then restart")
    if "locked" in message or "busy" in message:
        return RetryableError(f"{what}: {message}.",
                              fix="another process holds the database; it is retried")
    if "unable to open" in message or "readonly" in message:
        return ConfigurationError(f"{what}: {message}.",
                                  fix="check the path exists and is writable by the job")
    if "no such" in message or "has no column" in message:
        return SchemaMismatchError(f"{what}: {message}.",
                                   fix="make the table match the rows, then restart")
    return FatalError(f"{what}: {type(exc).__name__}: {message}.",
                      fix="fix the cause named above, then restart")


def _row_converter(
    txn_id: str, columns: Sequence[Column]
) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """Prefix rows with the txn id; turn values sqlite3 cannot store into text."""
    needs = [i for i, c in enumerate(columns)
             if c.type in ("timestamp", "timestamp_ntz", "date") or c.type.startswith("decimal")]
    if not needs:
        return lambda row: (txn_id, *row)

    def convert(row: Sequence[Any]) -> tuple[Any, ...]:
        values = list(row)
        for i in needs:
            values[i] = _to_text(values[i])
        return (txn_id, *values)

    return convert


def _to_text(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    return value

