"""Exact file statistics: what a reader may skip a file by, never a bound that is wrong.

Readers (Spark, DuckDB, delta-rs) skip a file when a filter cannot match its ``minValues`` /
``maxValues``: a bound that is off skips rows silently. So every file gets ``numRecords`` and
``nullCount`` (of each top-level column), and min/max only where their JSON form is exact:

================================  ================================================================
Arrow type (Delta type)           min / max
================================  ================================================================
int8 .. int64 (byte .. long)      exact (JSON integers)
date32 (date)                     exact (``YYYY-MM-DD``)
string (string)                   exact, the whole string (Delta compares UTF-8 bytes, as Arrow)
float32 / float64                 exact, unless the file holds a NaN or an infinity (JSON has
(float, double)                   neither; a NaN sorts above every number in Spark): then omitted
timestamp[us, UTC] (timestamp)    widened to the millisecond readers keep: min floored, max
                                  ceiled (``...T12:00:00.123Z``)
anything else (boolean, decimal,  omitted (no bound: the file is always read)
binary, timestamp_ntz)
================================  ================================================================
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

MILLISECOND = dt.timedelta(milliseconds=1)
MICROS_PER_MILLI = 1000
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class FileStats:
    """The statistics of one file, accumulated batch by batch as it is written."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.records = 0
        self.nulls: dict[str, int] = {name: 0 for name in schema.names}
        self.low: dict[str, Any] = {}
        self.high: dict[str, Any] = {}
        #: Columns whose bounds are not exact in this file (a NaN or an infinity seen).
        self.inexact: set[str] = set()

    def add(self, batch: pa.RecordBatch) -> None:
        self.records += batch.num_rows
        for field, column in zip(self.schema, batch.columns, strict=True):
            self.nulls[field.name] += column.null_count
            if _bounded(field.type) and field.name not in self.inexact:
                self._widen(field, column)

    def _widen(self, field: pa.Field, column: pa.Array) -> None:
        if pa.types.is_floating(field.type) and column.null_count < len(column) and (
                pc.any(pc.is_nan(column)).as_py() or pc.any(pc.is_inf(column)).as_py()):
            self.inexact.add(field.name)
            self.low.pop(field.name, None)
            self.high.pop(field.name, None)
            return
        bounds = pc.min_max(column)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if low is None:
            return
        name = field.name
        self.low[name] = low if name not in self.low else min(self.low[name], low)
        self.high[name] = high if name not in self.high else max(self.high[name], high)

    def to_json(self) -> str:
        """The ``stats`` of the file's ``AddAction``."""
        return json.dumps({
            "numRecords": self.records,
            "minValues": {name: _json_value(value, floor=True)
                          for name, value in self.low.items()},
            "maxValues": {name: _json_value(value, floor=False)
                          for name, value in self.high.items()},
            "nullCount": self.nulls,
        }, separators=(",", ":"), allow_nan=False)


def _bounded(kind: pa.DataType) -> bool:
    """Whether a column of this type gets min/max at all (see the module docstring)."""
    return (pa.types.is_integer(kind) or pa.types.is_date32(kind) or pa.types.is_string(kind)
            or pa.types.is_large_string(kind) or pa.types.is_floating(kind)
            or (pa.types.is_timestamp(kind) and kind.tz is not None))


def _json_value(value: Any, *, floor: bool) -> Any:
    if isinstance(value, dt.datetime):
        return _millis(value, floor=floor).isoformat(timespec="milliseconds").replace(
            "+00:00", "Z")
    if isinstance(value, dt.date):
        return value.isoformat()
    return value


def _millis(moment: dt.datetime, *, floor: bool) -> dt.datetime:
    """``moment`` rounded to the millisecond: down for a min, up for a max."""
    micros = (moment - _EPOCH) // dt.timedelta(microseconds=1)
    millis = micros // MICROS_PER_MILLI if floor else -(-micros // MICROS_PER_MILLI)
    return _EPOCH + millis * MILLISECOND
