"""The bulk statements: ``COPY ... FROM STDIN`` for inserts, ``INSERT ... ON CONFLICT`` for
upserts.

Insert mode copies: record batches (Spark's data source path) are written as CSV by Arrow's
own writer, column by column, and streamed to ``COPY ... (FORMAT csv)``: no Python per row.
Arrow's CSV is what PostgreSQL reads back as the same values: strings always quoted (so an
empty string is ``""`` and NULL the empty field), a zoned timestamp as its UTC time with ``Z``,
booleans ``true``/``false``, decimals and dates as digits. Types Arrow cannot write as CSV
(binary, nested) go through psycopg's row copy instead (``copy.write_row``), as rows from
``write`` always do. Upsert mode sends ``INSERT ... ON CONFLICT (key) DO UPDATE`` (psycopg
pipelines ``executemany``): COPY cannot update; the keyed mode the same, guarded by the version
(:mod:`~sinks.postgres.keyed`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from psycopg import sql

from sinks.postgres.connection import Connection
from sinks.postgres.errors import wrong_width
from sinks.postgres.schema import Table
from twophase.kit import rows_of

if TYPE_CHECKING:
    import pyarrow as pa


def _copy_sql(target: Table, columns: Sequence[str], csv: bool) -> sql.Composed:
    statement = "COPY {} ({}) FROM STDIN" + (" (FORMAT csv)" if csv else "")
    return sql.SQL(statement).format(target.ident,
                                     sql.SQL(", ").join(map(sql.Identifier, columns)))


def copy_rows(conn: Connection, target: Table, columns: Sequence[str],
              rows: Iterable[Sequence[Any]]) -> None:
    """``COPY`` rows of Python values (psycopg adapts each value)."""
    with conn.cursor() as cursor, cursor.copy(_copy_sql(target, columns, csv=False)) as copy:
        for row in rows:
            copy.write_row(row)


def copy_batches(conn: Connection, target: Table, columns: Sequence[str],
                 batches: Iterable[pa.RecordBatch]) -> int:
    """``COPY`` record batches in one statement, as Arrow's CSV where every column can be,
    else as rows; returns how many rows (memory: one batch and its CSV)."""
    import pyarrow as pa  # noqa: PLC0415 - only the Arrow path needs pyarrow
    import pyarrow.csv as pa_csv  # noqa: PLC0415

    remaining = iter(batches)
    first = next(remaining, None)
    if first is None:
        return 0
    if not all(_csv_writable(kind) for kind in first.schema.types):
        rows = list(rows_of(itertools.chain([first], remaining)))
        copy_rows(conn, target, columns, rows)
        return len(rows)
    options, count = pa_csv.WriteOptions(include_header=False), 0
    with conn.cursor() as cursor, cursor.copy(_copy_sql(target, columns, csv=True)) as copy:
        for batch in itertools.chain([first], remaining):
            if batch.num_rows == 0:
                continue
            if batch.num_columns != len(columns):
                raise wrong_width(batch.num_columns, columns)
            out = pa.BufferOutputStream()
            pa_csv.write_csv(batch, out, write_options=options)
            copy.write(memoryview(out.getvalue()))
            count += batch.num_rows
    return count


def _csv_writable(kind: pa.DataType) -> bool:
    import pyarrow as pa  # noqa: PLC0415

    return any(test(kind) for test in (
        pa.types.is_boolean, pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal,
        pa.types.is_string, pa.types.is_large_string, pa.types.is_date, pa.types.is_timestamp,
        pa.types.is_null))


def upsert_rows(conn: Connection, target: Table, columns: Sequence[str], key: Sequence[str],
                rows: Sequence[Sequence[Any]], *, newer: str | None = None) -> None:
    """``INSERT ... ON CONFLICT (key) DO UPDATE`` every other written column (later rows win;
    with ``newer``, a version column, only where the row's version is older)."""
    names = sql.SQL(", ").join(map(sql.Identifier, columns))
    updates = [sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c))
               for c in columns if c not in key]
    action = (sql.SQL("UPDATE SET ") + sql.SQL(", ").join(updates)) if updates else sql.SQL(
        "NOTHING")
    if updates and newer is not None:
        action += sql.SQL(" WHERE t.{0} < EXCLUDED.{0}").format(sql.Identifier(newer))
    statement = sql.SQL("INSERT INTO {} AS t ({}) VALUES ({}) ON CONFLICT ({}) DO {}").format(
        target.ident, names, sql.SQL(", ").join(sql.Placeholder() * len(columns)),
        sql.SQL(", ").join(map(sql.Identifier, key)), action)
    with conn.cursor() as cursor:
        cursor.executemany(statement, rows)
