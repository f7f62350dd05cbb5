"""Rows as stream entries, column-wise: a chunk of rows staged as ONE entry (:func:`packed`).

A stream entry is a list of field-value pairs: each row becomes one entry of the target, its
columns the fields (in the query's order), each value as text. A NULL leaves its field out (a
row whose every value is NULL keeps its first field, empty, since an entry needs one).

================================  =============================================================
Spark type                        the field's value
================================  =============================================================
STRING, BINARY                    as is
BOOLEAN                           ``true`` / ``false``
integers, DECIMAL                 decimal text (a DECIMAL with its scale: ``12.300``)
FLOAT, DOUBLE                     the shortest text that reads back the same (``0.1``, ``1``,
                                  ``1e+20``, ``nan``, ``inf``)
DATE                              ``2026-01-02``
TIMESTAMP (an instant)            ISO 8601 in UTC: ``2026-01-02T03:04:05.006000Z``
TIMESTAMP_NTZ (a wall clock)      ``2026-01-02T03:04:05.006000``
ARRAY, MAP, STRUCT                JSON text
================================  =============================================================

Staging moves a chunk of rows in one ``XADD`` of a MessagePack array ``[count, names,
column, ...]`` (each column its values' texts, strings and bytes alike as msgpack's raw
strings: the server's ``cmsgpack`` reads no ``bin`` type); the commit script unpacks it in the
server (Lua's ``cmsgpack``) and adds each row to the target. Both paths, rows and Spark's Arrow
batches, go through the same Arrow kernels, so they write the same text.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any

import msgpack
import pyarrow as pa
import pyarrow.compute as pc

#: The field of a staged chunk entry.
CHUNK_FIELD = b"c"
INSTANT_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
WALL_CLOCK_FORMAT = "%Y-%m-%dT%H:%M:%S"

Text = str | bytes | None


def packed(table: pa.Table | pa.RecordBatch) -> bytes:
    """A chunk of rows as one staged entry's value."""
    value: bytes = msgpack.packb([table.num_rows, list(table.schema.names),
                          *(texts(column) for column in table.columns)], use_bin_type=False)
    return value


def table_of(rows: Sequence[Sequence[Any]], names: Sequence[str]) -> pa.Table:
    """Rows (tuples in the order of ``names``) as a table, each column's type inferred."""
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in names]
    return pa.table({name: pa.array(values) for name, values in zip(names, columns,
                                                                     strict=True)})


def texts(column: pa.Array | pa.ChunkedArray) -> list[Text]:
    """Each value of ``column`` as the text its field holds (the module's table)."""
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind) \
            or pa.types.is_large_binary(kind) or pa.types.is_null(kind):
        values: list[Text] = column.to_pylist()
        return values
    if pa.types.is_timestamp(kind):
        if kind.tz is None:
            return _listed(pc.strftime(column, format=WALL_CLOCK_FORMAT))
        return _listed(pc.strftime(column.cast(pa.timestamp(kind.unit, tz="UTC")),
                                   format=INSTANT_FORMAT))
    if pa.types.is_nested(kind):
        return [None if value is None else _json(value) for value in column.to_pylist()]
    return _listed(column.cast(pa.string()))


def _listed(column: pa.Array | pa.ChunkedArray) -> list[Text]:
    values: list[Text] = column.to_pylist()
    return values


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _json(value: Any) -> str:
    return json.dumps(value, default=_json_default, separators=(",", ":"), ensure_ascii=False)
