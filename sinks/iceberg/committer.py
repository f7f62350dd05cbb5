"""The driver's side of :class:`~sinks.iceberg.IcebergSink`: one snapshot per batch, proven.

**A batch, one snapshot** (:class:`~twophase.kit.WholeBatchCommitter`): the driver commits a
batch's stage with ONE settle, every handle's files in ONE fast-append snapshot
(:mod:`~sinks.iceberg.snapshots`); ``finish_batch`` deletes the batch's intents. A handle
committed on its own (the contract suite) is a batch of one.

**COMMITTED or ALREADY_COMMITTED.** The table is loaded again (the catalog's current
metadata) and, on that one loaded version, the proof (:func:`~sinks.iceberg.snapshots.proof`)
says which handles are in: those are ALREADY_COMMITTED; the others are COMMITTED by one
snapshot built on the same version, in one conditional catalog attempt (a racing committer's
attempt fails the compare-and-swap: retried, the retry finds the proof). Before it, every file
of the handles it adds must still exist and be younger than ``orphan_age`` (Iceberg's
``remove_orphan_files`` deletes unreferenced files older than that, 3 days by default): else
the handle is lost, :class:`~twophase.TransactionLostError` naming the batch and the file,
and nothing of the batch is added.

**Abort** deletes the transaction's files (those its handle lists and those its intent names),
then its intent, unless the proof holds (a committed transaction: NOT_FOUND with a warning).

**In doubt**: the transactions of the namespace with an intent, i.e. with files no snapshot
was proven to add. One whose batch is above its app id's property was never committed (no
walk); the others are decided by the proof (the files their snapshots added, never the
current snapshot's files: after a ``rewrite_data_files`` a committed file leaves the current
snapshot, and the sweep runs every batch); one proven committed has its intent deleted on
sight. Cost: one listing of the namespace's intents, one read per intent, one table load, and
the walk of the snapshots made since the batch's predecessor; never a listing of the data
area, never the table's history.

**Deadline**: ``commit_deadline`` is the oldest file's creation + ``orphan_age``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from sinks.iceberg import keyed as keyed_lake
from sinks.iceberg import snapshots
from sinks.iceberg.errors import classify
from sinks.iceberg.files import IcebergFile
from sinks.iceberg.local_commit import IcebergLocalCommit, offer
from twophase import CommitOutcome, Handle, TxnId
from twophase.kit import classified
from twophase.kit.lake import LakeCleanup, LakeCommitter, lake_deadline, plan_batch, proof_key

if TYPE_CHECKING:
    from sinks.iceberg.sink import IcebergSink

log = logging.getLogger(__name__)

#: A query's batch: the app id and the batch id.
BatchKey = tuple[str, int]


class IcebergCommitter(LakeCommitter):
    """Commits, proves and aborts :class:`~sinks.iceberg.IcebergSink` transactions in one
    process (see the module docstring)."""

    sink: IcebergSink

    def __init__(self, sink: IcebergSink) -> None:
        super().__init__(sink)
        self._table_lock = threading.RLock()
        self._table: Table | None = None

    def batch_key(self, txn_id: TxnId) -> BatchKey:
        return snapshots.app_id_of(txn_id), txn_id.batch

    @contextlib.contextmanager
    def _latest(self) -> Iterator[Table]:
        """The table's current version, loaded now (one user at a time): the proof and the
        commit that follows it are made on this one version."""
        with self._table_lock:
            if self._table is None:
                self._table = self.sink.load_table()
            else:
                self._table = self._table.refresh()
            yield self._table

    def _uris(self, handle: Handle) -> list[str]:
        return [self.sink.storage.uri(data_file.path) for data_file in self.sink.files_in(handle)]

    # -- a batch, one snapshot --------------------------------------------------------------------

    def settle(self, handles: tuple[Handle, ...]) -> dict[TxnId, CommitOutcome]:
        """Prove or commit ``handles`` (one query's batch) in one snapshot on one version."""
        batch = handles[0].txn_id.batch
        with classified(classify, f"commit of batch {batch} ({len(handles)} transactions) "
                        f"to {self.sink.where}", self.sink.errors_caught), \
                self._latest() as table:
            return self.settle_on(table, handles)

    def settle_on(self, table: Table, handles: Sequence[Handle]
                  ) -> dict[TxnId, CommitOutcome]:
        """Prove or commit ``handles`` (one query's batch) on the loaded ``table``: those the
        proof holds are ALREADY_COMMITTED, the others COMMITTED by ONE snapshot built on the
        same version (through ``table``'s catalog: its own, or a group's local transaction,
        :mod:`~sinks.iceberg.local_commit`). Errors: the caller classifies them."""
        if self.sink.keyed is not None:
            return self._settle_keyed_on(table, handles)
        app_id, batch = self.batch_key(handles[0].txn_id)
        proof = snapshots.proof(table, app_id, batch)
        proven = [handle for handle in handles
                  if not self.sink.files_in(handle) or proof.holds(batch, self._uris(handle))]
        pending = [handle for handle in handles if handle not in proven]
        if pending:
            files = [self._addable(table, handle, data_file) for handle in pending
                     for data_file in self.sink.files_in(handle)]
            snapshots.commit(table, files, app_id=app_id, batch=batch,
                             transactions=len(pending), last=proof.last)
            log.debug("committed batch %d of %s: %d files in one snapshot", batch, app_id,
                      len(files))
        outcomes = {handle.txn_id: CommitOutcome.ALREADY_COMMITTED for handle in proven}
        outcomes.update({handle.txn_id: CommitOutcome.COMMITTED for handle in pending})
        return outcomes

    def _settle_keyed_on(self, table: Table, handles: Sequence[Handle]
                         ) -> dict[TxnId, CommitOutcome]:
        """Keyed: prove each handle by its partition's property, or apply the others' staged
        changes in one catalog commit raising their properties (:mod:`~sinks.iceberg.keyed`)."""
        keyed = self.sink.keyed
        assert keyed is not None
        app_id, batch = self.batch_key(handles[0].txn_id)
        pending = [handle for handle in handles if self.sink.staged_in(handle)
                   and keyed_lake.proven_batch(table, proof_key(app_id, handle.txn_id)) < batch]
        if pending:
            schema = table.schema().as_arrow()
            changes = self.staged_changes(pending, schema)
            tombstones = self.sink.tombstone_table
            plan = plan_batch(keyed, changes, keyed_lake.row_versions(table, keyed, changes),
                              tombstones.versions(changes))
            tombstones.write(plan)
            keyed_lake.apply_batch(
                table, keyed, plan, schema,
                proofs={proof_key(app_id, handle.txn_id): batch for handle in pending},
                summary={keyed_lake.SUMMARY_KEYED_APP: app_id,
                         keyed_lake.SUMMARY_KEYED_BATCH: str(batch)}, where=self.sink.where)
            log.debug("applied batch %d of %s: %d of %d changes newer", batch, app_id,
                      plan.applied.num_rows, changes.num_rows)
        outcomes = {handle.txn_id: CommitOutcome.ALREADY_COMMITTED for handle in handles}
        outcomes.update({handle.txn_id: CommitOutcome.COMMITTED for handle in pending})
        return outcomes

    def _addable(self, table: Table, handle: Handle, data_file: IcebergFile) -> DataFile:
        """The file as its snapshot adds it, checked: still there, younger than orphan_age."""
        cleanup = LakeCleanup("an orphan-file cleanup", "snapshot",
                              f"orphan_age ({self.sink.orphan_age_s:.0f} s)",
                              self.sink.orphan_age_s)
        self.check_addable(handle, data_file.path, created_ms=data_file.created,
                           cleanup=cleanup)
        return snapshots.data_file(table, data_file, self.sink.storage.uri(data_file.path))

    def local_commit(self) -> IcebergLocalCommit | None:
        """The batch's snapshot swapped in by a local transaction of the SQL catalog's database,
        shared with a sink group's other members there (:mod:`~sinks.iceberg.local_commit`)."""
        return offer(self)

    # -- the proof, deadlines --------------------------------------------------------------------

    def committed_among(self, found: Mapping[TxnId, Sequence[str]]) -> set[TxnId]:
        """Those of ``found`` whose files the snapshots of their batch added: one table load,
        one walk per app id (from its oldest batch among them)."""
        if self.sink.keyed is not None:
            with self._latest() as table:
                return {txn_id for txn_id in found if keyed_lake.proven_batch(
                    table, proof_key(snapshots.app_id_of(txn_id), txn_id)) >= txn_id.batch}
        storage = self.sink.storage
        oldest: dict[str, int] = {}
        for txn_id in found:
            app_id = snapshots.app_id_of(txn_id)
            oldest[app_id] = min(oldest.get(app_id, txn_id.batch), txn_id.batch)
        with self._latest() as table:
            proofs = {app_id: snapshots.proof(table, app_id, batch)
                      for app_id, batch in oldest.items()}
        return {txn_id for txn_id, paths in found.items()
                if proofs[snapshots.app_id_of(txn_id)].holds(
                    txn_id.batch, [storage.uri(path) for path in paths])}

    def commit_deadline(self, handle: Handle) -> float | None:
        """When an orphan-file cleanup may delete the handle's oldest file (its creation +
        ``orphan_age``); None for an empty partition, and for the keyed mode's staged files
        (orphan removal skips ``_`` folders)."""
        if self.sink.keyed is not None:
            return None
        return lake_deadline((data_file.created for data_file in self.sink.files_in(handle)),
                             self.sink.orphan_age_s)
