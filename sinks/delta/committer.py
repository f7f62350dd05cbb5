"""The driver's side of :class:`~sinks.delta.DeltaSink`: one Delta commit per batch, proven.

**A batch, one commit** (:class:`~twophase.kit.WholeBatchCommitter`): the driver commits a
batch's stage with ONE settle, every handle of the batch in ONE Delta commit; ``finish_batch``
deletes the batch's intents. A handle committed on its own (the contract suite) is a batch of
one. Every commit carries ``Transaction(app_id, batch)``.

**COMMITTED or ALREADY_COMMITTED.** On one loaded snapshot (:mod:`~sinks.delta.snapshot`):
if ``transaction_version(app_id) >= batch`` and a handle's files are referenced by the
snapshot (live files or tombstones), the handle is ALREADY_COMMITTED: that is the proof. The
others are COMMITTED by the commit built on the same snapshot; a racing commit of the same
app id fails as a concurrent transaction (retried: the retry finds the proof). Before that
commit, every file of the handles it adds must still exist and be younger than the table's
``delta.deletedFileRetentionDuration`` (VACUUM may delete an unreferenced file after it, and
re-adding a committed file whose tombstone expired would resurrect rows an OPTIMIZE
rewrote): else the handle is lost, :class:`~twophase.TransactionLostError` naming the batch
and the file, and nothing of the batch is added.

**Abort** deletes the transaction's files (those its handle lists and those its intent names,
:class:`~twophase.kit.lake.LakeIntents`), then its intent, unless the snapshot references them (a
committed transaction: then nothing is deleted, NOT_FOUND with a warning).

**In doubt** (:meth:`DeltaCommitter.list_in_doubt`): the transactions of the namespace with an
intent, i.e. with files no commit was proven to reference. One whose batch is above its app
id's ``transaction_version`` was never committed (no file list read); for the others, the
snapshot's referenced paths decide (live files and tombstones: an OPTIMIZE's rewritten files
stay referenced until their tombstones expire, so the sweep that runs every batch never
deletes committed data); a transaction proven committed has its intent deleted on sight (a
crash came between its commit and ``finish_batch``). Cost: one listing of the namespace's
intents and one read per intent (the transactions not yet settled: a batch's, normally), the
commits made since the committer last read the table (:meth:`DeltaCommitter._latest`) and one
``transaction_version`` per query; never a listing of the data area, never a walk of the
table's history.
It does not grow with the table's age: measured in docs/PERFORMANCE.md ("Delta: the proof and
the listing in doubt over 1,000 batches").

**Explicit app id** (``DeltaSink(app_id=...)``): before the first batch it decides,
``check_committable`` refuses a table that holds the app id at a version at or above the batch
without the batch's files (a new checkpoint, whose batch ids start again, given an app id a
former query used: Delta's own trap, where the batch would be dropped silently).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from deltalake.transaction import Transaction

from sinks.delta.errors import classify
from sinks.delta.files import DataFile
from sinks.delta.keyed import merge_batch, row_versions
from sinks.delta.schema import Layout
from sinks.delta.snapshot import META_APP, META_BATCH, META_TRANSACTIONS, Snapshot
from twophase import (
    CommitOutcome,
    ConfigurationError,
    Handle,
    TxnId,
)
from twophase.kit import classified
from twophase.kit.lake import LakeCleanup, LakeCommitter, lake_deadline, plan_batch, proof_key

if TYPE_CHECKING:
    from deltalake import DeltaTable

    from sinks.delta.sink import DeltaSink

log = logging.getLogger(__name__)

#: A query's batch: the app id and the batch id.
BatchKey = tuple[str, int]


class DeltaCommitter(LakeCommitter):
    """Commits, proves and aborts :class:`~sinks.delta.DeltaSink` transactions in one
    process (see the module docstring)."""

    sink: DeltaSink

    def __init__(self, sink: DeltaSink) -> None:
        super().__init__(sink)
        self._retention_s: float | None = None
        self._app_id_checked = False
        #: The table as this committer last read it (see :meth:`_latest`).
        self._table_lock = threading.RLock()
        self._table: DeltaTable | None = None
        self._holding_table = False

    def batch_key(self, txn_id: TxnId) -> BatchKey:
        return self.sink.app_id_of(txn_id), txn_id.batch

    @contextlib.contextmanager
    def _latest(self) -> Iterator[Snapshot]:
        """The table's latest version, held (one user at a time): loaded at the committer's
        first use, then brought up to date by reading only the commits made since
        (``update_incremental``), so that a batch's proof costs the same at batch 10 and at
        batch 1,000; a full load costs what the table's live files do."""
        with self._table_lock:
            if self._table is None:
                self._table = self.sink.snapshot().table
            elif not self._holding_table:
                self._table.update_incremental()
            # Inside a use (the commit's checks), the version stays the one checked: a commit
            # built on a table brought up to date after its check would pass Delta's conflict
            # check with a stale proof.
            outer, self._holding_table = self._holding_table, True
            try:
                yield Snapshot(self._table)
            finally:
                self._holding_table = outer

    # -- a batch, one commit ---------------------------------------------------------------------

    def settle(self, handles: tuple[Handle, ...]) -> dict[TxnId, CommitOutcome]:
        """Prove or commit ``handles`` (one query's batch) in one commit on one snapshot."""
        if self.sink.keyed is not None:
            return self._settle_keyed(handles)
        app_id, batch = self.batch_key(handles[0].txn_id)
        with classified(classify, f"commit of batch {batch} ({len(handles)} transactions) "
                        f"to {self.sink.where}", self.sink.errors_caught), \
                self._latest() as snapshot:
            last = snapshot.batch_of(app_id)
            proven = [handle for handle in handles
                      if self._proven(handle, snapshot, committed=last >= batch)]
            pending = [handle for handle in handles if handle not in proven]
            files = [data_file for handle in pending
                     for data_file in self._addable(handle, snapshot.retention_s())]
            if files:
                snapshot.commit(files, app_id=app_id, batch=max(last, batch),
                                transactions=[handle.txn_id for handle in pending])
        outcomes = {handle.txn_id: CommitOutcome.ALREADY_COMMITTED for handle in proven}
        outcomes.update({handle.txn_id: CommitOutcome.COMMITTED for handle in pending})
        return outcomes

    def _settle_keyed(self, handles: tuple[Handle, ...]) -> dict[TxnId, CommitOutcome]:
        """Keyed: prove each handle by its partition's app transaction, or apply the others'
        staged changes in one MERGE carrying their proofs (:mod:`~sinks.delta.keyed`)."""
        keyed = self.sink.keyed
        assert keyed is not None
        app_id, batch = self.batch_key(handles[0].txn_id)
        with classified(classify, f"keyed commit of batch {batch} ({len(handles)} "
                        f"transactions) to {self.sink.where}", self.sink.errors_caught), \
                self._latest() as snapshot:
            pending = [handle for handle in handles if self.sink.staged_in(handle)
                       and snapshot.batch_of(proof_key(app_id, handle.txn_id)) < batch]
            if pending:
                changes = self.staged_changes(pending, Layout.of(snapshot.table).table_schema)
                plan = plan_batch(keyed, changes, row_versions(snapshot.table, keyed, changes),
                                  self.sink.tombstone_table.versions(changes))
                self.sink.tombstone_table.write(plan)
                merge_batch(snapshot.table, keyed, plan, proofs=[
                    Transaction(proof_key(app_id, handle.txn_id), batch) for handle in pending],
                    metadata={META_APP: app_id, META_BATCH: batch, META_TRANSACTIONS: [
                        str(handle.txn_id) for handle in pending]})
                log.debug("applied batch %d of %s: %d of %d changes newer", batch, app_id,
                          plan.applied.num_rows, changes.num_rows)
        outcomes = {handle.txn_id: CommitOutcome.ALREADY_COMMITTED for handle in handles}
        outcomes.update({handle.txn_id: CommitOutcome.COMMITTED for handle in pending})
        return outcomes

    def _proven(self, handle: Handle, snapshot: Snapshot, *, committed: bool) -> bool:
        """Whether the handle's rows are in the table already (an empty one: always)."""
        files = self.sink.files_in(handle)
        return not files or (committed and all(data_file.path in snapshot.referenced()
                                               for data_file in files))

    def _addable(self, handle: Handle, retention_s: float) -> list[DataFile]:
        """The handle's files, each checked: still there, and within VACUUM's retention."""
        files = self.sink.files_in(handle)
        vacuum = LakeCleanup("a VACUUM", "commit", "the table's delta.deletedFileRetentionDuration",
                             retention_s, risk=", and adding it now could resurrect rows an "
                             "OPTIMIZE rewrote")
        for data_file in files:
            self.check_addable(handle, data_file.path,
                               created_ms=data_file.modification_time, cleanup=vacuum)
        return files

    # -- before a decision: an explicit app id -----------------------------------------------------

    def check_committable(self, handles: Sequence[Handle]) -> None:
        """With an explicit app id, once: refuse a table that holds it at or above the first
        batch without the batch's files (module docstring)."""
        if (self.sink.app_id is None or self.sink.keyed is not None or self._app_id_checked
                or not handles):
            return
        with classified(classify, f"checking app id {self.sink.app_id!r} in {self.sink.where}",
                        self.sink.errors_caught), self._latest() as snapshot:
            last = snapshot.batch_of(self.sink.app_id)
            batch = min(handle.txn_id.batch for handle in handles)
            if last >= batch and not all(self._proven(handle, snapshot, committed=True)
                                         for handle in handles):
                raise ConfigurationError(
                    f"{self.sink.where} holds app id {self.sink.app_id!r} at version {last}, "
                    f"at or above this query's batch {batch}: a former query committed with "
                    "this app id, and Delta would take this batch for one of its own (a new "
                    "checkpoint's batch ids start again at 0).",
                    fix="give this checkpoint a new app_id=, or drop app_id= and let DeltaSink "
                        "derive one from the query (a new one per checkpoint)")
        self._app_id_checked = True

    # -- abort, in doubt, deadlines --------------------------------------------------------------

    def committed_among(self, found: Mapping[TxnId, Sequence[str]]) -> set[TxnId]:
        """Those of ``found`` whose app id's transaction version reached their batch and whose
        files the snapshot references (live or tombstoned), on one snapshot."""
        with self._latest() as snapshot:
            if self.sink.keyed is not None:
                return {txn_id for txn_id in found if snapshot.batch_of(
                    proof_key(self.sink.app_id_of(txn_id), txn_id)) >= txn_id.batch}
            last = {app_id: snapshot.batch_of(app_id)
                    for app_id in {self.sink.app_id_of(txn_id) for txn_id in found}}
            return {txn_id for txn_id, paths in found.items()
                    if last[self.sink.app_id_of(txn_id)] >= txn_id.batch
                    and set(paths) <= snapshot.referenced()}

    def commit_deadline(self, handle: Handle) -> float | None:
        """When VACUUM may delete the handle's oldest file (its creation + the table's
        ``delta.deletedFileRetentionDuration``); None for an empty partition, and for the
        keyed mode's staged files (VACUUM skips ``_`` folders)."""
        if self.sink.keyed is not None:
            return None
        created = (data_file.modification_time for data_file in self.sink.files_in(handle))
        return lake_deadline(created, self.retention_s())

    def retention_s(self) -> float:
        """The table's ``delta.deletedFileRetentionDuration``, read once per committer."""
        if self._retention_s is None:
            with classified(classify, f"reading the properties of {self.sink.where}",
                            self.sink.errors_caught), self._latest() as snapshot:
                self._retention_s = snapshot.retention_s()
        return self._retention_s
