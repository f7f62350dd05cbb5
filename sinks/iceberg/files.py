"""The table's data files: Parquet with the table's field ids, named by their transaction, in
the table's data area, described in the handle as the commit's ``DataFile`` needs them.

A transaction's files go where the table's own writers put theirs: ``<location>/data/``, in
the partition spec's directories (``status=paid/``, ``day=2026-11-26/``), never elsewhere
(:mod:`~sinks.iceberg.schema` refuses the settings that move them). Each is named
``<txn id>-<n>.parquet`` and listed by the transaction's intent before it is created
(:class:`~twophase.kit.lake.LakeIntents`), created exclusively
(:class:`~twophase.kit.lake.LakeStorage`: a transaction id used twice never overwrites the first
use's file).

Each file carries the table's field ids (a reader maps columns by id) and, in its
:class:`IcebergFile`, what Iceberg keeps of it: record count, size, partition record and the
Parquet footer, from which the driver derives the column statistics (pyiceberg's
``data_file_statistics_from_parquet_metadata``, with the table's metrics settings): the
commit never reads a file back, and the executors never import pyiceberg
(:mod:`~sinks.iceberg.layout`).
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from sinks.iceberg.layout import Layout, PartitionKey
from twophase import TxnId
from twophase.kit.lake import LakeFiles, LakeOutput, LakeStorage

#: Where a table's writers put its data files, under its location.
DATA_DIRECTORY = "data"


def file_name(txn_id: TxnId, number: int) -> str:
    return f"{txn_id}-{number:05d}.parquet"


@dataclass(frozen=True)
class IcebergFile:
    """One written file as the commit's ``DataFile`` needs it; ``path`` relative to the table's
    location, ``created`` in milliseconds since the epoch (its deadline's start), ``footer``:
    the file's Parquet footer (base64), from which the driver derives the column statistics
    Iceberg keeps (:func:`~sinks.iceberg.snapshots.data_file`), never reading the file."""

    path: str
    size: int
    created: int
    records: int
    partition: PartitionKey
    spec_id: int
    footer: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "created": self.created,
                "records": self.records, "partition": list(self.partition),
                "spec_id": self.spec_id, "footer": self.footer}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> IcebergFile:
        return cls(data["path"], int(data["size"]), int(data["created"]), int(data["records"]),
                   tuple(data["partition"]), int(data["spec_id"]), str(data["footer"]))

    @classmethod
    def unsealed(cls, path: str) -> IcebergFile:
        """A file an intent names, as an abort needs it: its path alone."""
        return cls(path, 0, 0, 0, (), 0)

    def metadata(self) -> pq.FileMetaData:
        """The file's Parquet footer."""
        return pq.read_metadata(pa.BufferReader(base64.b64decode(self.footer)))


def _footer(metadata: pq.FileMetaData) -> str:
    out = pa.BufferOutputStream()
    metadata.write_metadata_file(out)
    return base64.b64encode(out.getvalue().to_pybytes()).decode("ascii")


class _OpenFile:
    """One Parquet file being written."""

    def __init__(self, output: LakeOutput, path: str, layout: Layout,
                 partition: PartitionKey) -> None:
        self.output, self.path, self.layout, self.partition = output, path, layout, partition
        self.writer = pq.ParquetWriter(output.stream, layout.arrow_schema,
                                       compression=layout.compression)
        self.records = 0

    @property
    def size(self) -> int:
        return self.output.stream.tell()

    def write(self, table: pa.Table) -> None:
        self.writer.write_table(table)
        self.records += table.num_rows

    def close(self) -> IcebergFile:
        self.writer.close()
        stat = self.output.seal()
        return IcebergFile(self.path, stat.size, stat.modification_time, self.records,
                           self.partition, self.layout.spec_id,
                           _footer(self.writer.writer.metadata))

    def abandon(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()
        self.output.abandon()


def transaction_files(storage: LakeStorage, layout: Layout, txn_id: TxnId,
                      max_file_bytes: int) -> LakeFiles[PartitionKey, IcebergFile]:
    """The files of one transaction (:class:`~twophase.kit.lake.LakeFiles`) in the data area."""

    def path_of(key: PartitionKey, number: int) -> str:
        return "/".join(part for part in (DATA_DIRECTORY, layout.partition_path(key),
                                          file_name(txn_id, number)) if part)

    def open_file(output: LakeOutput, relative: str, key: PartitionKey) -> _OpenFile:
        return _OpenFile(output, relative, layout, key)

    return LakeFiles(storage, txn_id, max_file_bytes,
                     partitions=layout.partitions,
                     path_of=path_of, open_file=open_file)
