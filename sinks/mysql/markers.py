"""The marker row: one per branch, written inside it, the proof that it committed.

The server answers a second ``XA COMMIT``, an ``XA ROLLBACK`` after commit and an unknown xid
all with 1397 XAER_NOTA; the marker row in ``_twophase_xa_markers`` (same database) tells them
apart: visible means committed, absent (and the xid not in ``XA RECOVER``) means rolled back or
lost. It also keeps empty partitions from being read-only XA transactions, whose commit fails
with 1402. Its ``committed_at`` is stamped by the committing process, and
``purge_commit_records`` deletes markers committed before a cutoff.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import pymysql

from sinks.mysql.connection import Connection, query
from sinks.mysql.encoding import utc_naive
from sinks.mysql.errors import marker_error
from sinks.mysql.schema import Table
from twophase import TxnId

DEFAULT_MARKER_TABLE = "_twophase_xa_markers"
PURGE_CHUNK = 1_000


@dataclass(frozen=True)
class Markers:
    """The statements on one marker table."""

    table: Table

    def insert(self, conn: Connection, txn_id: TxnId, *, target: Table, rows: int,
               where: str) -> None:
        """Write the branch's marker (inside the branch); refuses an id used once before."""
        created = utc_naive(dt.datetime.fromtimestamp(txn_id.created, dt.UTC))
        try:
            query(conn, f"INSERT INTO {self.table} (txn_id, namespace, target_table, row_count, "
                        "created_at, prepared_at) VALUES (%s, %s, %s, %s, %s, UTC_TIMESTAMP(6))",
                  (str(txn_id), txn_id.namespace, str(target), rows, created))
        except pymysql.err.MySQLError as exc:
            error = marker_error(exc, txn_id, where=where, markers=str(self.table))
            if error is None:
                raise
            raise error from exc

    def visible(self, conn: Connection, txn_id: TxnId) -> bool:
        return bool(query(conn, f"SELECT 1 FROM {self.table} WHERE txn_id = %s",
                          (str(txn_id),)))

    def stamp(self, conn: Connection, txn_id: TxnId) -> None:
        query(conn, f"UPDATE {self.table} SET committed_at = UTC_TIMESTAMP(6) "
                    "WHERE txn_id = %s AND committed_at IS NULL", (str(txn_id),))

    def purge(self, conn: Connection, namespace: str, older_than: dt.datetime) -> int:
        """Delete the namespace's markers committed before ``older_than`` (naive = UTC).

        Reads candidates with a non-locking read, then deletes them one primary key at a time:
        any DELETE that scans (even ``WHERE txn_id IN (...)`` on a small table) waits for the
        row locks that prepared branches hold on their own, invisible, marker rows.
        """
        ids = [(row[0],) for row in query(
            conn, f"SELECT txn_id FROM {self.table} WHERE namespace = %s AND committed_at < %s",
            (namespace, utc_naive(older_than)))]
        for start in range(0, len(ids), PURGE_CHUNK):
            conn.begin()
            with conn.cursor() as cursor:
                cursor.executemany(f"DELETE FROM {self.table} WHERE txn_id = %s",
                                   ids[start:start + PURGE_CHUNK])
            conn.commit()
        return len(ids)
