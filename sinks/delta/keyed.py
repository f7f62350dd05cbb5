"""The keyed mode of :class:`~sinks.delta.DeltaSink` (``mode="keyed"``): the latest state of
each key, by version, with tombstones (the rules: :mod:`twophase._keyed`; what a lake table
shares: :mod:`twophase.kit.lake._keyed`).

=================  ==============================================================================
where              what it does
=================  ==============================================================================
executor           a task's changes reduced per key and staged as Parquet under
                   ``_twophase/staged/`` (never referenced by the table; VACUUM skips ``_``
                   folders)
driver: read       the batch's staged changes, reduced across tasks; the versions of their
                   keys in the table (:func:`row_versions`: a scan of the keys' files, pruned
                   by their statistics) and in the tombstone table; what is newer kept
driver: tombstones ONE commit of the tombstone table (:class:`DeltaTombstones`, a Delta table at
                   ``<table>/_twophase/tombstones``): the batch's deletes' tombstones upserted,
                   those of keys written again deleted (idempotent: a retry does the same)
driver: the table  ONE MERGE (:func:`merge_batch`): a delete removes an older row, an upsert
                   replaces an older row or inserts, every clause guarded by the version
                   (``t.version < s.version``), carrying ``Transaction(<app id>.p<partition>,
                   batch)`` for each transaction it applies: the proof. A batch with nothing
                   newer commits the proof alone (an empty commit)
=================  ==============================================================================

A MERGE rewrites every file holding a key of the batch (copy-on-write: deltalake writes no
deletion vectors); the files it reads are pruned by the keys' min/max statistics and the
partition values, so the cost follows the files the keys touch: keys clustered in recent files
(the usual change stream) rewrite few. Another writer's commit between the read and the MERGE
makes the MERGE fail (a concurrent transaction): the retry reads the table again and proves
or applies again, never blindly. Pruning needs the key's range besides its values: pyarrow skips
a file by its statistics for a short ``isin`` only, and deltalake derives the MERGE's file
predicate from the source only when it is not streamed (``streamed_exec=False``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, Field, Schema
from deltalake.exceptions import TableNotFoundError
from deltalake.schema import PrimitiveType
from deltalake.transaction import CommitProperties, Transaction

from twophase.kit import DELETED_FLAG, Keyed
from twophase.kit.lake import INTENTS_DIRECTORY, BatchPlan, keys_of
from twophase.kit.sql import TOMBSTONE_TIME_COLUMN

log = logging.getLogger(__name__)

#: The tombstone table, under the keyed table's root (a ``_`` folder: no reader of the keyed
#: table, and no VACUUM of it, looks there).
TOMBSTONES_PATH: Final = f"{INTENTS_DIRECTORY}/tombstones"
#: Keys of the keyed commit's ``commitInfo`` (for an operator reading the history).
META_KEYED_BATCH: Final = "twophase.keyedBatch"


def quoted(name: str) -> str:
    """A column name as deltalake's SQL expressions take it."""
    return '"' + name.replace('"', '""') + '"'


def guard(keyed: Keyed) -> str:
    """The MERGE's version guard: the target row is older than the change (or has none)."""
    version = quoted(keyed.version)
    return f"(t.{version} IS NULL OR t.{version} < s.{version})"


def on_key(keyed: Keyed) -> str:
    return " AND ".join(f"t.{quoted(name)} = s.{quoted(name)}" for name in keyed.key)


def row_versions(table: DeltaTable, keyed: Keyed, changes: pa.Table) -> pa.Table:
    """The key and version of the table's rows whose key is among ``changes``' (a scan of
    the files whose statistics may hold one)."""
    if not changes.num_rows:
        return pa.table({name: changes.column(name) for name in (*keyed.key, keyed.version)})
    condition = None
    for name, values in keys_of(changes, keyed.key).items():
        column = changes.column(name)
        # The range lets pyarrow skip files by their min/max (it does not for a long isin).
        term = (pc.field(name).isin(values) & (pc.field(name) >= pc.min(column))
                & (pc.field(name) <= pc.max(column)))
        condition = term if condition is None else condition & term
    return table.to_pyarrow_dataset().to_table(filter=condition,
                                               columns=[*keyed.key, keyed.version])


def merge_batch(table: DeltaTable, keyed: Keyed, plan: BatchPlan, *,
                proofs: Sequence[Transaction], metadata: Mapping[str, Any]) -> None:
    """The plan's applied changes in ONE commit of ``table`` carrying ``proofs`` (the module
    docstring). A MERGE that changes no row makes no commit (deltalake): then, as for a plan
    with nothing newer, the proofs are committed alone."""
    properties = CommitProperties(custom_metadata=dict(metadata),
                                  app_transactions=list(proofs))
    before = table.version()
    if plan.applied.num_rows:
        written = [name for name in plan.applied.column_names if name != DELETED_FLAG]
        values = {quoted(name): f"s.{quoted(name)}" for name in written}
        flag = f"s.{quoted(DELETED_FLAG)}"
        # streamed_exec=False: deltalake derives a pruning predicate from the source's key
        # range only then (the source, a batch's changes, is small), so a MERGE of keys
        # clustered in recent files reads those files, not the table.
        metrics = (table.merge(plan.applied, predicate=on_key(keyed), source_alias="s",
                               target_alias="t", commit_properties=properties,
                               streamed_exec=False)
                   .when_matched_delete(predicate=f"{flag} AND {guard(keyed)}")
                   .when_matched_update(updates=values,
                                        predicate=f"NOT {flag} AND {guard(keyed)}")
                   .when_not_matched_insert(updates=values, predicate=f"NOT {flag}")
                   .execute())
        log.debug("keyed MERGE: %s", metrics)
    if table.version() == before:
        table.create_write_transaction(
            [], mode="append", schema=table.schema(),
            partition_by=list(table.metadata().partition_columns) or None,
            commit_properties=properties)


class DeltaTombstones:
    """The keyed table's tombstones: a Delta table of the key and version columns (the keyed
    table's types) and ``deleted_at`` (UTC), at ``<table>/_twophase/tombstones``."""

    def __init__(self, table_uri: str, storage_options: Mapping[str, str], keyed: Keyed
                 ) -> None:
        self.uri = f"{table_uri.rstrip('/')}/{TOMBSTONES_PATH}"
        self.storage_options = dict(storage_options) or None
        self.keyed = keyed

    def create_missing(self, target: DeltaTable) -> None:
        """The tombstone table, unless it exists (its columns: ``target``'s key and version)."""
        if self._table() is not None:
            return
        fields = {field.name: field for field in target.schema().fields}
        log.info("creating the tombstone table %s", self.uri)
        DeltaTable.create(self.uri, schema=Schema([
            *(Field(name, fields[name].type, nullable=False)
              for name in (*self.keyed.key, self.keyed.version)),
            Field(TOMBSTONE_TIME_COLUMN, PrimitiveType("timestamp"), nullable=False)]),
            mode="ignore", storage_options=self.storage_options)

    def _table(self) -> DeltaTable | None:
        try:
            return DeltaTable(self.uri, storage_options=self.storage_options)
        except TableNotFoundError:
            return None

    def _required(self) -> DeltaTable:
        table = self._table()
        if table is None:
            raise TableNotFoundError(f"no tombstone table at {self.uri} (check_schema "
                                     "creates it)")
        return table

    def versions(self, changes: pa.Table) -> pa.Table:
        """The key and version of the tombstones of ``changes``' keys."""
        return row_versions(self._required(), self.keyed, changes)

    def write(self, plan: BatchPlan) -> None:
        """The plan's tombstones upserted (a newer version only) and its cleared keys' deleted,
        in one commit (nothing to do: no commit)."""
        if not plan.tombstoned.num_rows and not plan.cleared.num_rows:
            return
        cleared = plan.cleared.append_column(
            self.keyed.version, pa.nulls(plan.cleared.num_rows,
                                         plan.tombstoned.schema.field(self.keyed.version).type))
        cleared = cleared.append_column(TOMBSTONE_TIME_COLUMN, pa.nulls(
            cleared.num_rows, plan.tombstoned.schema.field(TOMBSTONE_TIME_COLUMN).type))
        source = pa.concat_tables([
            plan.tombstoned.append_column(DELETED_FLAG, pa.repeat(True,
                                                                  plan.tombstoned.num_rows)),
            cleared.append_column(DELETED_FLAG, pa.repeat(False, cleared.num_rows))])
        names = [*self.keyed.key, self.keyed.version, TOMBSTONE_TIME_COLUMN]
        values = {quoted(name): f"s.{quoted(name)}" for name in names}
        flag = f"s.{quoted(DELETED_FLAG)}"
        (self._required().merge(source, predicate=on_key(self.keyed), source_alias="s",
                                target_alias="t")
         .when_matched_update(updates=values, predicate=f"{flag} AND {guard(self.keyed)}")
         .when_matched_delete(predicate=f"NOT {flag}")
         .when_not_matched_insert(updates=values, predicate=flag)
         .execute())

    def count(self) -> tuple[int, datetime | None]:
        """How many tombstones, and the oldest one's ``deleted_at``."""
        table = self._table()
        if table is None:
            return 0, None
        times = table.to_pyarrow_table(columns=[TOMBSTONE_TIME_COLUMN]).column(0)
        oldest = pc.min(times).as_py() if len(times) else None
        return len(times), oldest

    def purge(self, older_than: datetime) -> int:
        """Delete the tombstones of deletes applied before ``older_than``: how many."""
        table = self._table()
        if table is None:
            return 0
        moment = older_than.isoformat()
        metrics = table.delete(f"{quoted(TOMBSTONE_TIME_COLUMN)} < '{moment}'")
        return int(metrics.get("num_deleted_rows", 0))
