"""Arrow record batches as Spark's Arrow writer sends them, for testing ``write_arrow``
without Spark::

    from twophase.testing.arrow import record_batches
    from twophase.testing.contract import ORDER_COLUMNS, orders

    batches = record_batches(orders(0, 5), ORDER_COLUMNS, rows_per_batch=2)
    sink.write_arrow(txn, batches)

Columns are :class:`~twophase.Column` s with Spark's type strings (``DataType.simpleString()``:
``bigint``, ``string``, ``decimal(12,3)``, ``timestamp``, ...); a ``timestamp`` (an instant)
becomes ``timestamp[us, tz=UTC]``, as the data source path hands it to a sink. Needs pyarrow.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from twophase.sink import Column

_DECIMAL_RE = re.compile(r"^decimal\((\d+),(\d+)\)$")
_SIMPLE_TYPES: dict[str, pa.DataType] = {
    "boolean": pa.bool_(), "tinyint": pa.int8(), "smallint": pa.int16(), "int": pa.int32(),
    "bigint": pa.int64(), "float": pa.float32(), "double": pa.float64(), "string": pa.string(),
    "binary": pa.binary(), "date": pa.date32(), "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
}


def arrow_type(spark_type: str) -> pa.DataType:
    """The Arrow type Spark sends for a column of ``spark_type`` (flat types only)."""
    if (decimal := _DECIMAL_RE.match(spark_type)) is not None:
        return pa.decimal128(int(decimal.group(1)), int(decimal.group(2)))
    try:
        return _SIMPLE_TYPES[spark_type]
    except KeyError:
        raise ValueError(f"no Arrow type for Spark type {spark_type!r} here; build the "
                         "record batches with pyarrow directly") from None


def arrow_schema(columns: Sequence[Column]) -> pa.Schema:
    """The schema of the record batches Spark sends for ``columns``."""
    return pa.schema([pa.field(c.name, arrow_type(c.type), c.nullable) for c in columns])


def record_batches(rows: Sequence[Sequence[Any]], columns: Sequence[Column], *,
                   rows_per_batch: int = 1024) -> list[pa.RecordBatch]:
    """``rows`` (tuples in the order of ``columns``) as record batches of at most
    ``rows_per_batch`` rows: small ones make a sink's chunks slice across batches."""
    schema = arrow_schema(columns)
    return [pa.RecordBatch.from_pylist([dict(zip(schema.names, row, strict=True))
                                        for row in rows[start:start + rows_per_batch]],
                                       schema=schema)
            for start in range(0, len(rows), rows_per_batch)]
