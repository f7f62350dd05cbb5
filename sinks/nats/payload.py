"""Rows to message payloads: the row as one JSON object (the default), or one column as is;
and a chunk of payloads as one staged message (:func:`framed`, :func:`unframed`).

JSON: keyed by column name; values JSON has no type for are written losslessly as text:
``DECIMAL`` as a string (exact), ``TIMESTAMP`` in ISO 8601 UTC (``+00:00``), ``TIMESTAMP_NTZ``
and ``DATE`` in ISO 8601 without a zone, ``BINARY`` as base64, ``INTERVAL`` as seconds; a
non-finite float becomes ``null``, as JSON has none. ``value=``: a STRING column (UTF-8) or a
BINARY one, its bytes as the payload; a NULL there is an empty payload.
"""

from __future__ import annotations

import base64
import json
import math
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from sinks.nats.errors import SYSTEM
from twophase import Column, SchemaMismatchError
from twophase.kit import as_utc

Row = Sequence[Any]
Encode = Callable[[Row], bytes]
#: A payload's length before it in a staged chunk (big-endian, 4 bytes).
FRAME = struct.Struct(">I")
#: A staged chunk closes at this many bytes of payloads (a server's max_payload is 1 MiB by
#: default) or :data:`CHUNK_ROWS` rows, whichever comes first.
CHUNK_BYTES = 256 * 1024
CHUNK_ROWS = 10_000
#: The Spark types a ``value=`` column may have.
VALUE_TYPES = ("string", "binary")


def _moment(value: datetime) -> str:
    return (as_utc(value) if value.utcoffset() is not None else value).isoformat()


#: How each non-JSON Spark value becomes text or a number.
_BY_TYPE: dict[type, Callable[[Any], Any]] = {
    datetime: _moment, date: date.isoformat, time: time.isoformat, Decimal: str,
    timedelta: timedelta.total_seconds,
    bytes: lambda value: base64.b64encode(value).decode("ascii"),
    bytearray: lambda value: base64.b64encode(value).decode("ascii"),
}


def plain(value: Any) -> Any:
    """A JSON-native value for one Spark value (recursively for arrays, maps and structs)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    convert = _BY_TYPE.get(type(value))
    return convert(value) if convert is not None else value


def json_payload(names: Sequence[str]) -> Encode:
    """The row as one compact JSON object keyed by ``names``."""
    def encode(row: Row) -> bytes:
        record = {name: plain(value) for name, value in zip(names, row, strict=True)}
        return json.dumps(record, separators=(",", ":"), allow_nan=False).encode()
    return encode


def value_payload(index: int) -> Encode:
    """Column ``index`` as the payload, as is."""
    def encode(row: Row) -> bytes:
        value = row[index]
        if value is None:
            return b""
        return value.encode() if isinstance(value, str) else bytes(value)
    return encode


def encoder(columns: Sequence[Column], value: str | None) -> Encode:
    """The payload of a row of ``columns``: JSON, or the ``value`` column (checked)."""
    names = [column.name for column in columns]
    if value is None:
        return json_payload(names)
    check_value_column(columns, value)
    return value_payload(names.index(value))


def check_value_column(columns: Sequence[Column], value: str) -> None:
    """Refuse a ``value=`` column the rows lack or that is neither STRING nor BINARY."""
    found = next((column for column in columns if column.name == value), None)
    if found is None:
        raise SchemaMismatchError(
            f"{SYSTEM}: value={value!r} names no column of the rows "
            f"({', '.join(column.name for column in columns)}).",
            fix="pass value= a STRING or BINARY column of the query, or drop it to send each "
                "row as a JSON object")
    if found.type not in VALUE_TYPES:
        raise SchemaMismatchError(
            f"{SYSTEM}: value={value!r} is a {found.type} column; a payload is bytes.",
            fix=f"cast it to STRING or BINARY in the query (e.g. to_json(...) AS {value}), or "
                "drop value= to send each row as a JSON object")


def chunked(payloads: Iterable[bytes], max_bytes: int = CHUNK_BYTES,
            max_rows: int = CHUNK_ROWS) -> Iterator[list[bytes]]:
    """``payloads`` in chunks of at most ``max_bytes`` (a larger payload alone) and
    ``max_rows``, in order; none empty."""
    chunk: list[bytes] = []
    size = 0
    for payload in payloads:
        if chunk and (size + len(payload) > max_bytes or len(chunk) == max_rows):
            yield chunk
            chunk, size = [], 0
        chunk.append(payload)
        size += len(payload)
    if chunk:
        yield chunk


def framed(chunk: Sequence[bytes]) -> bytes:
    """A chunk of payloads as one staged message: each payload after its length."""
    return b"".join(part for payload in chunk for part in (FRAME.pack(len(payload)), payload))


def unframed(data: bytes) -> list[bytes]:
    """The payloads of a staged message, in order (:func:`framed` undone)."""
    view, payloads, at = memoryview(data), [], 0
    while at < len(view):
        (length,) = FRAME.unpack_from(view, at)
        at += FRAME.size
        payloads.append(bytes(view[at:at + length]))
        at += length
    return payloads
