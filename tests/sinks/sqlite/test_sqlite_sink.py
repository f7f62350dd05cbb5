"""sinks.sqlite at the sink level, against a real SQLite database file: the shared contract
suite, and what only this sink does (trial inserts, upsert, values, schema checks, errors)."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pytest

from sinks.sqlite import SQLiteSink
from twophase import (
    AbortOutcome,
    Column,
    ConfigurationError,
    SchemaMismatchError,
)
from twophase.testing.contract import (
    ORDER_COLUMNS,
    SinkContract,
    abort,
    commit,
    context,
    list_in_doubt,
    orders,
    prepare,
)


def visible(reader: sqlite3.Connection) -> list[int]:
    return [row[0] for row in reader.execute("SELECT event_id FROM orders ORDER BY event_id")]


class TestSQLiteContract(SinkContract):
    """The contract over a fresh database file per test."""

    setup_fixture = "sqlite_setup"


def stage_tables(reader: sqlite3.Connection) -> list[str]:
    return [row[0] for row in reader.execute(
        "SELECT name FROM sqlite_master WHERE name GLOB '_twophase_stage:*'")]


def test_a_row_violating_a_constraint_fails_at_pre_commit_and_nothing_is_visible(
    sqlite_sink: SQLiteSink, sqlite_reader: sqlite3.Connection
) -> None:
    rows = [*orders(0, 3), (3, 1003, "bogus", None)]
    with pytest.raises(SchemaMismatchError,
                       match=r"CHECK constraint failed.*Fix: a row violates a constraint"):
        prepare(sqlite_sink, rows, batch=4)
    assert visible(sqlite_reader) == []
    assert list_in_doubt(sqlite_sink, "orders") == []  # discarded by the failing writer


def test_staged_rows_of_a_writer_that_died_are_in_doubt_until_aborted(
    sqlite_sink: SQLiteSink, sqlite_reader: sqlite3.Connection
) -> None:
    txn = sqlite_sink.begin_transaction(context(batch=3))
    sqlite_sink.write(txn, orders(0, 5))
    txn.connection.close()  # the executor died between write and pre-commit
    (leftover,) = list_in_doubt(sqlite_sink, "orders")
    assert leftover.txn_id == txn.ctx.txn_id
    assert abort(sqlite_sink, leftover) is AbortOutcome.ABORTED
    assert list_in_doubt(sqlite_sink, "orders") == []
    assert visible(sqlite_reader) == []


def test_upsert_keeps_the_last_row_per_key_within_and_across_transactions(tmp_path: Path) -> None:
    path = tmp_path / "status.db"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE status (order_id INTEGER PRIMARY KEY, status TEXT)")
    sink = SQLiteSink(path, "status", mode="upsert", key=("order_id",))
    columns = (Column("order_id", "bigint"), Column("status", "string"))
    sink.check_schema(columns)
    first = prepare(sink, [(1, "created"), (2, "created"), (1, "paid")], columns=columns)
    second = prepare(sink, [(2, "shipped")], columns=columns, batch=1)
    commit(sink, first)
    commit(sink, second)
    with sqlite3.connect(path) as connection:
        assert connection.execute("SELECT * FROM status ORDER BY 1").fetchall() == [
            (1, "paid"), (2, "shipped")]


def test_values_spark_hands_over_are_stored(sqlite_sink: SQLiteSink,
                                           sqlite_reader: sqlite3.Connection) -> None:
    ts = datetime(2026, 11, 21, 18, 0, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    handle = prepare(sqlite_sink, [(1, 2, "paid", ts)])
    commit(sqlite_sink, handle)
    assert sqlite_reader.execute("SELECT ts FROM orders").fetchone() == (
        "2026-11-21T12:30:00.000000+00:00",)  # the instant, in UTC, in a fixed-width form
    columns = (*ORDER_COLUMNS[:3], Column("ts", "decimal(10,2)"))
    commit(sqlite_sink, prepare(sqlite_sink, [(2, 2, "paid", Decimal("1.50"))], columns=columns,
                               batch=1))
    assert sqlite_reader.execute("SELECT ts FROM orders WHERE event_id = 2").fetchone() == ("1.50",)


def test_schema_check_names_the_missing_column_and_the_fix(sqlite_sink: SQLiteSink) -> None:
    columns = (*ORDER_COLUMNS, Column("coupon", "string"))
    with pytest.raises(SchemaMismatchError,
                       match=r"table 'orders' of SQLite .* has no column 'coupon'.*Fix: ALTER"):
        sqlite_sink.check_schema(columns)
    sqlite_sink.check_schema(ORDER_COLUMNS)


def test_schema_check_of_a_missing_table_and_a_non_unique_upsert_key(orders_db: Path) -> None:
    with pytest.raises(SchemaMismatchError, match=r"table 'nope' of SQLite .* does not exist"):
        SQLiteSink(orders_db, "nope").check_schema(ORDER_COLUMNS)
    with pytest.raises(SchemaMismatchError, match=r"upsert key \['order_id'\] is not a PRIMARY"):
        upsert = SQLiteSink(orders_db, "orders", mode="upsert", key=("order_id",))
        upsert.check_schema(ORDER_COLUMNS)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"table": ""}, "needs a table name"),
    ({"table": "t", "mode": "merge"}, "unknown mode 'merge'"),
    ({"table": "t", "mode": "upsert"}, "needs the key columns"),
    ({"table": "t", "chunk_size": 0}, "chunk_size=0 must be a positive integer"),
])
def test_wrong_options_are_refused_with_a_fix(orders_db: Path, kwargs: dict[str, object],
                                             message: str) -> None:
    with pytest.raises(ConfigurationError, match=f"{message}.* Fix: "):
        SQLiteSink(orders_db, **kwargs)  # type: ignore[arg-type]


def test_in_doubt_listing_is_per_namespace_and_target(sqlite_sink: SQLiteSink,
                                                     orders_db: Path) -> None:
    mine = prepare(sqlite_sink, orders(0, 1), namespace="ord_rs")
    prepare(sqlite_sink, orders(1, 1), namespace="payments")
    prepare(sqlite_sink, orders(2, 1), namespace="ordXrs")  # '_' is no wildcard
    with sqlite3.connect(orders_db) as connection:
        connection.execute("CREATE TABLE archive AS SELECT * FROM orders")
    prepare(SQLiteSink(orders_db, "archive"), orders(3, 1), namespace="ord_rs", partition=1)
    assert [h.txn_id for h in list_in_doubt(sqlite_sink, "ord_rs")] == [mine.txn_id]


