"""SQLiteSink in the keyed mode: the keyed contract (:mod:`twophase.testing.keyed`) over a fresh
database file per test."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from sinks.sqlite import SQLiteSink
from twophase.testing.keyed import KeyedContract, KeyedTarget, State


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
