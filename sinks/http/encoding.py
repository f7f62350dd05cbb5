"""Rows to request bodies: JSON objects framed as a JSON array or JSON Lines, optionally gzip.

A row becomes one JSON object keyed by column name. Values that JSON has no type for are
written losslessly as text: ``DECIMAL`` as a string (exact), ``TIMESTAMP`` / ``DATE`` in ISO
8601 (an instant with ``+00:00``; a ``TIMESTAMP_NTZ`` without a zone), ``BINARY`` as base64,
``INTERVAL`` as seconds; a non-finite float (NaN, infinity) becomes ``null``, as JSON has none.

:class:`Splitter` cuts a partition's rows into requests of at most ``max_records`` records and
``max_bytes`` bytes of content (a single larger record goes alone), as they stream in.
"""

from __future__ import annotations

import base64
import gzip
import json
import math
from collections.abc import Callable, Sequence
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, Literal

from sinks.http.protocol import GZIP, MEDIA_TYPES

Encoding = Literal["json", "jsonl"]
Compression = Literal["gzip"] | None
ENCODINGS: tuple[Encoding, ...] = ("json", "jsonl")
#: Deterministic gzip: no timestamp in the header, so a body re-encoded is the same bytes.
GZIP_MTIME = 0
GZIP_LEVEL = 6


def _seconds(value: timedelta) -> float:
    return value.total_seconds()


def _base64(value: bytes | bytearray) -> str:
    return base64.b64encode(value).decode("ascii")


def _iso(value: datetime | date | time) -> str:
    return value.isoformat()


#: How each non-JSON Spark value becomes text or a number (DECIMAL as a string: exact).
_CONVERTERS: tuple[tuple[type | tuple[type, ...], Callable[[Any], Any]], ...] = (
    (Decimal, str), ((datetime, date, time), _iso), (timedelta, _seconds),
    ((bytes, bytearray), _base64),
)


def _plain(value: Any) -> Any:
    """A JSON-native value for one Spark value (recursively for arrays, maps and structs)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    for types, convert in _CONVERTERS:
        if isinstance(value, types):
            return convert(value)
    return value


#: The converter of each common non-JSON type, looked up before the general walk.
_BY_TYPE: dict[type, Callable[[Any], Any]] = {
    datetime: _iso, date: _iso, time: _iso, Decimal: str, timedelta: _seconds, bytes: _base64}


def _default(value: Any) -> Any:
    convert = _BY_TYPE.get(type(value))
    if convert is not None:
        return convert(value)
    plain = _plain(value)
    if plain is value:
        raise TypeError(f"cannot encode a {type(value).__name__} as JSON")
    return plain


#: One encoder for every record (``json.dumps`` with options builds a new one per call).
_ENCODER = json.JSONEncoder(default=_default, separators=(",", ":"), ensure_ascii=False,
                            allow_nan=False)


def encode_record(names: Sequence[str], row: Sequence[Any]) -> bytes:
    """One row as a compact JSON object."""
    record = dict(zip(names, row, strict=True))
    try:
        text = _ENCODER.encode(record)
    except ValueError:  # a NaN or an infinity somewhere: null, as JSON has none
        text = _ENCODER.encode(_plain(record))
    return text.encode()


def frame(encoding: Encoding, records: Sequence[bytes]) -> bytes:
    """Encoded records as one request's content."""
    if encoding == "jsonl":
        return b"".join(record + b"\n" for record in records)
    return b"[" + b",".join(records) + b"]"


def compress(content: bytes, compression: Compression) -> bytes:
    if compression == GZIP:
        return gzip.compress(content, compresslevel=GZIP_LEVEL, mtime=GZIP_MTIME)
    return content


def headers_for(encoding: str, compression: str | None) -> dict[str, str]:
    """The content headers of a staged body (as its manifest names them)."""
    headers = {"Content-Type": MEDIA_TYPES[encoding]}
    if compression:
        headers["Content-Encoding"] = compression
    return headers


class Splitter:
    """Groups encoded records into requests of bounded size, as rows arrive."""

    def __init__(self, max_records: int, max_bytes: int) -> None:
        self.max_records = max_records
        self.max_bytes = max_bytes
        self._records: list[bytes] = []
        self._size = 0

    def add(self, record: bytes) -> list[bytes] | None:
        """Take one record; return the records of a full request when this one does not fit."""
        full = None
        if self._records and (len(self._records) >= self.max_records
                              or self._size + len(record) + 1 > self.max_bytes):
            full, self._records, self._size = self._records, [], 0
        self._records.append(record)
        self._size += len(record) + 1
        return full

    def rest(self) -> list[bytes] | None:
        """The last, partly filled request (None if there is none)."""
        rest, self._records, self._size = self._records, [], 0
        return rest or None
