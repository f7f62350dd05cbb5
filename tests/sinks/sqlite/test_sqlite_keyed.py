"""SQLiteSink in the keyed mode: the keyed contract (:mod:`twophase.testing.keyed`) over a fresh
database file per test."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from sinks.sqlite import SQLiteSink
from twophase import SchemaMismatchError
from twophase.testing.contract import prepare
from twophase.testing.keyed import KEYED_COLUMNS, KeyedContract, KeyedTarget, State


class SQLiteKeyedTarget(KeyedTarget):
    def __init__(self, path: Path) -> None:
        self.path = path
        with sqlite3.connect(path) as connection:
            connection.execute("CREATE TABLE orders_live (order_id INTEGER PRIMARY KEY, "
                               "status TEXT, version INTEGER NOT NULL)")

    def sink(self, **options: Any) -> SQLiteSink:
        chosen = {"mode": "keyed", "key": ("order_id",), "version": "version",
                  "deleted": "op", **options}
        return SQLiteSink(self.path, "orders_live", **chosen)

    def state(self) -> State:
        with sqlite3.connect(self.path) as connection:
            rows = connection.execute("SELECT order_id, status, version FROM orders_live")
            return {order_id: (status, version) for order_id, status, version in rows}

    def tombstones(self) -> dict[int, int]:
        with sqlite3.connect(self.path) as connection:
            return dict(connection.execute(
                'SELECT order_id, version FROM "_twophase_tombstones_orders_live"'))


class TestSQLiteKeyed(KeyedContract):
    @pytest.fixture
    def keyed_target(self, tmp_path: Path) -> SQLiteKeyedTarget:
        return SQLiteKeyedTarget(tmp_path / "state.db")


@pytest.mark.parametrize("arrow", [False, True], ids=["rows", "arrow"])
def test_a_change_without_a_version_is_refused_at_its_write(tmp_path: Path, arrow: bool) -> None:
    target = SQLiteKeyedTarget(tmp_path / "state.db")
    sink = target.sink()
    with pytest.raises(SchemaMismatchError, match="null key or version"):
        prepare(sink, [(1, "paid", 1, "u"), (2, "paid", None, "u")], columns=KEYED_COLUMNS,
                arrow=arrow)
    assert target.state() == {}
