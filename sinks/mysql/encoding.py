"""Rows as MySQL takes them: ``LOAD DATA`` text, and the literals of a multi-row ``INSERT``.

``LOAD DATA`` text is tab-separated, one row per line, with ``\\N`` for NULL and these bytes of a
value escaped by a backslash: backslash, tab (``\\t``), newline (``\\n``), carriage return
(``\\r``) and NUL (``\\0``). Booleans are ``1``/``0``, floats their shortest round-trip form,
decimals plain digits, binary values their raw bytes (escaped alike). The Arrow path
(:mod:`sinks.mysql.arrow`) writes the same text from record batches.

Time zones: an aware ``datetime`` (a Spark ``TIMESTAMP``, an instant; twophase hands it over
with tzinfo=UTC) is sent as its UTC wall-clock time; a naive one (a Spark ``TIMESTAMP_NTZ``, a
wall-clock value) is sent unchanged, never read as local time. Both bulk paths do the same, and
every session of the sink is in UTC (:mod:`sinks.mysql.connection`), so a ``TIMESTAMP`` column
holds the right instant, a ``DATETIME`` column its UTC wall-clock time.

Values: ``None``, ``bool``, ``int``, ``float``, ``decimal.Decimal``, ``str``, ``bytes`` (also
``bytearray``, ``memoryview``), ``datetime.date``, ``datetime.datetime``, ``datetime.time`` and
``datetime.timedelta`` (MySQL ``TIME``). Anything else (``list``, ``dict``, ...) fails the branch
with a SchemaMismatchError naming the column (on the ``INSERT`` path an unknown class may
instead reach the server as its ``str()``).
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pymysql
from pymysql.converters import escape_datetime, escape_time, escape_timedelta

from sinks.mysql.errors import unsupported_value
from twophase.kit import as_utc

NULL = "\\N"
#: What LOAD DATA reads back as the byte itself (``ESCAPED BY '\\'``); backslash goes first.
ESCAPES = (("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n"), ("\r", "\\r"), ("\x00", "\\0"))


def utc_naive(moment: dt.datetime) -> dt.datetime:
    """``moment`` as a naive UTC wall-clock time: aware input converted to UTC, naive unchanged.

    Naive input is a wall-clock value (a Spark TIMESTAMP_NTZ), never read as local time.
    """
    return as_utc(moment).replace(tzinfo=None)


# -- LOAD DATA text ----------------------------------------------------------------------------

def _tsv_str(value: str) -> str:
    if not ("\\" in value or "\t" in value or "\n" in value or "\r" in value
            or "\x00" in value):
        return value
    for char, escaped in ESCAPES:
        value = value.replace(char, escaped)
    return value


def _tsv_bytes(value: bytes | bytearray | memoryview) -> str:
    # surrogateescape round-trips any byte string through str and back to the same bytes
    return _tsv_str(bytes(value).decode("utf-8", "surrogateescape"))


def _tsv_datetime(value: dt.datetime) -> str:
    return utc_naive(value).isoformat(" ")


def _unquoted(escape: Callable[[Any], str]) -> Callable[[Any], str]:
    return lambda value: escape(value).strip("'")


_TSV_ENCODERS: dict[type, Callable[[Any], str]] = {
    str: _tsv_str,
    int: int.__repr__,
    float: float.__repr__,
    bool: lambda value: "1" if value else "0",
    type(None): lambda value: NULL,
    bytes: _tsv_bytes,
    bytearray: _tsv_bytes,
    memoryview: _tsv_bytes,
    decimal.Decimal: lambda value: format(value, "f"),
    dt.datetime: _tsv_datetime,
    dt.date: dt.date.isoformat,
    dt.time: _unquoted(escape_time),
    dt.timedelta: _unquoted(escape_timedelta),
}


def tsv_field(value: Any, column: str) -> str:
    """One value as LOAD DATA text, whatever its class (a subclass of a supported one too)."""
    encode = _TSV_ENCODERS.get(type(value))
    if encode is not None:
        return encode(value)
    for kind, encode in _TSV_ENCODERS.items():
        if kind is not type(None) and isinstance(value, kind):
            return encode(value)
    raise unsupported_value(column, value)


def encode_tsv(rows: Sequence[Sequence[Any]], columns: Sequence[str]) -> bytes:
    """Rows as LOAD DATA text (see the module docstring).

    Raises OverflowError for an aware datetime whose UTC time has no year MySQL can store.
    """
    encoders = _TSV_ENCODERS
    try:  # the fast path: exact types only, one dict lookup per value
        text = "".join(["\t".join([encoders[type(v)](v) for v in row]) + "\n" for row in rows])
    except KeyError:
        text = "".join("\t".join([tsv_field(v, c) for v, c in zip(row, columns, strict=True)])
                       + "\n" for row in rows)
    return text.encode("utf-8", "surrogateescape")


class Chunk(Protocol):
    """Up to ``chunk_size`` rows on their way into one statement, as text or as rows."""

    def __len__(self) -> int: ...

    def misfit(self, width: int) -> int | None:
        """The number of values of a row that does not have ``width``, if any."""

    def tsv(self) -> Sequence[Any]:
        """The rows as LOAD DATA text, in bytes-like parts (OverflowError: see encode_tsv)."""

    def rows(self) -> Sequence[Sequence[Any]]:
        """The rows as tuples of Python values, for INSERT."""


@dataclass(frozen=True)
class RowChunk:
    """A chunk of the rows given to ``write``."""

    values: Sequence[Sequence[Any]]
    columns: Sequence[str]

    def __len__(self) -> int:
        return len(self.values)

    def misfit(self, width: int) -> int | None:
        return next((len(row) for row in self.values if len(row) != width), None)

    def tsv(self) -> list[bytes]:
        return [encode_tsv(self.values, self.columns)]

    def rows(self) -> Sequence[Sequence[Any]]:
        return self.values


# -- INSERT literals ---------------------------------------------------------------------------

def _escape_datetime(value: dt.datetime, mapping: Any = None) -> str:
    """PyMySQL's datetime literal, of :func:`utc_naive` (PyMySQL itself drops any tzinfo)."""
    return str(escape_datetime(utc_naive(value), mapping))


#: PyMySQL's conversions, with datetimes sent as naive UTC like the LOAD DATA path sends them.
CONVERSIONS: dict[Any, Any] = {**pymysql.converters.conversions, dt.datetime: _escape_datetime}
