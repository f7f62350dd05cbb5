"""Arrow record batches to Kafka records column-wise: no Python per row (:func:`columns_of`).

Whole columns are encoded at once by pyarrow's compute kernels: each column becomes the JSON
text of its values (integers, booleans, strings, dates, microsecond timestamps, decimals of
scale <= 6; floats by ``float.__repr__`` over the column, as :mod:`json` writes them), and the
row objects are joined column-wise. Columns of other types (binary, nested, non-finite
floats...) and string columns holding control characters are encoded value by value with the
row path's JSON encoder (:data:`~sinks.kafka.records.encode_json`), so both paths give the same
bytes, which ``tests/test_kafka_arrow.py`` checks type by type.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sinks.kafka.records import Record, RecordShape, encode_json
from twophase.kit import DELETED_FLAG

#: Decimals whose ``str`` is never in exponent notation (what Arrow's cast to string gives).
MAX_PLAIN_DECIMAL_SCALE = 6
#: JSON's escapes that pyarrow's kernels apply (control characters go value by value).
_JSON_ESCAPES = (("\\", "\\\\"), ('"', '\\"'))
_CONTROL_CHARACTERS = "[\\x00-\\x1f]"
UTC_ZONES = frozenset({"UTC", "Etc/UTC", "+00:00", "Z"})
UTC_OFFSET = "+00:00"
ZERO_FRACTION = ".000000"


@dataclass(frozen=True)
class RecordColumns:
    """One Arrow batch as records, column-wise: a list (or one fixed topic) per part."""

    topics: str | list[str]
    keys: list[bytes | None] | None
    values: list[bytes | None]
    headers: list[list[tuple[str, str | bytes | None]]] | None

    def records(self) -> Iterable[Record]:
        """The records, row by row (the producer's loop is the only per-row step)."""
        count = len(self.values)
        topics = [self.topics] * count if isinstance(self.topics, str) else self.topics
        keys = self.keys if self.keys is not None else [None] * count
        headers = self.headers if self.headers is not None else [None] * count
        return zip(topics, keys, self.values, headers, strict=True)


def columns_of(shape: RecordShape, batch: pa.RecordBatch) -> RecordColumns:
    """``batch`` as the topics, keys, values and headers of its records, column-wise."""
    topics: str | list[str] = shape.topic or ""
    if shape.topic_column is not None:
        topics = [str(topic) for topic in batch.column(shape.topic_column).to_pylist()]
    keys = None if shape.key is None else _bytes_of(batch.column(shape.key))
    values = (_json_objects(batch) if shape.value is None
              else _bytes_of(batch.column(shape.value)))
    return RecordColumns(topics, keys, values, _headers_of(shape, batch))


def changelog_columns(shape: RecordShape, batch: pa.RecordBatch, version: str,
                      version_header: str) -> RecordColumns:
    """A keyed batch (the written columns and :data:`~twophase.kit.DELETED_FLAG`, one change
    per key) as records: a flagged row's value null (a tombstone), every record with the
    version header (:mod:`~sinks.kafka.changelog`)."""
    flags: list[bool] = batch.column(DELETED_FLAG).to_pylist()
    body = batch.select([name for name in batch.schema.names if name != DELETED_FLAG])
    records = columns_of(shape, body)
    values = [None if deleted else value
              for deleted, value in zip(flags, records.values, strict=True)]
    named = records.headers or [[] for _ in range(batch.num_rows)]
    headers = [[*row, (version_header, stamp)] for row, stamp in zip(
        named, _bytes_of(batch.column(version)), strict=True)]
    return RecordColumns(records.topics, records.keys, values, headers)


def _headers_of(shape: RecordShape,
                batch: pa.RecordBatch) -> list[list[tuple[str, str | bytes | None]]] | None:
    if not shape.headers:
        return None
    named = [(name, _bytes_of(batch.column(name))) for name in shape.headers]
    return [[(name, column[row] or b"") for name, column in named]
            for row in range(batch.num_rows)]


def _bytes_of(column: pa.Array) -> list[bytes | None]:
    """Each value as :func:`as_bytes` makes it: text as UTF-8, bytes as is, others as JSON."""
    kind = column.type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
        column = _json_texts(column)
    values: list[bytes | None] = column.cast(pa.binary()).to_pylist()
    return values


def _json_objects(batch: pa.RecordBatch) -> list[bytes | None]:
    """Every row as one JSON object (keys in column order, nulls as ``null``), column-wise."""
    if batch.num_columns == 0:
        return [b"{}"] * batch.num_rows
    parts: list[Any] = []
    for index, name in enumerate(batch.schema.names):
        parts.append(("{" if index == 0 else ",") + encode_json(name) + ":")
        parts.append(pc.fill_null(_json_texts(batch.column(index)), "null"))
    parts.append("}")
    joined = pc.binary_join_element_wise(*parts, "")
    values: list[bytes | None] = joined.cast(pa.binary()).to_pylist()
    return values


def _json_texts(column: pa.Array) -> pa.Array:
    """The JSON text of each value of ``column`` (null stays null), as a string array."""
    kind = column.type
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        return column.cast(pa.string())
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        if not pc.any(pc.match_substring_regex(column, _CONTROL_CHARACTERS)).as_py():
            for raw, escaped in _JSON_ESCAPES:
                column = pc.replace_substring(column, raw, escaped)
            return _quoted(column.cast(pa.string()))
    elif pa.types.is_date32(kind) or (
            pa.types.is_decimal(kind) and kind.scale <= MAX_PLAIN_DECIMAL_SCALE):
        return _quoted(column.cast(pa.string()))
    elif pa.types.is_timestamp(kind) and kind.unit == "us":
        return _quoted(_iso_timestamps(column))
    elif pa.types.is_floating(kind) and pc.all(pc.is_finite(column)).as_py() is not False:
        return pa.array([None if value is None else float.__repr__(value)
                         for value in column.to_pylist()], pa.string())
    return pa.array([None if value is None else encode_json(value)
                     for value in column.to_pylist()], pa.string())


def _quoted(texts: pa.Array) -> pa.Array:
    return pc.binary_join_element_wise('"', texts, '"', "")


def _iso_timestamps(column: pa.Array) -> pa.Array:
    """``datetime.isoformat()`` of microsecond timestamps: no fraction when it is zero, the
    offset of the column's time zone as ``+HH:MM`` when it has one (UTC, what Spark hands
    over, by a plain cast: ``strftime`` with a zone is ten times slower)."""
    zone = column.type.tz
    if zone is None or zone in UTC_ZONES:
        wall = column.cast(pa.timestamp("us")).cast(pa.string())
        texts = pc.replace_substring(wall, " ", "T", max_replacements=1)
        offset = None if zone is None else UTC_OFFSET
    else:
        texts = pc.strftime(column, "%Y-%m-%dT%H:%M:%S")
        offset = pc.strftime(column, "%Ez")
    texts = pc.replace_substring(texts, ZERO_FRACTION, "")  # its only "." is the fraction's
    return texts if offset is None else pc.binary_join_element_wise(texts, offset, "")
