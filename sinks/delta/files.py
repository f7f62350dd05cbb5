"""The table's data files: named by their transaction, written as Parquet, listed, deleted.

A transaction's files go where the table's own writers put theirs, in the ordinary data area:
the table's root, or its partition directories (``status=paid/``), never a ``_``-prefixed
folder (VACUUM ignores those, so a file there is never cleaned up). Each is named
``part-<txn id>-<n>.parquet`` (``n``: 00000, 00001, ... per transaction), so the transaction
of any file found in the data area is read back from its name (:func:`txn_of`) without
opening it. A file is created exclusively: a transaction id used twice never overwrites the
first use's file (a committed one), it fails.

Files are bounded: a writer rolls to a new file once its file reaches ``max_file_bytes``,
writing one row group per chunk of rows (memory: a chunk, and the open row group of each
partition value a partition's rows hit).

Local paths only in this milestone (``/path`` or ``file:///path``): S3 comes with the next.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote, unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake.transaction import AddAction

from sinks.delta.errors import SYSTEM
from sinks.delta.schema import Layout
from sinks.delta.stats import FileStats
from twophase import ConfigurationError, SchemaMismatchError, TxnId

log = logging.getLogger(__name__)

FILE_NAME = re.compile(r"^part-(?P<txn>[A-Za-z0-9_.-]+)-(?P<number>\d{5})\.parquet$")
#: Folders no writer's data lives in: ``_delta_log``, ``_change_data``, hidden files.
HIDDEN_PREFIXES = ("_", ".")
#: Hive's directory name of a NULL partition value.
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
#: Characters kept beyond letters, digits and "_.-~" in a partition directory's name (none: the
#: rest are %-escaped, as delta-rs names them).
SAFE_IN_DIRECTORY = ""
MS_PER_S = 1000
DEFAULT_MAX_FILE_BYTES = 128 * 1024 * 1024

PartitionKey = tuple[str | None, ...]


def local_root(table_uri: str) -> Path:
    """The directory of a table on a local path (``/path`` or ``file:///path``)."""
    parsed = urlparse(table_uri)
    if parsed.scheme not in ("", "file"):
        raise ConfigurationError(
            f"{SYSTEM}: table_uri {table_uri!r}: this version writes tables on a local path "
            "only.", fix="give a local path (or file:///path); object stores come later")
    return Path(unquote(parsed.path) if parsed.scheme else table_uri)


def file_name(txn_id: TxnId, number: int) -> str:
    return f"part-{txn_id}-{number:05d}.parquet"


def txn_of(name: str) -> TxnId | None:
    """The transaction a data file's name names, or None for any other file."""
    match = FILE_NAME.fullmatch(name)
    if match is None:
        return None
    try:
        return TxnId.parse(match.group("txn"))
    except ValueError:
        return None


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

    def action(self) -> AddAction:
        return AddAction(self.path, self.size, dict(self.partition_values),
                         self.modification_time, True, self.stats)

    def local(self, root: Path) -> Path:
        return root / self.path


class _OpenFile:
    """One Parquet file being written."""

    def __init__(self, root: Path, relative: str, schema: pa.Schema,
                 partition_values: Mapping[str, str | None]) -> None:
        self.relative, self.partition_values = relative, partition_values
        self.path = root / relative
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.stream: IO[bytes] = open(self.path, "xb")  # noqa: SIM115 - closed in close()
        self.writer = pq.ParquetWriter(self.stream, schema)
        self.stats = FileStats(schema)

    @property
    def size(self) -> int:
        return self.stream.tell()

    def write(self, table: pa.Table) -> None:
        for batch in table.to_batches():
            self.writer.write_batch(batch)
            self.stats.add(batch)

    def close(self) -> DataFile:
        self.writer.close()
        self.stream.flush()
        os.fsync(self.stream.fileno())
        self.stream.close()
        stat = self.path.stat()
        return DataFile(self.relative, stat.st_size, dict(self.partition_values),
                        int(stat.st_mtime * MS_PER_S), self.stats.to_json())

    def abandon(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()
        with contextlib.suppress(OSError):
            self.stream.close()


@dataclass
class TransactionFiles:
    """The files of one transaction: one open file per partition value, rolled at
    ``max_file_bytes``; closed by :meth:`close`, deleted by :meth:`delete`."""

    root: Path
    layout: Layout
    txn_id: TxnId
    max_file_bytes: int
    rows: int = 0
    closed: list[DataFile] = field(default_factory=list)
    _open: dict[PartitionKey, _OpenFile] = field(default_factory=dict)
    _created: list[Path] = field(default_factory=list)

    def write(self, table: pa.Table) -> None:
        """Rows of the table's columns (partition columns included)."""
        for key, part in self._by_partition(table):
            self._file_of(key).write(part)
            if self._open[key].size >= self.max_file_bytes:
                self.closed.append(self._open.pop(key).close())
        self.rows += table.num_rows

    def close(self) -> list[DataFile]:
        """Close every open file: the transaction's files, durable."""
        self.closed.extend(opened.close() for opened in self._open.values())
        self._open.clear()
        return self.closed

    def delete(self) -> None:
        """Delete every file this transaction created (a discarded transaction); never raises."""
        for opened in self._open.values():
            opened.abandon()
        self._open.clear()
        for path in self._created:
            with contextlib.suppress(OSError):
                path.unlink()

    def _file_of(self, key: PartitionKey) -> _OpenFile:
        if key not in self._open:
            values = dict(zip(self.layout.partition_by, key, strict=True))
            relative = "/".join([*(partition_directory(name, value)
                                   for name, value in values.items()),
                                 file_name(self.txn_id, len(self._created))])
            self._open[key] = _OpenFile(self.root, relative, self.layout.file_schema, values)
            self._created.append(self._open[key].path)
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


def files_of(root: Path, namespace: str) -> dict[TxnId, list[Path]]:
    """Every data file of the namespace's transactions in the data area, by transaction: one
    listing of the root and of its partition directories (``_``- and ``.``-prefixed folders
    skipped), no file opened."""
    found: dict[TxnId, list[Path]] = {}
    for path in _data_area(root):
        txn_id = txn_of(path.name)
        if txn_id is not None and txn_id.namespace == namespace:
            found.setdefault(txn_id, []).append(path)
    return found


def _data_area(directory: Path) -> Iterator[Path]:
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.name.startswith(HIDDEN_PREFIXES):
            continue
        if entry.is_dir(follow_symlinks=False):
            yield from _data_area(Path(entry.path))
        else:
            yield Path(entry.path)


def relative(root: Path, path: Path) -> str:
    """A file found under ``root`` as a :class:`DataFile` names it."""
    return path.relative_to(root).as_posix()


def found_file(root: Path, path: Path) -> DataFile:
    """A file found in the data area as a handle lists it (for its abort): its partition
    values read back from its directories; no statistics."""
    stat = path.stat()
    values: dict[str, str | None] = {}
    for directory in path.relative_to(root).parent.parts:
        name, _, value = directory.partition("=")
        values[unquote(name)] = None if value == NULL_PARTITION else unquote(value)
    return DataFile(relative(root, path), stat.st_size, values, int(stat.st_mtime * MS_PER_S),
                    "")


def delete(paths: Sequence[Path]) -> int:
    """Delete the files that exist; how many were deleted."""
    deleted = 0
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            deleted += 1
    return deleted
