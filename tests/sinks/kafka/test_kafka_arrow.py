"""sinks.kafka.arrow: the column-wise encoder gives, type by type, the very bytes the row path
gives (keys, JSON values, headers, topics), including the values it leaves to Python (floats
that are not finite, binary, nested, strings with control characters). No broker needed."""

from __future__ import annotations

import math
from datetime import UTC, date, datetime
from decimal import Decimal

import pyarrow as pa
import pytest

from sinks.kafka.arrow import columns_of
from sinks.kafka.records import RecordShape

BATCH = pa.record_batch({
    "i": pa.array([1, None, -3]),
    "f": pa.array([1.5, None, 3.0]),
    "nan": pa.array([math.nan, math.inf, 1e-7]),
    "b": pa.array([True, None, False]),
    "s": pa.array(['a"b\\c', None, "ünï €"]),
    "ctl": pa.array(["x\ny", "t\x01", None]),
    "d": pa.array([date(2026, 1, 2), None, date(1, 1, 1)]),
    "ts": pa.array([datetime(2026, 11, 1, tzinfo=UTC), None,
                    datetime(2026, 11, 1, 1, 2, 3, 4500, tzinfo=UTC)],
                   pa.timestamp("us", tz="UTC")),
    "berlin": pa.array([datetime(2026, 11, 1, 5, tzinfo=UTC)] * 3,
                       pa.timestamp("us", tz="Europe/Berlin")),
    "naive": pa.array([datetime(2026, 11, 1, 5, 0, 0, 1), datetime(2026, 11, 1), None],
                      pa.timestamp("us")),
    "ms": pa.array([datetime(2026, 11, 1, 5, tzinfo=UTC)] * 3, pa.timestamp("ms", tz="UTC")),
    "dec": pa.array([Decimal("12.30"), None, Decimal("-0.01")], pa.decimal128(10, 2)),
    "tiny": pa.array([Decimal("1E-9"), Decimal(0), None], pa.decimal128(20, 9)),
    "bin": pa.array([b"\x00\x01", None, b""]),
    "list": pa.array([[1, 2], None, []]),
    "struct": pa.array([{"a": 1}, None, {"a": None}]),
})


@pytest.mark.parametrize("shape", [
    RecordShape(topic="t", key="i"),
    RecordShape(topic="t", key="s", headers=("s", "i", "bin", "ts")),
    RecordShape(topic_column="ctl", key="ts", value="bin"),
    RecordShape(topic="t", key="dec", value="s"),
], ids=["json-values", "headers", "topic-column", "value-column"])
def test_column_wise_records_are_the_row_paths_records(shape: RecordShape) -> None:
    encode = shape.encoder()
    expected = [encode(row) for row in BATCH.to_pylist()]
    assert list(columns_of(shape, BATCH).records()) == expected

