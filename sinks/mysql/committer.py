"""The driver side: :class:`MySQLCommitter` commits and aborts one batch's branches, lists the
namespace's branches in doubt and purges old markers, all on its pooled connections.

The driver opens one committer per batch (and per recovery or cleanup pass), claims the run's
epoch once per query (:meth:`MySQLCommitter.fence`, with ``fencing=True``), then commits or
aborts every handle from up to ``commit_parallelism`` threads. Connections are pooled for the
committer's life: a thread borrows one per commit and gives it back, so a batch of N handles
opens about ``min(N, commit_parallelism)`` connections instead of N (and as many again for the
fence locks). A connection that saw an error is closed, never lent again; ``close()`` closes
the rest. What the committer claimed when fencing lives here, never on the pickled sink.

Commit: ``XA COMMIT``; a 1397 (unknown xid) is ALREADY_COMMITTED if the marker row is visible,
else the branch is lost. Abort: ``XA ROLLBACK``; a 1397 is NOT_FOUND. Both wait for a branch
whose writer's session is still ending (:func:`sinks.mysql.xa.resolve`).

``mode="keyed"``'s tombstones are counted (:meth:`MySQLCommitter.tombstones`, for
``twophase.status``) and purged (:meth:`MySQLCommitter.purge_tombstones`, for
``twophase.cleanup``) here too; the purge's own session waits at most
``PURGE_LOCK_WAIT_S`` for a tombstone a prepared branch holds, and leaves it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

import pymysql

from sinks.mysql.connection import Connection, pool
from sinks.mysql.errors import ROLLED_BACK, classify, error_code, lost
from sinks.mysql.fencing import FENCE_LOCK_IDLE_TIMEOUT_S, FenceKey
from sinks.mysql.xa import Xid, prepared_in, resolve
from twophase import (
    AbortOutcome,
    CommitOutcome,
    ConfigurationError,
    Handle,
    TransactionLostError,
    TxnId,
)
from twophase.kit import classified, query_key, validate_namespace
from twophase.kit.sql import PooledCommitter

if TYPE_CHECKING:
    from sinks.mysql.sink import MySQLXASink

log = logging.getLogger(__name__)

#: The lock wait of the session that purges tombstones (``innodb_lock_wait_timeout``).
PURGE_LOCK_WAIT_S = 1


class MySQLCommitter(PooledCommitter[Connection]):
    """The driver side of :class:`~sinks.mysql.MySQLXASink` in one process: fences, commits,
    aborts, lists in doubt, purges."""

    sink: MySQLXASink

    def __init__(self, sink: MySQLXASink) -> None:
        server, size = sink.server, sink.commit_parallelism
        super().__init__(sink, pool(server.connect, size=size), classify,
                         pymysql.err.MySQLError, server.on)
        self._locks = pool(
            functools.partial(server.connect, idle_timeout_s=FENCE_LOCK_IDLE_TIMEOUT_S),
            size=size, max_idle_s=FENCE_LOCK_IDLE_TIMEOUT_S / 2)
        self._claimed: dict[FenceKey, int] = {}

    def fence(self, namespace: str, query_id: str, epoch: int) -> None:
        """Claim ``epoch`` for the query (FencedError if a newer run did); commits and aborts
        of its branches through this committer then check the claim. Waits for commits of older
        runs that are past their check. Does nothing unless ``fencing=True``."""
        key = (validate_namespace(namespace), query_key(query_id))
        if not self.sink.fencing:
            log.debug("fencing is off for %r: not fencing query %s", self.sink, key[1])
            return
        with self.session(f"fencing query {key[1]} of namespace {namespace!r}") as conn:
            self.sink.fences.claim(conn, key, epoch)
        self._claimed[key] = epoch

    def commit(self, handle: Handle) -> CommitOutcome:
        xid = Xid.of_handle(handle)
        what = f"commit of transaction {handle.txn_id} (xid {xid})"
        with self._fenced(handle.txn_id, what, required=True), self.session(what) as conn:
            try:
                resolved = resolve(conn, "COMMIT", xid, where=self.sink.server.address)
            except pymysql.err.MySQLError as exc:
                if error_code(exc) in ROLLED_BACK:
                    raise self._lost(handle, xid, f"the server rolled it back ({exc})") from exc
                raise
            outcome = CommitOutcome.COMMITTED
            if not resolved:  # 1397: already committed (marker visible) or lost
                if not self.sink.markers.visible(conn, handle.txn_id):
                    raise self._lost(handle, xid,
                                     "XA RECOVER does not list it and its marker row is absent")
                outcome = CommitOutcome.ALREADY_COMMITTED
            self.sink.markers.stamp(conn, handle.txn_id)
            return outcome

    def abort(self, handle: Handle) -> AbortOutcome:
        xid = Xid.of_handle(handle)
        what = f"abort of transaction {handle.txn_id} (xid {xid})"
        with self._fenced(handle.txn_id, what, required=False), self.session(what) as conn:
            if resolve(conn, "ROLLBACK", xid, where=self.sink.server.address):
                return AbortOutcome.ABORTED
            if self.sink.markers.visible(conn, handle.txn_id):
                log.warning("abort of %s: it is committed already, nothing to roll back",
                            handle.txn_id)
            return AbortOutcome.NOT_FOUND

    def list_in_doubt(self, namespace: str) -> list[Handle]:
        """The namespace's prepared branches (``XA RECOVER`` by our gtrid prefix)."""
        with self.session(f"listing in-doubt XA branches of namespace {namespace!r}") as conn:
            xids = prepared_in(conn, namespace)
        return [self.sink.handle(xid.txn_id(), rows=0, gtrid=xid.gtrid, bqual=xid.bqual)
                for xid in xids]

    def purge_commit_records(self, namespace: str, older_than: dt.datetime) -> int:
        """Delete markers of ``namespace`` committed before ``older_than`` (naive = UTC)."""
        validate_namespace(namespace)
        with self.session(f"purging commit markers of namespace {namespace!r}") as conn:
            purged = self.sink.markers.purge(conn, namespace, older_than)
        log.info("purged %d commit markers of namespace %s older than %s",
                 purged, namespace, older_than)
        return purged

    def tombstones(self) -> tuple[int, dt.datetime | None]:
        """How many tombstones ``mode="keyed"`` keeps, and when the oldest one's delete was
        applied (UTC; None without any, or in another mode)."""
        tables = self.sink.keyed_tables
        if tables is None:
            return 0, None
        with self.session(f"counting the tombstones in {tables.tombstones}") as conn:
            return tables.count(conn)

    def purge_tombstones(self, older_than: dt.datetime) -> int:
        """Delete ``mode="keyed"``'s tombstones of deletes applied before ``older_than``
        (naive = UTC); returns how many. A tombstone a prepared branch holds is left for the
        next purge (see :meth:`sinks.mysql.keyed.KeyedTables.purge`)."""
        tables = self.sink.keyed_tables
        if tables is None:
            return 0
        short_waits = replace(self.sink.server, lock_wait_timeout_s=PURGE_LOCK_WAIT_S)
        with short_waits.session(f"purging the tombstones in {tables.tombstones}") as conn:
            purged = tables.purge(conn, older_than)
        log.info("purged %d tombstones of %s older than %s", purged, tables.tombstones,
                 older_than)
        return purged

    def close(self) -> None:
        super().close()
        self._locks.close()

    @contextlib.contextmanager
    def _fenced(self, txn_id: TxnId, what: str, *, required: bool) -> Iterator[None]:
        """Hold a shared lock on the fence row, checked, around the XA COMMIT/ROLLBACK.

        ``required``: refuse if this committer never claimed an epoch for the query (commits);
        otherwise (aborts) an unclaimed query is not checked, so cleanup can abort orphans.
        """
        key = (txn_id.namespace, txn_id.query)
        mine = self._claimed.get(key)
        if not self.sink.fencing or (mine is None and not required):
            yield
            return
        if mine is None:
            raise ConfigurationError(
                f"{what}: fencing=True, but this committer never claimed an epoch for query "
                f"{key[1]} (namespace {key[0]!r}).",
                fix="commit through sink.committer() after committer.fence(namespace, "
                "query_id, epoch) with the run's epoch (the driver does)",
            )
        check = self.sink.server.on(f"fence check for {what}")
        with classified(classify, check, pymysql.err.MySQLError), \
                self._locks.connection() as lock, self.sink.fences.held(lock, key, mine, what):
            yield

    def _lost(self, handle: Handle, xid: Xid, why: str) -> TransactionLostError:
        return lost(handle, str(xid), where=self.sink.where, markers=str(self.sink.markers.table),
                    why=why)
