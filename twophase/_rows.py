"""What a sink receives: Arrow record batches with UTC timestamps, or rows of plain Python values.

Spark's own Row conversion turns a ``TIMESTAMP`` into a *naive* datetime in the Python worker's
local time zone, so the same job writes different values on differently configured hosts (and
an ambiguous one in the hour a clock falls back). twophase converts itself, from Arrow on the
data source path and from ``unix_micros`` on the ``foreachBatch`` path, so that every sink gets
the types documented in :mod:`twophase.sink`: a ``TIMESTAMP`` is an aware ``datetime`` in UTC
(an instant), a ``TIMESTAMP_NTZ`` a naive ``datetime`` (a wall-clock value), whatever the
workers' ``TZ`` and ``spark.sql.session.timeZone``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import pyarrow as pa

#: Spark's type name (``DataType.simpleString()``) of an instant; a wall clock is
#: ``timestamp_ntz``, which needs no conversion.
INSTANT_TYPE = "timestamp"
ARROW_UTC = "UTC"
_PYTHON_UTC = "+00:00"  # a fixed offset: pyarrow gives datetime.timezone.utc for it
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def with_utc_timestamps(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with every zoned timestamp column in UTC (the same instants, no copy)."""
    return _with_timestamps_in(batch, ARROW_UTC)


def rows_of(batches: Iterable[pa.RecordBatch]) -> Iterator[tuple[Any, ...]]:
    """The rows of Arrow record batches as tuples of the Python types :mod:`twophase.sink` lists."""
    for batch in batches:
        if batch.num_columns == 0:
            yield from (() for _ in range(batch.num_rows))
            continue
        yield from zip(*columns_of(batch), strict=True)


def columns_of(batch: pa.RecordBatch | pa.Table) -> list[list[Any]]:
    """The columns of a record batch or table as lists of the values :func:`rows_of` gives."""
    utc = _with_timestamps_in(batch, _PYTHON_UTC)
    return [column.to_pylist(maps_as_pydicts="strict") for column in utc.columns]


#: A record batch or a table (a function of either returns the same kind).
ArrowT = TypeVar("ArrowT", "pa.RecordBatch", "pa.Table")


def _with_timestamps_in(batch: ArrowT, zone: str) -> ArrowT:
    import pyarrow as pa  # noqa: PLC0415 - pyarrow is needed only on the data source path

    zoned = [i for i, field in enumerate(batch.schema)
             if pa.types.is_timestamp(field.type) and field.type.tz not in (None, zone)]
    if not zoned:
        return batch
    columns = list(batch.columns)
    for i in zoned:
        columns[i] = columns[i].cast(pa.timestamp(batch.schema.field(i).type.unit, tz=zone))
    return type(batch).from_arrays(columns, names=batch.schema.names)


def instant_from_micros(micros: int | None) -> datetime | None:
    """Spark's internal ``TIMESTAMP`` value (microseconds since the epoch) as an aware datetime."""
    return None if micros is None else _EPOCH + timedelta(microseconds=micros)


def positions(type_names: Sequence[str], wanted: str) -> tuple[int, ...]:
    """Positions of the columns of Spark type ``wanted`` (a prefix if it ends in ``<``)."""
    return tuple(i for i, name in enumerate(type_names)
                 if name == wanted or (wanted.endswith("<") and name.startswith(wanted)))


def plain_rows(rows: Iterable[Sequence[Any]], *, instants: Sequence[int],
               structs: Sequence[int]) -> Iterator[tuple[Any, ...]]:
    """Spark Rows as the Arrow path gives them: ``instants`` positions hold ``unix_micros``
    values (made aware datetimes), ``structs`` positions Spark Rows (made dicts)."""
    for row in rows:
        values = list(row)
        for i in instants:
            values[i] = instant_from_micros(values[i])
        for i in structs:
            if values[i] is not None:
                values[i] = values[i].asDict(recursive=True)
        yield tuple(values)


T = TypeVar("T")


def chunks(rows: Iterable[T], chunk_size: int) -> Iterator[list[T]]:
    """``rows`` in lists of at most ``chunk_size``, read lazily (memory: one chunk)."""
    iterator = iter(rows)
    while chunk := list(islice(iterator, chunk_size)):
        yield chunk


def batch_chunks(batches: Iterable[pa.RecordBatch], chunk_size: int
                 ) -> Iterator[list[pa.RecordBatch]]:
    """Record batches regrouped into lists of at most ``chunk_size`` rows (slices: no copies;
    no list is empty): :func:`chunks` for the data source path."""
    chunk: list[pa.RecordBatch] = []
    size = 0
    for batch in batches:
        start = 0
        while start < batch.num_rows:
            piece = batch.slice(start, chunk_size - size)
            chunk.append(piece)
            size += piece.num_rows
            start += piece.num_rows
            if size == chunk_size:
                yield chunk
                chunk, size = [], 0
    if chunk:
        yield chunk
