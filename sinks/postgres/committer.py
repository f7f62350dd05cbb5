"""The driver side: :class:`PostgresCommitter` commits and aborts one batch's transactions,
lists the namespace's transactions in doubt and purges old markers, all on its pooled sessions.

Autocommit sessions are pooled for the committer's life (:class:`twophase.kit.sql.ConnectionPool`):
a batch of N handles opens about ``min(N, commit_parallelism)`` sessions. Commit: ``COMMIT
PREPARED``; an unknown gid (42704) is ALREADY_COMMITTED if the marker row is visible, else the
transaction is lost; either way the marker is stamped with the commit time. Abort: ``ROLLBACK
PREPARED``; an unknown gid is NOT_FOUND.

Staged (``publish="staged"``): commit publishes the handle's staged rows in one local
transaction (:class:`~sinks.postgres.staging.StagedPublisher`, whose proof is the marker it
writes); abort deletes them. ``local_commit()`` offers that publisher to a sink group
(:class:`twophase.kit.LocalCommitMember`): members of the same database then share ONE local
transaction per batch. In the prepared mode it offers nothing (None).

Keyed (``mode="keyed"``): :meth:`~PostgresCommitter.purge_tombstones` deletes tombstones past
their retention (``python -m twophase.cleanup``) without waiting on those a prepared writer
holds, and :meth:`~PostgresCommitter.tombstones` counts them (``python -m twophase.status``).

No fence: ``fence`` keeps the default (nothing). ``COMMIT PREPARED`` cannot be made
conditional on a row, and it need not be: a run commits only handles of decisions it wrote to
the state file under its epoch (a compare-and-swap that refuses a zombie), decisions are never
changed, and a commit is idempotent (the marker proves it). So a zombie can only commit what a
newer run commits too; the newer run's sweep and cleanup abort only undecided transactions of
epochs up to its own, which no zombie can decide any more. The model (tests/test_model.py)
checks this with zombies over this sink.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import TYPE_CHECKING

import psycopg

from sinks.postgres.connection import Connection
from sinks.postgres.errors import classify, lost
from sinks.postgres.keyed import count_tombstones, purge_tombstones
from sinks.postgres.prepared import gid_of, gid_of_handle, prepared_in, resolve
from sinks.postgres.staging import StagedPublisher, delete_staged, staged_in
from twophase import AbortOutcome, CommitOutcome, Handle
from twophase.kit import validate_namespace
from twophase.kit.sql import PooledCommitter

if TYPE_CHECKING:
    from sinks.postgres.sink import PostgresSink

log = logging.getLogger(__name__)


class PostgresCommitter(PooledCommitter[Connection]):
    """The driver side of :class:`~sinks.postgres.PostgresSink` in one process: commits,
    aborts, lists in doubt, purges."""

    sink: PostgresSink

    def __init__(self, sink: PostgresSink) -> None:
        super().__init__(sink, sink.server.pool(sink.commit_parallelism), classify,
                         psycopg.Error, sink.server.on)

    def local_commit(self) -> StagedPublisher | None:
        """The staged mode's publisher (a :class:`twophase.kit.LocalCommitMember`); None in
        the prepared mode (``COMMIT PREPARED`` cannot join another transaction)."""
        return StagedPublisher(self) if self.sink.publish == "staged" else None

    def commit(self, handle: Handle) -> CommitOutcome:
        if (publisher := self.local_commit()) is not None:
            with publisher.local_transaction() as conn:
                return publisher.settle_in(conn, [handle])[handle.txn_id]
        gid = gid_of_handle(handle)
        with self.session(f"commit of transaction {handle.txn_id} (gid {gid})") as conn:
            outcome = CommitOutcome.COMMITTED
            if not resolve(conn, "COMMIT", gid):
                if not self.sink.markers.visible(conn, handle.txn_id):
                    raise lost(handle, gid, where=self.sink.where,
                               markers=str(self.sink.markers.table))
                outcome = CommitOutcome.ALREADY_COMMITTED
            self.sink.markers.stamp(conn, handle.txn_id)
            return outcome

    def abort(self, handle: Handle) -> AbortOutcome:
        if self.sink.publish == "staged":
            return self._abort_staged(handle)
        gid = gid_of_handle(handle)
        with self.session(f"abort of transaction {handle.txn_id} (gid {gid})") as conn:
            if resolve(conn, "ROLLBACK", gid):
                return AbortOutcome.ABORTED
            if self.sink.markers.visible(conn, handle.txn_id):
                log.warning("abort of %s: it is committed already, nothing to roll back",
                            handle.txn_id)
            return AbortOutcome.NOT_FOUND

    def _abort_staged(self, handle: Handle) -> AbortOutcome:
        with self.session(f"abort of staged transaction {handle.txn_id}") as conn:
            if delete_staged(conn, self.sink.staging, handle.txn_id):
                return AbortOutcome.ABORTED
            if self.sink.markers.visible(conn, handle.txn_id):
                log.warning("abort of %s: it is published already, nothing to delete",
                            handle.txn_id)
            return AbortOutcome.NOT_FOUND

    def list_in_doubt(self, namespace: str) -> list[Handle]:
        """The namespace's prepared transactions in this database (staged: its transactions
        with staged rows); see the sink's module docstring for why unprepared ones are never
        listed."""
        sink = self.sink
        if sink.publish == "staged":
            with self.session(f"listing staged transactions of namespace {namespace!r}") as conn:
                staged = staged_in(conn, sink.staging, namespace)
            return [sink.handle(txn_id, rows=0, columns=[]) for txn_id in staged]
        with self.session(f"listing prepared transactions of namespace {namespace!r}") as conn:
            txn_ids = prepared_in(conn, namespace)
        return [sink.handle(txn_id, rows=0, gid=gid_of(txn_id)) for txn_id in txn_ids]

    def purge_commit_records(self, namespace: str, older_than: dt.datetime) -> int:
        """Delete this table's markers of ``namespace`` stamped committed before
        ``older_than`` (see :mod:`sinks.postgres.markers`)."""
        validate_namespace(namespace)
        with self.session(f"purging commit markers of namespace {namespace!r}") as conn:
            purged = self.sink.markers.purge(conn, namespace, older_than, target=self.sink.target)
        log.info("purged %d commit markers of namespace %s older than %s",
                 purged, namespace, older_than)
        return purged

    def purge_tombstones(self, older_than: dt.datetime) -> int:
        """Keyed: delete the tombstones of deletes applied before ``older_than`` (naive: UTC);
        how many. Other modes keep none: 0."""
        if self.sink.keyed is None:
            return 0
        with self.session(f"purge of tombstones in {self.sink.tombstones}") as conn:
            purged = purge_tombstones(conn, self.sink.tombstones, older_than)
        log.info("purged %d tombstones of %s older than %s", purged, self.sink.target,
                 older_than)
        return purged

    def tombstones(self) -> tuple[int, dt.datetime | None]:
        """Keyed: how many tombstones there are, and when the oldest one's delete was applied
        (None without any). Other modes: ``(0, None)``."""
        if self.sink.keyed is None:
            return 0, None
        with self.session(f"count of tombstones in {self.sink.tombstones}") as conn:
            return count_tombstones(conn, self.sink.tombstones)
