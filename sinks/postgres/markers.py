"""The marker row: one per transaction, written inside it, the proof that it committed.

``COMMIT PREPARED`` of a gid the server does not know (42704) cannot tell "committed" from
"rolled back"; the marker row in ``_twophase_markers`` (beside the target) can: visible means
committed, absent (and the gid not in ``pg_prepared_xacts``) means rolled back or lost.

Its time: the row is written before anyone knows when it will commit, so it records when the
transaction was opened and prepared, and the committing process stamps ``committed_at`` once
``COMMIT PREPARED`` (or a repeated commit that proved it) returned. A purge deletes only rows
*stamped* before the cutoff: a batch decided long before it was committed (a driver down for
a day) keeps its proof for the whole retention after its commit, and a row without a stamp
(committed by a process that died before stamping: its recovery stamps it) is never purged.
Rows of transactions still prepared are invisible to the purge, so it never waits on them.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import psycopg

from sinks.postgres.connection import Connection
from sinks.postgres.errors import marker_error
from sinks.postgres.schema import Table
from twophase import TxnId
from twophase.kit import as_utc

DEFAULT_MARKER_TABLE = "_twophase_markers"


@dataclass(frozen=True)
class Markers:
    """The statements on one marker table."""

    table: Table

    def insert(self, conn: Connection, txn_id: TxnId, *, target: Table, rows: int,
               where: str, committed: bool = False) -> None:
        """Write the transaction's marker (inside it); refuses an id used once before.
        ``committed``: written by the transaction that publishes it (the staged mode), so
        stamped committed at once."""
        created = dt.datetime.fromtimestamp(txn_id.created, dt.UTC)
        try:
            conn.execute(self._sql("INSERT INTO {} (txn_id, namespace, target_table, row_count, "
                                   "created_at, committed_at) VALUES (%s, %s, %s, %s, %s, "
                                   + ("now()" if committed else "NULL") + ")"),
                         (str(txn_id), txn_id.namespace, str(target), rows, created))
        except psycopg.Error as exc:
            error = marker_error(exc, txn_id, where=where, markers=str(self.table))
            if error is None:
                raise
            raise error from exc

    def visible(self, conn: Connection, txn_id: TxnId) -> bool:
        return conn.execute(self._sql("SELECT 1 FROM {} WHERE txn_id = %s"),
                            (str(txn_id),)).fetchone() is not None

    def stamp(self, conn: Connection, txn_id: TxnId) -> None:
        """Record the commit time (first commit or proof of it wins)."""
        conn.execute(self._sql("UPDATE {} SET committed_at = now() "
                               "WHERE txn_id = %s AND committed_at IS NULL"), (str(txn_id),))

    def purge(self, conn: Connection, namespace: str, older_than: dt.datetime, *,
              target: Table) -> int:
        """Delete the markers of ``namespace`` and ``target`` stamped committed before
        ``older_than`` (naive: UTC)."""
        cursor = conn.execute(self._sql("DELETE FROM {} WHERE namespace = %s AND "
                                        "target_table = %s AND committed_at < %s"),
                              (namespace, str(target), as_utc(older_than)))
        return cursor.rowcount

    def statement(self, statement: str) -> psycopg.sql.Composed:
        """``statement`` with ``{}`` the marker table."""
        return self._sql(statement)

    def _sql(self, statement: str) -> psycopg.sql.Composed:
        return psycopg.sql.SQL(statement).format(self.table.ident)
