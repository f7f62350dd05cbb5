"""The keyed mode of a lake table (``mode="keyed"``, the rules: :mod:`twophase._keyed`): what
Delta and Iceberg share, the staged changes of a batch and the plan that applies them.

A lake table cannot hold a transaction open across the decision the way a database does: a
keyed batch rewrites the files its keys touch, and which those are is known only at the
table's version of the commit. So the executors **stage** and the driver **applies**:

==================  ==========================================================================
where               what
==================  ==========================================================================
executor            a task's changes reduced to the newest per key (in Arrow, across its
                    chunks, holding at most :data:`~twophase.kit.HELD_CHUNKS` chunks' worth of
                    keys: :meth:`~twophase.kit.Keyed.newest_in_tables`), the delete marker
                    read into ``_twophase_deleted``, written as Parquet files under
                    ``_twophase/staged/<namespace>/`` (:func:`staged_files`: durable,
                    invisible: no reader, VACUUM or orphan removal looks into a ``_`` folder),
                    each named by the transaction's intent before it is created; the
                    handle lists them (:class:`StagedFile`)
driver              the batch's staged changes read and reduced across its tasks; the
                    current versions of their keys read from the table (its rows) and from the
                    tombstone table; :func:`plan_batch` keeps what is newer; the tombstones
                    written first, idempotently (their own commit of the tombstone table);
                    then ONE commit of the table that applies the rest and carries the proof
after the commit    the staged files and the intents deleted (``finish_batch``, or the sweep
                    that finds the transaction proven committed)
==================  ==========================================================================

**Why the tombstones go first.** No lake library commits two tables atomically. Written
first, a crash between the two commits leaves a tombstone whose delete has not landed yet:
:func:`plan_batch` still applies a delete whose version *equals* its key's tombstone to a row
older than it (only the retry of this batch writes such a pair), and it drops a tombstone only
for a key whose newer row the same batch writes. Either way the batch's commit stays the one
proof, and the table ends as if the batch had landed at once.

**The proof** is per transaction (a handle committed on its own is a commit of its own): a
version per query and partition in the table's commit (Delta's app transactions, an Iceberg
table property), raised to the batch.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from twophase._handle import TxnId
from twophase._keyed import (
    DEFAULT_TOMBSTONE_RETENTION_S,
    DELETED_FLAG,
    KEYED,
    TOMBSTONE_TIME_COLUMN,
    Keyed,
    validate_keyed,
)
from twophase.errors import ConfigurationError, SchemaMismatchError
from twophase.kit.lake._files import INTENTS_DIRECTORY, LakeFiles, LakeOutput, LakeStorage

if TYPE_CHECKING:
    import pyarrow as pa

#: A lake sink's modes: rows appended, or the latest state of each key.
APPEND: Final = "append"
LAKE_MODES: Final = (APPEND, KEYED)
#: Where the staged changes of a namespace's transactions are, under the table's root.
STAGED_DIRECTORY: Final = f"{INTENTS_DIRECTORY}/staged"
#: The scratch columns of a plan: the key's version in the table's row and in its tombstone.
ROW_VERSION: Final = "_twophase_row_version"
TOMBSTONE_VERSION: Final = "_twophase_tombstone_version"


def validate_lake_mode(sink: str, mode: str, key: Sequence[str], version: str | None,
                       deleted: str | None, *,
                       tombstone_retention_s: float = DEFAULT_TOMBSTONE_RETENTION_S
                       ) -> Keyed | None:
    """A lake sink's mode: :data:`APPEND` (None) or ``"keyed"`` (its :class:`Keyed`)."""
    if mode not in LAKE_MODES and version is None and deleted is None:
        raise ConfigurationError(f"{sink}: mode={mode!r} is not one of {list(LAKE_MODES)}.",
                                 fix="pass mode='append' (rows added) or mode='keyed' (the "
                                     "latest state of each key, by version)")
    if mode == APPEND and key:
        raise ConfigurationError(f"{sink}: key={list(key)} belongs to mode='keyed'.",
                                 fix="pass mode='keyed' with version=, or drop key=")
    return validate_keyed(sink, mode, key, version, deleted,
                          tombstone_retention_s=tombstone_retention_s)


def staged_path(txn_id: TxnId, number: int) -> str:
    """The ``number``-th staged file of ``txn_id``, relative to the table's root."""
    return f"{STAGED_DIRECTORY}/{txn_id.namespace}/{txn_id}-{number:05d}.parquet"


def proof_key(app_id: str, txn_id: TxnId) -> str:
    """What a keyed commit raises to its batch for each transaction it applies: the query's
    app id and the transaction's partition."""
    return f"{app_id}.p{txn_id.partition}"


@dataclass(frozen=True)
class StagedFile:
    """A staged file as a keyed handle lists it: its path (relative to the table's root), how
    many changes it holds, its size and when it was created (epoch milliseconds)."""

    path: str
    rows: int
    size: int
    created: int

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "rows": self.rows, "size": self.size,
                "created": self.created}

    @classmethod
    def from_json(cls, data: Any) -> StagedFile:
        return cls(str(data["path"]), int(data["rows"]), int(data["size"]),
                   int(data["created"]))

    @classmethod
    def unsealed(cls, path: str) -> StagedFile:
        """A file an intent names, as an abort needs it: its path alone."""
        return cls(path, 0, 0, 0)


class _StagedWriter:
    """One staged Parquet file being written."""

    def __init__(self, output: LakeOutput, path: str, schema: pa.Schema) -> None:
        import pyarrow.parquet as pq  # noqa: PLC0415 - only lake sinks need pyarrow

        self.output, self.path, self.rows = output, path, 0
        self.writer = pq.ParquetWriter(output.stream, schema)

    @property
    def size(self) -> int:
        return int(self.output.stream.tell())

    def write(self, table: pa.Table) -> None:
        self.writer.write_table(table)
        self.rows += table.num_rows

    def close(self) -> StagedFile:
        self.writer.close()
        stat = self.output.seal()
        return StagedFile(self.path, self.rows, stat.size, stat.modification_time)

    def abandon(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()
        self.output.abandon()


def staged_files(storage: LakeStorage, txn_id: TxnId, schema: pa.Schema,
                 max_file_bytes: int) -> LakeFiles[tuple[()], StagedFile]:
    """The staged files of one keyed transaction (:class:`~twophase.kit.lake.LakeFiles`,
    unpartitioned, rolled at ``max_file_bytes``)."""
    return LakeFiles(storage, txn_id, max_file_bytes,
                     partitions=lambda table: iter([((), table)]),
                     path_of=lambda _key, number: staged_path(txn_id, number),
                     open_file=lambda output, path, _key: _StagedWriter(output, path, schema))


def staged_schema(keyed: Keyed, table_schema: pa.Schema) -> pa.Schema:
    """A staged file's columns: the table's (every one nullable: a delete carries its key and
    version alone), then the delete flag."""
    import pyarrow as pa  # noqa: PLC0415

    return pa.schema([*(column.with_nullable(True) for column in table_schema),
                      pa.field(DELETED_FLAG, pa.bool_(), nullable=False)])


def check_upserts(flagged: pa.Table, table_schema: pa.Schema, where: str) -> None:
    """Refuse a change that writes NULL into a NOT NULL column (a delete writes nothing)."""
    import pyarrow.compute as pc  # noqa: PLC0415

    upserts = None
    for column in table_schema:
        if column.nullable or column.name not in flagged.column_names:
            continue
        if upserts is None:
            upserts = flagged.filter(pc.invert(flagged.column(DELETED_FLAG)))
        if nulls := upserts.column(column.name).null_count:
            raise SchemaMismatchError(
                f"{where}: column {column.name!r} is NOT NULL, but {nulls} change(s) that are "
                "not deletes hold NULL there.", fix="filter or fill the NULLs in the query")


def read_staged(storage: LakeStorage, files: Iterable[StagedFile], schema: pa.Schema
                ) -> pa.Table:
    """The changes of ``files``, in one table of ``schema`` (a file gone: FileNotFoundError
    naming it)."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    tables = []
    for staged in files:
        body = storage.get(staged.path)
        if body is None:
            raise FileNotFoundError(staged.path)
        tables.append(pq.read_table(io.BytesIO(body), schema=schema))
    return pa.concat_tables(tables) if tables else schema.empty_table()


@dataclass(frozen=True)
class BatchPlan:
    """What a keyed batch does to a lake table (:func:`plan_batch`): ``applied``, the changes
    newer than their key's row and tombstone (staged columns: the table's, then the delete
    flag); ``tombstoned``, the tombstones to write (key, version, ``deleted_at``); ``cleared``,
    the keys whose tombstone goes (a newer row replaces it); ``replaced``, the keys of
    ``applied`` that have a row now (deleted or replaced)."""

    applied: pa.Table
    tombstoned: pa.Table
    cleared: pa.Table
    replaced: pa.Table

    @property
    def upserts(self) -> pa.Table:
        import pyarrow.compute as pc  # noqa: PLC0415

        return self.applied.filter(pc.invert(self.applied.column(DELETED_FLAG)))

    @property
    def deletes(self) -> pa.Table:
        return self.applied.filter(self.applied.column(DELETED_FLAG))


def plan_batch(keyed: Keyed, changes: pa.Table, rows: pa.Table, tombstones: pa.Table,
               now: datetime | None = None) -> BatchPlan:
    """The plan of a batch's ``changes`` (staged columns, reduced to one per key) against the
    versions the table holds: ``rows`` and ``tombstones`` each of the key and version
    columns (the batch's keys among them; others are ignored).

    An upsert applies if its version is newer than its key's row and tombstone; a delete if
    newer than the row and not older than the tombstone (equal: this batch's own tombstone,
    written before a crash; see the module docstring)."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.compute as pc  # noqa: PLC0415

    key, version = list(keyed.key), keyed.version
    joined = changes
    for name, current in ((ROW_VERSION, rows), (TOMBSTONE_VERSION, tombstones)):
        versions = current.select([*key, version]).rename_columns([*key, name])
        joined = joined.join(versions, keys=key, join_type="left outer")
    stamp = joined.column(version)
    deleted = joined.column(DELETED_FLAG)
    older_row = pc.fill_null(pc.greater(stamp, joined.column(ROW_VERSION)), True)
    tombstone = joined.column(TOMBSTONE_VERSION)
    over_tombstone = pc.fill_null(pc.greater(stamp, tombstone), True)
    at_tombstone = pc.fill_null(pc.greater_equal(stamp, tombstone), True)
    applies = pc.and_(older_row, pc.if_else(deleted, at_tombstone, over_tombstone))
    upserted = pc.and_(applies, pc.invert(deleted))
    entombed = joined.filter(pc.and_(pc.and_(applies, deleted), over_tombstone))
    cleared = joined.filter(pc.and_(upserted, pc.is_valid(tombstone)))
    replaced = joined.filter(pc.and_(applies, pc.is_valid(joined.column(ROW_VERSION))))
    when = now or datetime.now(UTC)
    tombstoned = entombed.select([*key, version]).append_column(
        TOMBSTONE_TIME_COLUMN, pa.array([when] * entombed.num_rows,
                                        pa.timestamp("us", tz="UTC")))
    return BatchPlan(joined.filter(applies).select(changes.column_names), tombstoned,
                     cleared.select(key), replaced.select(key))


def keys_of(table: pa.Table, key: Sequence[str]) -> dict[str, list[Any]]:
    """Each key column's distinct values in ``table``: a filter that holds every key of it
    (and, for a key of several columns, maybe more: a plan's join keeps the exact ones)."""
    import pyarrow.compute as pc  # noqa: PLC0415

    return {name: pc.unique(table.column(name)).to_pylist() for name in key}
