"""A PostgreSQL sink as a newcomer wrote it from twophase 0.1.0's README ("Writing your own
sink", commit 8da4bfe), kept unchanged: tests/test_compat.py runs it and its tests
(``compat_checks.py``) against the current code.

It uses what 0.1.0 offered: ``twophase.kit.CommitsViaCommitter`` (commit and abort of one handle
through a fresh committer) listed before ``TwoPhaseCommitSink``, a ``twophase.Committer`` of its
own holding one connection for a batch, the kit's ``check_columns``, ``namespace_from``,
``transaction_lost`` and ``transaction_id_reused``, and the optional methods ``check_schema``,
``discard``, ``default_namespace`` and ``purge_commit_records``. Each transaction is
``PREPARE TRANSACTION`` with a marker row naming its id, which proves a commit later.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from twophase import (
    AbortOutcome,
    Column,
    CommitOutcome,
    Committer,
    Handle,
    TransactionContext,
    TwoPhaseCommitSink,
    TxnId,
)
from twophase.errors import RetryableError
from twophase.kit import (
    CommitsViaCommitter,
    TableColumn,
    check_columns,
    namespace_from,
    transaction_id_reused,
    transaction_lost,
)


@dataclass
class PgTxn:
    """An open transaction: its connection and id."""

    conn: psycopg.Connection[Any]
    txn_id: TxnId
    rows: int = 0


class MyPgSink(CommitsViaCommitter, TwoPhaseCommitSink[PgTxn]):
    """Rows into ``table``; a marker per transaction in ``<table>_markers``."""

    kind = "my_pg"

    def __init__(self, table: str, **connect: Any) -> None:
        self.table = table
        self.connect = connect

    @property
    def markers(self) -> str:
        return f"{self.table}_markers"

    def open(self, *, autocommit: bool = False) -> psycopg.Connection[Any]:
        try:
            conn = psycopg.connect(**self.connect, autocommit=autocommit)
        except psycopg.OperationalError as error:
            raise RetryableError(f"cannot reach PostgreSQL: {error}",
                                 fix="check that the server is up") from error
        conn.execute("SET TIME ZONE 'UTC'")
        if not autocommit:
            conn.commit()
        return conn

    def default_namespace(self) -> str:
        return namespace_from(self.table, self.kind)

    def check_schema(self, columns: Sequence[Column]) -> None:
        with self.open(autocommit=True) as conn:
            found = conn.execute(
                "SELECT column_name, is_nullable = 'NO' AND column_default IS NULL, "
                "data_type = 'timestamp with time zone' FROM information_schema.columns "
                "WHERE table_name = %s ORDER BY ordinal_position", (self.table,)).fetchall()
            conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (txn_id text PRIMARY KEY, "
                                 "committed_at timestamptz)")
                         .format(sql.Identifier(self.markers)))
        table = [TableColumn(name, required, zoned) for name, required, zoned in found]
        check_columns(f"table {self.table}", table, columns)

    def begin_transaction(self, ctx: TransactionContext) -> PgTxn:
        return PgTxn(self.open(), ctx.txn_id)

    def write(self, txn: PgTxn, rows: Iterable[Sequence[Any]]) -> None:
        statement = sql.SQL("INSERT INTO {} (event_id, order_id, status, ts) "
                            "VALUES (%s, %s, %s, %s)").format(sql.Identifier(self.table))
        batch = [tuple(row) for row in rows]
        with txn.conn.cursor() as cursor:
            cursor.executemany(statement, batch)
        txn.rows += len(batch)

    def pre_commit(self, txn: PgTxn) -> Handle:
        try:
            txn.conn.execute(sql.SQL("INSERT INTO {} (txn_id) VALUES (%s)")
                             .format(sql.Identifier(self.markers)), (str(txn.txn_id),))
        except psycopg.errors.UniqueViolation as error:
            txn.conn.close()
            raise transaction_id_reused(txn.txn_id, where=f"table {self.table}") from error
        txn.conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(str(txn.txn_id))))
        txn.conn.close()
        return self.handle(txn.txn_id, txn.rows)

    def discard(self, txn: PgTxn) -> None:
        txn.conn.close()  # an unprepared transaction ends with its connection

    def list_in_doubt(self, namespace: str) -> list[Handle]:
        with self.open(autocommit=True) as conn:
            gids = conn.execute("SELECT gid FROM pg_prepared_xacts WHERE database = "
                                "current_database() AND starts_with(gid, %s) ORDER BY gid",
                                (f"{namespace}.",)).fetchall()
        return [self.handle(TxnId.parse(gid), 0) for (gid,) in gids]

    def purge_commit_records(self, namespace: str, older_than: datetime) -> int:
        with self.open(autocommit=True) as conn:
            purged = conn.execute(sql.SQL("DELETE FROM {} WHERE starts_with(txn_id, %s) AND "
                                          "committed_at < %s").format(
                sql.Identifier(self.markers)), (f"{namespace}.", older_than))
            return purged.rowcount

    def committer(self) -> Committer:
        return MyPgCommitter(self)


class MyPgCommitter(Committer):
    """One connection for a batch's commits (psycopg serializes the threads' statements)."""

    sink: MyPgSink

    def __init__(self, sink: MyPgSink) -> None:
        super().__init__(sink)
        self.lock = threading.Lock()
        self.conn: psycopg.Connection[Any] | None = None

    def connection(self) -> psycopg.Connection[Any]:
        with self.lock:
            if self.conn is None:
                self.conn = self.sink.open(autocommit=True)
            return self.conn

    def commit(self, handle: Handle) -> CommitOutcome:
        conn, gid = self.connection(), str(handle.txn_id)
        try:
            conn.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(gid)))
            outcome = CommitOutcome.COMMITTED
        except psycopg.errors.UndefinedObject:  # no such prepared transaction
            outcome = CommitOutcome.ALREADY_COMMITTED
        stamped = conn.execute(sql.SQL("UPDATE {} SET committed_at = coalesce(committed_at, "
                                       "now()) WHERE txn_id = %s").format(
            sql.Identifier(self.sink.markers)), (gid,))
        if stamped.rowcount == 0:
            raise transaction_lost(handle, where=f"table {self.sink.table}",
                                   why="it is neither prepared nor marked committed")
        return outcome

    def abort(self, handle: Handle) -> AbortOutcome:
        try:
            self.connection().execute(sql.SQL("ROLLBACK PREPARED {}")
                                      .format(sql.Literal(str(handle.txn_id))))
        except psycopg.errors.UndefinedObject:
            return AbortOutcome.NOT_FOUND
        return AbortOutcome.ABORTED

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()

