"""The table's commits as the committer reads and makes them: one snapshot per batch, its
proof, and the one conditional catalog attempt that lands it.

**What a batch's commit carries.** One fast-append snapshot with every file of the batch, its
summary marked ``twophase.app`` (the query's app id, :func:`app_id_of`), ``twophase.batch``,
``twophase.transactions`` (how many) and, on the app id's first commit, ``twophase.first``;
and, in the SAME catalog commit, the table property
``twophase.batch.<app id>`` set to the batch (never lowered): the high-water mark that survives
snapshot expiry.

**The proof** (:func:`proof`): if the property is below the batch, no commit of it ever
landed: nothing is walked (the normal commit path, O(1)). Else the walk goes from the main
branch's current snapshot to its parents and stops at the first snapshot of this app id with a
lower batch, or after the app id's first commit: it reads only the snapshots made since the
batch's predecessor committed (other writers' included), O(new snapshots), never the table's
history, and the files the app's snapshots of the batch added (their own manifests: exact,
and unchanged by a later ``rewrite_data_files``, which removes files from the *current*
snapshot only). When the walk meets a parent that snapshot expiry removed before it could
stop, the property decides: the batch is committed (the driver commits a batch whole, in one
snapshot), and a warning says the walk was cut.

**One attempt.** pyiceberg's own commit retry rebases a fast append without validation: two
committers of one batch would both land (measured: 10 rows -> 20). So the sink commits on a
view of the table whose ``commit.retry.num-retries`` is 0 (:func:`single_attempt`; the
table's own setting is left as it is): the catalog's compare-and-swap
(``AssertRefSnapshotId`` on main; the SQL catalog's ``UPDATE ... WHERE metadata_location =``)
makes a racing commit fail with ``CommitFailedException``, which is retried by the driver:
the retry loads the table again and finds the proof.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from pyiceberg.io.pyarrow import (
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, ManifestEntryStatus
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.typedef import Record

from sinks.iceberg.files import IcebergFile
from twophase import TxnId

log = logging.getLogger(__name__)

APP_ID_PREFIX = "twophase"
SUMMARY_APP, SUMMARY_BATCH, SUMMARY_TRANSACTIONS, SUMMARY_FIRST = (
    "twophase.app", "twophase.batch", "twophase.transactions", "twophase.first")
BATCH_PROPERTY_PREFIX = "twophase.batch."
NO_BATCH = -1


def app_id_of(txn_id: TxnId) -> str:
    """The app id of the query a transaction belongs to: a new checkpoint is a new query, so
    its batch ids, which start again at 0, never meet the old query's."""
    return f"{APP_ID_PREFIX}-{txn_id.namespace}-{txn_id.query}"


def batch_property(app_id: str) -> str:
    return f"{BATCH_PROPERTY_PREFIX}{app_id}"


def last_batch(metadata: TableMetadata, app_id: str) -> int:
    """The highest batch of ``app_id`` committed to the table (the property), or -1."""
    return int(metadata.properties.get(batch_property(app_id), NO_BATCH))


@dataclass(frozen=True)
class Proof:
    """What the table says of an app id's batch: ``last`` (the property); ``added``: the
    files (absolute URIs) the app's snapshots of that batch or a later one added, walking back
    from the current snapshot; ``cut``: the walk met an expired parent before it could stop."""

    last: int
    added: frozenset[str]
    cut: bool

    def holds(self, batch: int, uris: Iterable[str]) -> bool:
        """Whether a transaction of ``batch`` with these files is committed."""
        if self.last < batch:
            return False
        if self.cut:
            return True
        return set(uris) <= self.added


def proof(table: Table, app_id: str, batch: int) -> Proof:
    """The proof of ``app_id``'s ``batch`` on the loaded ``table`` (module docstring)."""
    metadata = table.metadata
    last = last_batch(metadata, app_id)
    if last < batch:
        return Proof(last, frozenset(), cut=False)
    by_id = {snapshot.snapshot_id: snapshot for snapshot in metadata.snapshots}
    added: set[str] = set()
    snapshot = metadata.current_snapshot()
    while snapshot is not None:
        mine = _batch_of(snapshot, app_id)
        if mine is not None and mine < batch:
            return Proof(last, frozenset(added), cut=False)
        if mine is not None:
            added.update(_added_files(table, snapshot))
            if _first(snapshot):  # the app's first commit: nothing of it is older
                return Proof(last, frozenset(added), cut=False)
        # A parent that is not there was expired (pyiceberg's expiry even clears the id).
        snapshot = (by_id.get(snapshot.parent_snapshot_id)
                    if snapshot.parent_snapshot_id is not None else None)
    log.warning("the proof of %s batch %d met an expired snapshot before its predecessor: "
                "the table property %s=%d decides (committed)", app_id, batch,
                batch_property(app_id), last)
    return Proof(last, frozenset(added), cut=True)


def _batch_of(snapshot: Snapshot, app_id: str) -> int | None:
    summary = snapshot.summary
    if summary is None or summary[SUMMARY_APP] != app_id:
        return None
    return int(summary[SUMMARY_BATCH] or NO_BATCH)


def _first(snapshot: Snapshot) -> bool:
    return snapshot.summary is not None and snapshot.summary[SUMMARY_FIRST] == "true"


def _added_files(table: Table, snapshot: Snapshot) -> set[str]:
    """The data files ``snapshot`` added (its own manifests' ADDED entries)."""
    return {entry.data_file.file_path
            for manifest in snapshot.manifests(table.io)
            if manifest.added_snapshot_id == snapshot.snapshot_id
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False)
            if entry.status == ManifestEntryStatus.ADDED
            and entry.snapshot_id == snapshot.snapshot_id}


def data_file(table: Table, written: IcebergFile, uri: str) -> DataFile:
    """The ``DataFile`` a snapshot adds for a written file (``uri``: its location): the column
    statistics derived from its Parquet footer with the table's metrics settings, as
    pyiceberg's own writer derives them."""
    schema = table.schema()
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=written.metadata(),
        stats_columns=compute_statistics_plan(schema, table.metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema))
    return DataFile.from_args(
        content=DataFileContent.DATA, file_path=uri, file_format=FileFormat.PARQUET,
        partition=Record(*written.partition), file_size_in_bytes=written.size,
        sort_order_id=None, spec_id=written.spec_id, equality_ids=None, key_metadata=None,
        **statistics.to_serialized_dict())


def single_attempt(table: Table) -> Table:
    """A view of ``table`` whose commits make ONE catalog attempt (module docstring), built on
    its current snapshot alone.

    The view keeps what a fast append reads (schemas, specs, properties, the last sequence
    number, the main branch and its snapshot, whose manifests the new snapshot inherits) and
    drops the rest of the history (older snapshots, the snapshot and metadata logs, other
    refs): pyiceberg copies the whole metadata dozens of times while it builds one commit, so a
    view of the full history made each commit cost O(snapshots) (1.9 s at 1,000 snapshots,
    measured). Only the updates (the new snapshot, main moved to it, the property) and the
    requirements (main still at the current snapshot, the table's uuid) go to the catalog,
    which applies them to the table's full metadata."""
    metadata = table.metadata
    properties = {**metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}
    current = metadata.current_snapshot()
    view = metadata.model_copy(update={
        "properties": properties,
        "snapshots": [current] if current is not None else [],
        "snapshot_log": [], "metadata_log": [],
        "refs": {name: ref for name, ref in metadata.refs.items() if name == MAIN_BRANCH}})
    return Table(table.name(), view, table.metadata_location, table.io, table.catalog)


def commit(table: Table, files: Iterable[DataFile], *, app_id: str, batch: int,
           transactions: int, last: int) -> None:
    """One snapshot of ``files`` for ``app_id``'s ``batch``, and the property raised to it,
    in one conditional catalog attempt on the loaded ``table``."""
    summary: dict[str, str] = {SUMMARY_APP: app_id, SUMMARY_BATCH: str(batch),
                               SUMMARY_TRANSACTIONS: str(transactions)}
    if last == NO_BATCH:
        summary[SUMMARY_FIRST] = "true"
    with single_attempt(table).transaction() as transaction:
        transaction.set_properties({batch_property(app_id): str(max(last, batch))})
        with transaction.update_snapshot(snapshot_properties=summary).fast_append() \
                as append:
            for data_file in files:
                append.append_data_file(data_file)
