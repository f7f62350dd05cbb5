"""Rows and Arrow record batches as object bytes: Parquet, CSV, JSON Lines (+ gzip).

=========  ======================  ===========================  ===============================
format     from record batches     from rows                    cannot hold
=========  ======================  ===========================  ===============================
parquet    ``pyarrow.parquet``,    rows -> Arrow columns in     INTERVAL
           one row group per       chunks of ``chunk_size``
           batch, no per-row
           Python
csv        ``pyarrow.csv``         :mod:`csv`, ISO-8601 times   ARRAY, MAP, STRUCT, BINARY
jsonl      per row (to_pylist)     :mod:`json`, ISO-8601 times  (anything: BINARY as base64,
                                                                DECIMAL as a string, INTERVAL
                                                                as seconds)
=========  ======================  ===========================  ===============================

An encoder writes into a binary, write-only file object (the part buffer of
:mod:`~sinks.s3.upload`) and writes nothing at all until the first row: an empty partition
produces no bytes, hence no object. :func:`unencodable` is what ``check_schema`` reports.
"""

from __future__ import annotations

import base64
import csv
import datetime as dt
import io
import json
import zlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any, Literal, Protocol

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from twophase import Column
from twophase.kit import chunks

Format = Literal["parquet", "csv", "jsonl"]
FORMATS: tuple[Format, ...] = ("parquet", "csv", "jsonl")
Compression = Literal["gzip"] | None
EXTENSIONS: dict[str, str] = {"parquet": "parquet", "csv": "csv", "jsonl": "jsonl"}
CONTENT_TYPES: dict[str, str] = {"parquet": "application/vnd.apache.parquet",
                                 "csv": "text/csv", "jsonl": "application/x-ndjson"}
_CANNOT_HOLD: dict[str, tuple[str, ...]] = {
    "parquet": ("interval",),
    "csv": ("array<", "map<", "struct<", "binary"),
    "jsonl": (),
}
_GZIP_WBITS = 31  # zlib's gzip container


class BinaryOut(Protocol):
    def write(self, data: bytes, /) -> int: ...


def extension(fmt: Format, compression: Compression) -> str:
    return EXTENSIONS[fmt] + (".gz" if compression == "gzip" else "")


def unencodable(fmt: Format, columns: Sequence[Column]) -> list[str]:
    """``name type`` of every column ``fmt`` cannot hold."""
    return [f"{c.name} {c.type}" for c in columns
            if any(c.type.lower().startswith(bad) for bad in _CANNOT_HOLD[fmt])]


# -- Spark SQL types as Arrow types (the rows path of Parquet) --------------------------------

_SIMPLE: dict[str, pa.DataType] = {
    "boolean": pa.bool_(), "tinyint": pa.int8(), "smallint": pa.int16(), "int": pa.int32(),
    "bigint": pa.int64(), "float": pa.float32(), "double": pa.float64(), "string": pa.string(),
    "binary": pa.binary(), "date": pa.date32(), "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"), "void": pa.null(),
}


def _split_top(text: str) -> list[str]:
    """``a,b<c,d>,e`` -> ``["a", "b<c,d>", "e"]``."""
    out, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += (char in "<(") - (char in ">)")
        if char == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return [part.strip() for part in out]


def arrow_type(spark_type: str) -> pa.DataType:
    """The Arrow type of a Spark ``simpleString`` type (``decimal(10,2)``, ``array<int>``)."""
    t = spark_type.strip()
    lower = t.lower()
    if lower in _SIMPLE:
        return _SIMPLE[lower]
    if lower in ("integer", "long", "short", "byte"):
        return _SIMPLE[{"integer": "int", "long": "bigint", "short": "smallint",
                        "byte": "tinyint"}[lower]]
    if lower.startswith("decimal"):
        precision, scale = (int(x) for x in t[t.index("(") + 1:-1].split(","))
        return pa.decimal128(precision, scale)
    if lower.startswith("array<"):
        return pa.list_(arrow_type(t[6:-1]))
    if lower.startswith("map<"):
        key, value = _split_top(t[4:-1])
        return pa.map_(arrow_type(key), arrow_type(value))
    if lower.startswith("struct<"):
        fields = [part.split(":", 1) for part in _split_top(t[7:-1]) if part]
        return pa.struct([pa.field(name, arrow_type(inner)) for name, inner in fields])
    raise ValueError(f"no Arrow type for Spark type {spark_type!r}")


# -- encoders ----------------------------------------------------------------------------------

class Gzip:
    """A streaming gzip writer in front of ``out`` (memory: zlib's window)."""

    def __init__(self, out: BinaryOut) -> None:
        self._out = out
        self._zip = zlib.compressobj(6, zlib.DEFLATED, _GZIP_WBITS)

    def write(self, data: bytes) -> int:
        if packed := self._zip.compress(data):
            self._out.write(packed)
        return len(data)

    def close(self) -> None:
        self._out.write(self._zip.flush())


class Encoder(ABC):
    """Rows or batches in, bytes out; :meth:`close` writes what ends the object."""

    def __init__(self, out: BinaryOut, columns: Sequence[Column], *,
                 compression: Compression = None, chunk_size: int) -> None:
        self._gzip = Gzip(out) if compression == "gzip" else None
        self.out: BinaryOut = self._gzip or out
        self.columns = tuple(columns)
        self.names = [c.name for c in self.columns]
        self.chunk_size = chunk_size
        self.rows = 0

    @abstractmethod
    def write_rows(self, rows: Iterable[Sequence[Any]]) -> None: ...

    def write_batches(self, batches: Iterable[pa.RecordBatch]) -> None:
        for batch in batches:
            self.write_rows(zip(*(col.to_pylist() for col in batch.columns), strict=True))

    def close(self) -> None:
        if self._gzip is not None and self.rows:
            self._gzip.close()


class ParquetEncoder(Encoder):
    """Each record batch (or chunk of rows) becomes a row group; the footer at :meth:`close`."""

    def __init__(self, out: BinaryOut, columns: Sequence[Column], *,
                 compression: Compression = None, chunk_size: int,
                 parquet_compression: str = "snappy") -> None:
        super().__init__(out, columns, compression=None, chunk_size=chunk_size)
        self._parquet_compression = parquet_compression
        self._writer: Any = None

    def _write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.out, batch.schema,
                                            compression=self._parquet_compression)
        self._writer.write_batch(batch)
        self.rows += batch.num_rows

    def write_batches(self, batches: Iterable[pa.RecordBatch]) -> None:
        for batch in batches:
            self._write(batch)

    def write_rows(self, rows: Iterable[Sequence[Any]]) -> None:
        schema = pa.schema([pa.field(c.name, arrow_type(c.type), c.nullable)
                            for c in self.columns])
        for chunk in chunks(rows, self.chunk_size):
            arrays = [pa.array([row[i] for row in chunk], type=field.type)
                      for i, field in enumerate(schema)]
            self._write(pa.RecordBatch.from_arrays(arrays, schema=schema))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    return value


class CsvEncoder(Encoder):
    """A header, then one line per row (RFC 4180 quoting; NULL is an empty field)."""

    def _header(self) -> None:
        if self.rows == 0:
            text = io.StringIO()
            csv.writer(text, lineterminator="\n").writerow(self.names)
            self.out.write(text.getvalue().encode())

    def write_rows(self, rows: Iterable[Sequence[Any]]) -> None:
        for chunk in chunks(rows, self.chunk_size):
            self._header()
            text = io.StringIO()
            csv.writer(text, lineterminator="\n").writerows(
                [_csv_value(v) for v in row] for row in chunk)
            self.out.write(text.getvalue().encode())
            self.rows += len(chunk)

    def write_batches(self, batches: Iterable[pa.RecordBatch]) -> None:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            self._header()
            buffer = io.BytesIO()
            pacsv.write_csv(batch, buffer, pacsv.WriteOptions(include_header=False))
            self.out.write(buffer.getvalue())
            self.rows += batch.num_rows


def _json_value(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


class JsonLinesEncoder(Encoder):
    """One JSON object per row, keys in column order."""

    def write_rows(self, rows: Iterable[Sequence[Any]]) -> None:
        names = self.names
        for chunk in chunks(rows, self.chunk_size):
            text = "".join(json.dumps(dict(zip(names, row, strict=True)), default=_json_value,
                                      separators=(",", ":")) + "\n" for row in chunk)
            self.out.write(text.encode())
            self.rows += len(chunk)


def encoder(fmt: Format, out: BinaryOut, columns: Sequence[Column], *,
            compression: Compression, chunk_size: int) -> Encoder:
    classes: dict[str, type[Encoder]] = {"parquet": ParquetEncoder, "csv": CsvEncoder,
                                         "jsonl": JsonLinesEncoder}
    return classes[fmt](out, columns, compression=compression, chunk_size=chunk_size)
