"""Arrow record batches as ``LOAD DATA`` text, column by column with ``pyarrow.compute``.

The text holds the values that :func:`sinks.mysql.encoding.encode_tsv` writes for the rows of
the same batches (what ``twophase.kit.rows_of`` makes of them), without a line of Python per
row: ``\\N`` for NULL; backslash, tab, newline, carriage return and NUL escaped the same way in
strings and in binary values; booleans ``1``/``0``; integers, decimals and dates as Arrow
prints them; floats (FLOAT widened to DOUBLE first, as Python sees it) in shortest round-trip
form; a timestamp with a zone as its UTC wall-clock time with microseconds, one without as it
is. Where the two differ in spelling the server reads the same value (``-0`` vs ``-0.0``,
``00:00:00.000000`` vs ``00:00:00``).

Types without a kernel here (nested ARRAY/MAP/STRUCT, INTERVAL, dictionary-encoded columns)
are encoded value by value with the row path's encoder, for that column only: the same result
as the row path, NULLs written and a non-NULL nested value refused with a SchemaMismatchError
naming the column. A timestamp whose UTC time falls outside the years 1-9999 (which Python,
and so the row path, cannot represent) raises OverflowError naming the column.

The sink takes its chunks from :func:`chunks_ahead`: a helper thread takes the next chunk from
Spark's batches and encodes it while the server loads the current one (pyarrow's reads and
kernels release the GIL), one chunk ahead at most.

Only ``MySQLXASink.write_arrow`` imports this module: the sink works without pyarrow.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sinks.mysql.encoding import ESCAPES, NULL, tsv_field
from twophase.kit import batch_chunks, rows_of

_TEXT = pa.large_binary()
_NULL = pa.scalar(NULL.encode(), _TEXT)
_TRUE, _FALSE = pa.scalar(b"1", _TEXT), pa.scalar(b"0", _TEXT)
_TAB, _NEWLINE, _EMPTY = (pa.scalar(text, _TEXT) for text in (b"\t", b"\n", b""))
_MICROS = pa.timestamp("us")
_FIRST_MICROS = -62_135_596_800_000_000  # 0001-01-01 00:00:00 UTC
_LAST_MICROS = 253_402_300_799_999_999  # 9999-12-31 23:59:59.999999 UTC
#: Chunks read and encoded ahead of the one being loaded (each holds ``chunk_size`` rows twice:
#: as Arrow and as text).
CHUNKS_AHEAD = 1


@dataclass(frozen=True)
class ArrowChunk:
    """A chunk of the record batches given to ``write_arrow``: slices of at most
    ``chunk_size`` rows in all."""

    batches: Sequence[pa.RecordBatch]
    #: The LOAD DATA text, if encoded already (by :func:`chunks_ahead`).
    text: Sequence[pa.Buffer] | None = None

    def __len__(self) -> int:
        return sum(batch.num_rows for batch in self.batches)

    def misfit(self, width: int) -> int | None:
        return next((batch.num_columns for batch in self.batches
                     if batch.num_columns != width), None)

    def tsv(self) -> Sequence[pa.Buffer]:
        if self.text is not None:
            return self.text
        return [encode_batch(batch) for batch in self.batches]

    def rows(self) -> list[tuple[Any, ...]]:
        return list(rows_of(self.batches))

    def encoded(self) -> ArrowChunk:
        """This chunk with its text; as it is if encoding fails (``tsv`` then raises the
        error where the sink loads it, as without the read-ahead)."""
        try:
            return ArrowChunk(self.batches, self.tsv())
        except Exception:  # raised again by tsv() in the loading thread
            return self


def chunks_ahead(batches: Iterable[pa.RecordBatch], chunk_size: int, *, encode: bool
                 ) -> Generator[ArrowChunk, None, None]:
    """The chunks of :func:`~twophase.kit.batch_chunks`, read (and encoded, if ``encode``) on
    a helper thread :data:`CHUNKS_AHEAD` chunk ahead of the caller. An error reading the batches
    is raised here. Close it (``contextlib.closing``) when the caller stops early: the helper
    stops after the chunk it is on and is joined, so that nothing reads Spark's batches after
    that."""
    ready: queue.Queue[ArrowChunk | BaseException | None] = queue.Queue(CHUNKS_AHEAD)
    stop = threading.Event()

    def produce() -> None:
        try:
            for batches_of_chunk in batch_chunks(batches, chunk_size):
                chunk = ArrowChunk(batches_of_chunk)
                ready.put(chunk.encoded() if encode else chunk)
                if stop.is_set():
                    return
            ready.put(None)
        except BaseException as exc:  # handed to the caller, raised there
            ready.put(exc)

    helper = threading.Thread(target=produce, name="mysql-chunks-ahead", daemon=True)
    helper.start()
    try:
        while (item := ready.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        with contextlib.suppress(queue.Empty):  # room for the one put it may be blocked on
            ready.get_nowait()
        helper.join()


def encode_batch(batch: pa.RecordBatch) -> pa.Buffer:
    """One record batch as LOAD DATA text (see the module docstring)."""
    if batch.num_columns == 0:
        return pa.py_buffer(b"\n" * batch.num_rows)
    fields = [field_text(column, name) for column, name in zip(batch.columns, batch.schema.names,
                                                                  strict=True)]
    lines = pc.binary_join_element_wise(*fields, _TAB)
    lines = pc.binary_join_element_wise(lines, _EMPTY, _NEWLINE)  # each line ends in "\n"
    _validity, offsets, data = lines.buffers()
    bounds = pa.Array.from_buffers(pa.int64(), len(lines) + 1, [None, offsets],
                                   offset=lines.offset)
    start, end = bounds[0].as_py(), bounds[-1].as_py()
    return data.slice(start, end - start)


def field_text(column: pa.Array, name: str) -> pa.Array:
    """A column's values as LOAD DATA fields: a large_binary array without NULLs."""
    kind = column.type
    text: pa.Array
    if pa.types.is_boolean(kind):
        text = pc.if_else(column, _TRUE, _FALSE)
    elif pa.types.is_timestamp(kind):
        text = _printed(_wall_clock(column, name))
    elif pa.types.is_floating(kind):
        text = _printed(column.cast(pa.float64()))
    elif _printable(kind):
        text = _printed(column)
    elif _bytes_like(kind):
        text = _escaped(column.cast(_TEXT))
    else:
        text = _per_value(column, name)
    return pc.fill_null(text, _NULL)


def _printable(kind: pa.DataType) -> bool:
    return any(test(kind) for test in (pa.types.is_null, pa.types.is_integer,
                                       pa.types.is_decimal, pa.types.is_date, pa.types.is_time))


def _bytes_like(kind: pa.DataType) -> bool:
    return any(test(kind) for test in (pa.types.is_string, pa.types.is_large_string,
                                       pa.types.is_binary, pa.types.is_large_binary,
                                       pa.types.is_fixed_size_binary))


def _printed(column: pa.Array) -> pa.Array:
    """Arrow's own text of each value (digits, dates, times: nothing to escape)."""
    return column.cast(pa.string()).cast(_TEXT)


def _escaped(text: pa.Array) -> pa.Array:
    for char, escaped in ESCAPES:  # backslash first
        if pc.any(pc.match_substring(text, char)).as_py():
            text = pc.replace_substring(text, char, escaped)
    return text


def _wall_clock(column: pa.Array, name: str) -> pa.Array:
    """Microsecond timestamps without zone: an instant's UTC wall clock, a wall clock as is."""
    kind = column.type
    if kind.unit != "us":
        column = column.cast(pa.timestamp("us", kind.tz), safe=False)
    naive = column.cast(_MICROS)  # a zoned timestamp's values are UTC already
    lowest, highest = pc.min_max(naive.cast(pa.int64())).values()
    if lowest.is_valid and (lowest.as_py() < _FIRST_MICROS or highest.as_py() > _LAST_MICROS):
        raise OverflowError(f"column {name!r} holds a timestamp outside the years 1-9999 "
                            "(in UTC)")
    return naive


def _per_value(column: pa.Array, name: str) -> pa.Array:
    """The row path's encoder, value by value, for a type without a kernel here."""
    values = column.to_pylist(maps_as_pydicts="strict")
    return pa.array([tsv_field(value, name).encode("utf-8", "surrogateescape")
                     for value in values], _TEXT)
