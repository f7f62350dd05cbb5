"""The table's data files: named by their transaction, written as Parquet, deleted.

A transaction's files go where the table's own writers put theirs, in the ordinary data area:
the table's root, or its partition directories (``status=paid/``), never a ``_``-prefixed
folder (VACUUM ignores those, so a file there is never cleaned up). Each is named
``part-<txn id>-<n>.parquet`` (``n``: 00000, 00001, ... per transaction), and listed by the
transaction's intent (:class:`~twophase.kit.lake.LakeIntents`) before it is created. A file is
created exclusively (:class:`~twophase.kit.lake.LakeStorage`): a transaction id used twice never
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
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake.transaction import AddAction

from sinks.delta.schema import Layout
from sinks.delta.stats import FileStats
from twophase import TxnId
from twophase.kit.lake import LakeFiles, LakeOutput, LakeStorage

log = logging.getLogger(__name__)

#: Hive's directory name of a NULL partition value.
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
#: Characters kept beyond letters, digits and "_.-~" in a partition directory's name (none: the
#: rest are %-escaped, as delta-rs names them).
SAFE_IN_DIRECTORY = ""

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

    def __init__(self, output: LakeOutput, path: str, schema: pa.Schema,
                 partition_values: Mapping[str, str | None]) -> None:
        self.output, self.path, self.partition_values = output, path, partition_values
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
        return DataFile(self.path, stat.size, dict(self.partition_values),
                        stat.modification_time, self.stats.to_json())

    def abandon(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()
        self.output.abandon()


def transaction_files(storage: LakeStorage, layout: Layout, txn_id: TxnId,
                      max_file_bytes: int) -> LakeFiles[PartitionKey, DataFile]:
    """The files of one transaction (:class:`~twophase.kit.lake.LakeFiles`): one open file per
    partition value of the table, in its partition directories."""

    def path_of(key: PartitionKey, number: int) -> str:
        return "/".join([*(partition_directory(name, value) for name, value in
                           zip(layout.partition_by, key, strict=True)),
                         file_name(txn_id, number)])

    def open_file(output: LakeOutput, relative: str, key: PartitionKey) -> _OpenFile:
        return _OpenFile(output, relative, layout.file_schema,
                         dict(zip(layout.partition_by, key, strict=True)))

    return LakeFiles(storage, txn_id, max_file_bytes,
                     partitions=lambda table: by_partition(table, layout.partition_by),
                     path_of=path_of, open_file=open_file)


def by_partition(table: pa.Table, partition_by: tuple[str, ...]
                 ) -> Iterator[tuple[PartitionKey, pa.Table]]:
    """The rows of each partition value, without the partition columns."""
    if not partition_by:
        yield (), table
        return
    keys = list(zip(*(table.column(name).to_pylist() for name in partition_by), strict=True))
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
