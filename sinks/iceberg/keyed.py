"""The keyed mode of :class:`~sinks.iceberg.IcebergSink` (``mode="keyed"``): the latest state
of each key, by version, with tombstones (the rules: :mod:`twophase._keyed`; what a lake table
shares: :mod:`twophase.kit.lake._keyed`).

=================  ==============================================================================
where              what it does
=================  ==============================================================================
executor           a task's changes reduced per key and staged as Parquet under the table's
                   ``<location>/_twophase/staged/`` (no snapshot adds them; orphan removal
                   skips ``_`` folders)
driver: read       the batch's staged changes, reduced across tasks; the versions of their
                   keys in the table (:func:`row_versions`: a scan filtered by the keys,
                   pruned by the manifests' and files' statistics) and in the tombstone table;
                   what is newer kept
driver: tombstones ONE catalog commit of the tombstone table (:class:`IcebergTombstones`,
                   ``<namespace>._twophase_tombstones_<table>``): the rows of the batch's
                   deleted and written-again keys deleted, the new tombstones appended
driver: the table  ONE catalog commit (:func:`apply_batch`): the rows of every applied key
                   deleted (copy-on-write: the files holding them rewritten), the upserts
                   appended, and the table property ``twophase.batch.<app id>.p<partition>``
                   raised to the batch for each transaction applied (the proof), on a view
                   whose commit retries are 0 (:func:`~sinks.iceberg.snapshots.single_attempt`:
                   pyiceberg's retry would land an insert twice); a racing commit fails the
                   compare-and-swap and the driver's retry reads the table again
=================  ==============================================================================

pyiceberg's own ``upsert`` is not used: it has no delete clause and no version predicate, and
its retry duplicates inserted keys. Deletion vectors and merge-on-read delete files: pyiceberg
0.12 writes neither (every delete rewrites the files it touches); unavailable.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Final

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import (
    AlwaysFalse,
    And,
    BooleanExpression,
    GreaterThanOrEqual,
    LessThanOrEqual,
    Reference,
)
from pyiceberg.expressions.literals import literal
from pyiceberg.table.upsert_util import create_match_filter

from sinks.iceberg.snapshots import batch_property, single_attempt
from twophase.kit import DELETED_FLAG, Keyed
from twophase.kit.lake import BatchPlan, conform_table
from twophase.kit.sql import TOMBSTONE_TIME_COLUMN, tombstone_table_name

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

log = logging.getLogger(__name__)

#: The summary of a keyed commit's snapshots: the app id and the batch.
SUMMARY_KEYED_APP, SUMMARY_KEYED_BATCH = "twophase.keyed.app", "twophase.keyed.batch"
#: Tombstone tables are named within the longest name a catalog surely keeps.
TOMBSTONE_NAME_LENGTH: Final = 128


def matching(table: pa.Table, keyed: Keyed) -> BooleanExpression:
    """A row filter that holds exactly the keys of ``table``, and their range (what lets
    pyiceberg skip manifests and files by their statistics)."""
    if not table.num_rows:
        return AlwaysFalse()
    expression = create_match_filter(table, list(keyed.key))
    for name in keyed.key:  # pyiceberg prunes files by an In of at most 200 values only
        column = table.column(name)
        low, high = pc.min(column).as_py(), pc.max(column).as_py()
        expression = And(GreaterThanOrEqual(term=Reference(name), value=literal(low)),
                         LessThanOrEqual(term=Reference(name), value=literal(high)),
                         expression)
    return expression


def row_versions(table: Table, keyed: Keyed, changes: pa.Table) -> pa.Table:
    """The key and version of ``table``'s rows whose key is among ``changes``'."""
    columns = (*keyed.key, keyed.version)
    if not changes.num_rows or table.metadata.current_snapshot() is None:
        arrow = table.schema().as_arrow()
        return pa.schema([arrow.field(name) for name in columns]).empty_table()
    return table.scan(row_filter=matching(changes, keyed), selected_fields=columns).to_arrow()


def apply_batch(table: Table, keyed: Keyed, plan: BatchPlan, schema: pa.Schema, *,
                proofs: Mapping[str, int], summary: Mapping[str, str], where: str) -> None:
    """The plan in ONE catalog commit of ``table``: the applied keys' rows deleted, the
    upserts appended (``schema``: the table's columns), the ``proofs`` raised (a property
    each, never lowered), in one attempt (the module docstring)."""
    properties = dict(summary)
    upserts = plan.upserts.drop_columns([DELETED_FLAG])
    with single_attempt(table).transaction() as transaction:
        if plan.replaced.num_rows:
            transaction.delete(matching(plan.replaced, keyed), snapshot_properties=properties)
        if upserts.num_rows:
            transaction.append(conform_table(upserts, schema, where),
                               snapshot_properties=properties)
        current = table.metadata.properties
        transaction.set_properties({
            batch_property(name): str(max(batch, int(current.get(batch_property(name), -1))))
            for name, batch in proofs.items()})


def proven_batch(table: Table, name: str) -> int:
    """The batch a keyed proof ``name`` (:func:`~twophase.kit.lake.proof_key`) reached: -1
    for none."""
    return int(table.metadata.properties.get(batch_property(name), -1))


class IcebergTombstones:
    """The keyed table's tombstones: an Iceberg table of the key and version columns (the
    keyed table's types) and ``deleted_at`` (UTC), beside it in its namespace."""

    def __init__(self, catalog: Catalog, table: str, keyed: Keyed) -> None:
        namespace, _, name = table.rpartition(".")
        self.catalog, self.keyed = catalog, keyed
        self.identifier = f"{namespace}.{tombstone_table_name(name, TOMBSTONE_NAME_LENGTH)}"

    def create_missing(self, target: Table) -> None:
        """The tombstone table, unless it exists (its columns: ``target``'s key and version)."""
        if self.catalog.table_exists(self.identifier):
            return
        fields = {field.name: field for field in target.schema().as_arrow()}
        log.info("creating the tombstone table %s", self.identifier)
        self.catalog.create_table_if_not_exists(self.identifier, schema=pa.schema([
            *(fields[name].with_nullable(False).with_metadata(None)
              for name in (*self.keyed.key, self.keyed.version)),
            pa.field(TOMBSTONE_TIME_COLUMN, pa.timestamp("us", tz="UTC"), nullable=False)]))

    def _table(self) -> Table:
        return self.catalog.load_table(self.identifier)

    def versions(self, changes: pa.Table) -> pa.Table:
        """The key and version of the tombstones of ``changes``' keys."""
        return row_versions(self._table(), self.keyed, changes)

    def write(self, plan: BatchPlan) -> None:
        """The plan's tombstones written (the rows of their keys and of the cleared keys
        deleted, the new ones appended) in one catalog attempt; nothing to do: no commit."""
        if not plan.tombstoned.num_rows and not plan.cleared.num_rows:
            return
        table = self._table()
        keys = pa.concat_tables([plan.tombstoned.select(list(self.keyed.key)),
                                 plan.cleared.select(list(self.keyed.key))])
        held = row_versions(table, self.keyed, keys)
        schema = table.schema().as_arrow()
        with single_attempt(table).transaction() as transaction:
            if held.num_rows:
                transaction.delete(matching(held, self.keyed))
            if plan.tombstoned.num_rows:
                transaction.append(plan.tombstoned.cast(schema))

    def count(self) -> tuple[int, datetime | None]:
        """How many tombstones, and the oldest one's ``deleted_at``."""
        if not self.catalog.table_exists(self.identifier):
            return 0, None
        times = self._table().scan(selected_fields=(TOMBSTONE_TIME_COLUMN,)).to_arrow().column(0)
        return len(times), (pc.min(times).as_py() if len(times) else None)

    def purge(self, older_than: datetime) -> int:
        """Delete the tombstones of deletes applied before ``older_than``: how many."""
        if not self.catalog.table_exists(self.identifier):
            return 0
        table = self._table()
        expired = f"{TOMBSTONE_TIME_COLUMN} < '{older_than.isoformat()}'"
        purged = table.scan(row_filter=expired, selected_fields=self.keyed.key).count()
        if purged:
            with single_attempt(table).transaction() as transaction:
                transaction.delete(expired)
        return int(purged)
