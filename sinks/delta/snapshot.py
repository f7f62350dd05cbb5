"""The Delta log as the committer reads and writes it: one loaded version of the table
(:class:`Snapshot`), on which the proof is read and the commit is built.

**App id.** A query's commits carry ``Transaction(app_id, version=batch)``, where
``app_id = "twophase-<namespace>-<query key>"`` (:func:`app_id_of`, from the transaction id):
a new checkpoint is a new query id, so its batch ids, which start again at 0, never meet the
old query's version (Delta's ``txnAppId`` trap, where a reset checkpoint's writes are dropped
silently).

**The proof, on one snapshot.** ``transaction_version(app_id) >= batch`` says a commit of the
batch landed; a handle's files found among the paths the snapshot references (its live files
and its tombstones, :meth:`Snapshot.referenced`) say which. The commit is built on the same
loaded table, so a racing committer of the same app id fails with Delta's concurrent
transaction error (the conflict checker compares the winners' ``txn`` actions; two table
objects loaded apart would both pass the check), which is retried: the retry loads the table
again and finds the proof.

**Referenced.** The live files (``get_add_actions``) and the tombstones (the files removed by
a commit, an OPTIMIZE say, kept in the log until ``delta.deletedFileRetentionDuration`` is over:
what ``vacuum(dry_run=True, retention_hours=0)`` lists in its default, log-only mode). Both come
from the snapshot's state, no commit file is read: the cost grows with the table's live files
and its tombstones within the retention, not with its age. A file whose tombstone has
expired is referenced by no version a reader may still open: VACUUM deletes it too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.transaction import CommitProperties, Transaction

from sinks.delta.files import DataFile
from sinks.delta.schema import retention_s
from twophase import TxnId

log = logging.getLogger(__name__)

APP_ID_PREFIX = "twophase"
#: Keys of the commit's ``commitInfo`` that name what it carried (for an operator reading
#: the history; the proof never reads them).
META_APP, META_BATCH, META_TRANSACTIONS = (
    "twophase.appId", "twophase.batch", "twophase.transactions")
NO_VERSION = -1


def app_id_of(txn_id: TxnId) -> str:
    """The app id of the query a transaction belongs to (see the module docstring)."""
    return f"{APP_ID_PREFIX}-{txn_id.namespace}-{txn_id.query}"


class Snapshot:
    """One loaded version of the table."""

    def __init__(self, table: DeltaTable) -> None:
        self.table = table
        self._referenced: frozenset[str] | None = None

    @classmethod
    def load(cls, uri: str, storage_options: Mapping[str, str] | None) -> Snapshot:
        return cls(DeltaTable(uri, storage_options=dict(storage_options or {}) or None))

    @property
    def version(self) -> int:
        return int(self.table.version())

    def batch_of(self, app_id: str) -> int:
        """The last batch a commit of ``app_id`` carried (NO_VERSION: none)."""
        version = self.table.transaction_version(app_id)
        return NO_VERSION if version is None else int(version)

    def retention_s(self) -> float:
        """The table's ``delta.deletedFileRetentionDuration`` in seconds."""
        return retention_s(self.table.metadata().configuration)

    def referenced(self) -> frozenset[str]:
        """Every path the snapshot references: live files and tombstones (relative, as on
        disk: the live files' log form is URI-escaped, the tombstones' is not)."""
        if self._referenced is None:
            live = [unquote(path) for path in pa.table(
                self.table.get_add_actions(flatten=True)).column("path").to_pylist()]
            removed = self.table.vacuum(retention_hours=0, dry_run=True,
                                        enforce_retention_duration=False)
            self._referenced = frozenset(live) | frozenset(removed)
        return self._referenced

    def commit(self, files: Sequence[DataFile], *, app_id: str, batch: int,
               transactions: Sequence[TxnId]) -> None:
        """One commit adding ``files`` with ``Transaction(app_id, batch)``, on this snapshot."""
        metadata: dict[str, Any] = {META_APP: app_id, META_BATCH: batch,
                                    META_TRANSACTIONS: [str(txn) for txn in transactions]}
        self.table.create_write_transaction(
            [data_file.action() for data_file in files], mode="append",
            schema=self.table.schema(),
            partition_by=list(self.table.metadata().partition_columns) or None,
            commit_properties=CommitProperties(
                custom_metadata=metadata, app_transactions=[Transaction(app_id, batch)]))
        log.debug("committed %d files of batch %d (app id %s) on version %d", len(files),
                  batch, app_id, self.version)
