"""Rows to Kafka records: topic, key, value and headers, with as little Python per row as can be.

============  ==================================================================================
part          from
============  ==================================================================================
topic         ``topic=`` (fixed), or the string column ``topic_column=``
key           the column ``key=`` (str as UTF-8, bytes as is, anything else as its JSON text);
              none: Kafka spreads the records over the partitions. Same key, same partition.
value         the column ``value=`` as is (str as UTF-8, bytes; None is a tombstone), or by
              default the row as one JSON object (timestamps ISO 8601, decimals as strings,
              bytes as base64, intervals as seconds)
headers       the columns ``headers=``, each one header named after its column (UTF-8 / bytes)
============  ==================================================================================


From Arrow, :mod:`~sinks.kafka.arrow` makes the same records column-wise.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from twophase import Column, SchemaMismatchError

#: What a record is built from: one row as a mapping of column name to value.
Row = Mapping[str, Any]
Record = tuple[str, bytes | None, bytes | None, list[tuple[str, str | bytes | None]] | None]
TEXT_TYPES = frozenset({"string", "binary"})


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode()
    if isinstance(value, timedelta):
        return value.total_seconds()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


encode_json = json.JSONEncoder(separators=(",", ":"), default=_json_default,
                                ensure_ascii=False).encode


def as_bytes(value: Any) -> bytes | None:
    """A key, value or header as bytes: str as UTF-8, bytes as is, others as JSON text."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return encode_json(value).encode()


@dataclass(frozen=True)
class RecordShape:
    """Which columns make the topic, key, value and headers of a record."""

    topic: str | None = None
    topic_column: str | None = None
    key: str | None = None
    value: str | None = None
    headers: tuple[str, ...] = ()

    def columns(self) -> list[str]:
        named = [self.topic_column, self.key, self.value, *self.headers]
        return [name for name in named if name is not None]

    def check(self, columns: Sequence[Column]) -> None:
        """Refuse rows that miss a named column or cannot give a topic or value as text."""
        types = {column.name: column.type.lower() for column in columns}
        missing = [name for name in self.columns() if name not in types]
        if missing:
            raise SchemaMismatchError(
                f"KafkaSink: the rows have no column {', '.join(map(repr, missing))} "
                f"(they have {', '.join(types)}).",
                fix="select the column in the query or fix key= / value= / topic_column= / "
                    "headers=")
        for option, name in (("topic_column", self.topic_column), ("value", self.value)):
            if name is not None and types[name] not in TEXT_TYPES:
                raise SchemaMismatchError(
                    f"KafkaSink: {option}={name!r} is a {types[name]} column.",
                    fix=f"cast it to string or binary, or drop {option}= (values default to "
                        "the row as JSON)")

    def encoder(self) -> Callable[[Row], Record]:
        """The function from a row to ``(topic, key, value, headers)``."""
        fixed_topic, topic_column = self.topic or "", self.topic_column
        key, value, headers = self.key, self.value, self.headers

        def encode(row: Row) -> Record:
            return (
                fixed_topic if topic_column is None else str(row[topic_column]),
                None if key is None else as_bytes(row[key]),
                encode_json(row).encode() if value is None else as_bytes(row[value]),
                [(name, as_bytes(row[name]) or b"") for name in headers] or None,
            )

        return encode

