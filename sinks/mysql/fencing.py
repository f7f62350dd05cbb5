"""Fencing (``fencing=True``, opt-in, Estuary's pattern): a zombie run commits nothing.

A row per (namespace, query) in ``_twophase_xa_fence`` holds the epoch of the newest run. The
driver's committer raises it at run start (:meth:`Fence.claim`, refusing a run older than the
row) and remembers the epoch it claimed. Every commit through that committer then, on a second
connection, takes a shared lock on the row, checks that it still holds the claimed epoch, runs
``XA COMMIT``, and only then releases the lock (:meth:`Fence.held`). An abort does the same
when the committer claimed an epoch for the query (a zombie run cannot abort either); a
committer that never claimed one (cleanup of orphans) may abort, but never commit.

``XA COMMIT`` itself cannot be made conditional, but a newer run's claim must take the row's
exclusive lock, so it waits for commits already past their check, and every later check sees
the new epoch: once a claim has returned, no older run commits or aborts anything. Remaining
window: the server closes the lock connection after ``FENCE_LOCK_IDLE_TIMEOUT_S`` of inactivity
(so a dead zombie host cannot block a takeover for long); a zombie that stalls longer than that
between its check and its ``XA COMMIT`` can still commit after the takeover. That case is
detected afterwards (the lock connection is gone when it is released) and logged as an error.
Fencing guards commit and abort through this sink only; anyone else with XA rights on the
server can still resolve our branches, and the rows a zombie prepares stay prepared
(invisible) until the newer run's sweep or cleanup aborts them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pymysql

from sinks.mysql.connection import Connection, close_quietly, query
from sinks.mysql.schema import Table
from twophase import FencedError

log = logging.getLogger(__name__)

DEFAULT_FENCE_TABLE = "_twophase_xa_fence"
FENCE_LOCK_IDLE_TIMEOUT_S = 30

#: (namespace, query key): the fence row of one query.
FenceKey = tuple[str, str]


@dataclass(frozen=True)
class Fence:
    """The statements on one fence table of the server at ``address``."""

    table: Table
    address: str

    def claim(self, conn: Connection, key: FenceKey, epoch: int) -> None:
        """Raise the row to ``epoch``; FencedError if it holds a newer one already."""
        conn.begin()
        query(conn, f"INSERT INTO {self.table} (namespace, query, epoch, fenced_at) "
                    "VALUES (%s, %s, %s, UTC_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE "
                    "fenced_at = IF(epoch < %s, UTC_TIMESTAMP(6), fenced_at), "
                    "epoch = GREATEST(epoch, %s)", (*key, epoch, epoch, epoch))
        current = self._epoch(conn, key, lock=False)
        conn.commit()
        if current > epoch:
            raise self.fenced(key, epoch, current)
        log.info("fenced query %s of namespace %s at epoch %d", key[1], key[0], epoch)

    @contextlib.contextmanager
    def held(self, lock: Connection, key: FenceKey, mine: int, what: str) -> Iterator[None]:
        """Hold a shared lock on the row, checked to be at ``mine``, around an XA statement."""
        lock.begin()
        current = self._epoch(lock, key, lock=True)
        if current != mine:
            raise self.fenced(key, mine, current)
        yield
        try:
            lock.commit()
        except pymysql.err.MySQLError:
            log.error("%s: the fence lock was lost before the XA statement finished; a newer "
                      "run may have taken over meanwhile", what)
            close_quietly(lock)  # never lent again

    def fenced(self, key: FenceKey, mine: int, current: int) -> FencedError:
        namespace, query_key = key
        return FencedError(
            f"run with epoch {mine} of query {query_key} (namespace {namespace!r}) is fenced: "
            f"{self.table} on {self.address} is at epoch {current}, so a newer run took over "
            "(or this run's state file was restored from an older copy).",
            fix="stop this run; the newer run finishes every decided batch. Only if no other "
            f"run is alive: DELETE FROM {self.table} WHERE namespace = '{namespace}' AND "
            f"query = '{query_key}'",
        )

    def _epoch(self, conn: Connection, key: FenceKey, *, lock: bool) -> int:
        rows = query(conn, f"SELECT epoch FROM {self.table} WHERE namespace = %s AND query = %s"
                           + (" LOCK IN SHARE MODE" if lock else ""), key)
        return int(rows[0][0]) if rows else 0
