"""The table's data files: named by their transaction, written as Parquet, deleted.

A transaction's files go where the table's own writers put theirs, in the ordinary data area:
the table's root, or its partition directories (``status=paid/``), never a ``_``-prefixed
folder (VACUUM ignores those, so a file there is never cleaned up). Each is named
``part-<txn id>-<n>.parquet`` (``n``: 00000, 00001, ... per transaction), and listed by the
transaction's intent (:mod:`~sinks.delta.intents`) before it is created. A file is created
exclusively (:class:`~sinks.delta.storage.Storage`): a transaction id used twice never
overwrites the first use's file (a committed one), it fails.

Files are bounded: a writer rolls to a new file once its file reaches ``max_file_bytes``,
writing one row group per chunk of rows (memory: a chunk, and the open row group of each
partition value a partition's rows hit; on S3 the whole open file, sent by one conditional
put when it is sealed).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake.transaction import AddAction

from sinks.delta import intents
from sinks.delta.schema import Layout
from sinks.delta.stats import FileStats
from sinks.delta.storage import Output, Storage
from twophase import SchemaMismatchError, TwoPhaseError, TxnId

log = logging.getLogger(__name__)

#: Hive's directory name of a NULL partition value.
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
#: Characters kept beyond letters, digits and "_.-~" in a partition directory's name (none: the
#: rest are %-escaped, as delta-rs names them).
SAFE_IN_DIRECTORY = ""
DEFAULT_MAX_FILE_BYTES = 128 * 1024 * 1024

PartitionKey = tuple[str | None, ...]


def file_name(txn_id: TxnId, number: int) -> str:
    return f"part-{txn_id}-{number:05d}.parquet"


@dataclass(frozen=True)
class DataFile:
    """One written file as its ``AddAction`` needs it; ``path`` relative to the table's root,
    as on disk (an ``AddAction`` takes it so; the log stores it URI-escaped)."""

    path: str
    size: int
    partition_values: Mapping[str, str | None]
    modification_time: int
    stats: str

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size,
                "partition_values": dict(self.partition_values),
                "modification_time": self.modification_time, "stats": self.stats}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DataFile:
        return cls(data["path"], int(data["size"]), dict(data["partition_values"]),
                   int(data["modification_time"]), data["stats"])

    @classmethod
    def unsealed(cls, path: str) -> DataFile:
        """A file an intent names, as an abort needs it: its path alone."""
        return cls(path, 0, {}, 0, "")

    def action(self) -> AddAction:
        return AddAction(self.path, self.size, dict(self.partition_values),
                         self.modification_time, True, self.stats)


class _OpenFile:
    """One Parquet file being written."""

    def __init__(self, output: Output, relative: str, schema: pa.Schema,
                 partition_values: Mapping[str, str | None]) -> None:
        self.output, self.relative, self.partition_values = output, relative, partition_values
        self.writer = pq.ParquetWriter(output.stream, schema)
        self.stats = FileStats(schema)

    @property
    def size(self) -> int:
        return self.output.stream.tell()

    def write(self, table: pa.Table) -> None:
        for batch in table.to_batches():
            self.writer.write_batch(batch)
            self.stats.add(batch)

    def close(self) -> DataFile:
        self.writer.close()
        stat = self.output.seal()
        return DataFile(self.relative, stat.size, dict(self.partition_values),
                        stat.modification_time, self.stats.to_json())

    def abandon(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()
        self.output.abandon()


@dataclass
class TransactionFiles:
    """The files of one transaction: one open file per partition value, rolled at
    ``max_file_bytes``, each named by the transaction's intent before it is created; closed
    by :meth:`close`, deleted with the intent by :meth:`delete`."""

    storage: Storage
    layout: Layout
    txn_id: TxnId
    max_file_bytes: int
    rows: int = 0
    closed: list[DataFile] = field(default_factory=list)
    _open: dict[PartitionKey, _OpenFile] = field(default_factory=dict)
    _created: list[str] = field(default_factory=list)

    def write(self, table: pa.Table) -> None:
        """Rows of the table's columns (partition columns included)."""
        for key, part in self._by_partition(table):
            self._file_of(key).write(part)
            if self._open[key].size >= self.max_file_bytes:
                self._seal(self._open.pop(key))
        self.rows += table.num_rows

    def close(self) -> list[DataFile]:
        """Close every open file: the transaction's files, durable."""
        while self._open:
            self._seal(self._open.pop(next(iter(self._open))))
        return self.closed

    def _seal(self, opened: _OpenFile) -> None:
        try:
            self.closed.append(opened.close())
        except FileExistsError:
            self._created.remove(opened.relative)  # another's file (on S3, found at the put)
            raise

    def delete(self) -> None:
        """Delete every file this transaction created, then its intent (a discarded
        transaction); never raises: what is left is the sweep's."""
        for opened in self._open.values():
            opened.abandon()
        self._open.clear()
        if not self._created:
            return
        caught: tuple[type[BaseException], ...] = (*self.storage.errors, TwoPhaseError)
        try:
            self.storage.delete(self._created)
            intents.forget(self.storage, [self.txn_id])
        except caught as exc:
            log.warning("discarding %s: %s (the sweep deletes what is left)", self.txn_id, exc)

    def _file_of(self, key: PartitionKey) -> _OpenFile:
        if key not in self._open:
            values = dict(zip(self.layout.partition_by, key, strict=True))
            relative = "/".join([*(partition_directory(name, value)
                                   for name, value in values.items()),
                                 file_name(self.txn_id, len(self._created))])
            intents.record(self.storage, self.txn_id, [*self._created, relative])
            output = self.storage.create(relative)
            self._created.append(relative)
            self._open[key] = _OpenFile(output, relative, self.layout.file_schema, values)
        return self._open[key]

    def _by_partition(self, table: pa.Table) -> Iterator[tuple[PartitionKey, pa.Table]]:
        partition_by = self.layout.partition_by
        if not partition_by:
            yield (), table
            return
        keys = list(zip(*(table.column(name).to_pylist() for name in partition_by),
                        strict=True))
        rows: dict[PartitionKey, list[int]] = {}
        for index, key in enumerate(keys):
            rows.setdefault(tuple(partition_value(value) for value in key), []).append(index)
        data = table.drop_columns(list(partition_by))
        for key, indices in rows.items():
            yield key, data.take(indices)


def partition_value(value: Any) -> str | None:
    """A partition value's text form in the log (Delta's serialisation of the types
    :data:`~sinks.delta.schema.PARTITION_TYPES`)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def partition_directory(name: str, value: str | None) -> str:
    """``name=value``, Hive-escaped, as Spark names partition directories."""
    text = NULL_PARTITION if value is None else quote(value, safe=SAFE_IN_DIRECTORY)
    return f"{quote(name, safe=SAFE_IN_DIRECTORY)}={text}"


def conform(table: pa.Table, layout: Layout, where: str) -> pa.Table:
    """``table`` with the table's columns in its order and types (a column the rows lack:
    nulls); a NULL in a NOT NULL column is refused."""
    columns = []
    for column_field in layout.table_schema:
        if column_field.name in table.column_names:
            column = table.column(column_field.name).cast(column_field.type)
        else:
            column = pa.nulls(table.num_rows, column_field.type)
        if not column_field.nullable and column.null_count:
            raise SchemaMismatchError(
                f"{where}: column {column_field.name!r} is NOT NULL, but {column.null_count} "
                "row(s) hold NULL there.", fix="filter or fill the NULLs in the query")
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=layout.table_schema)
