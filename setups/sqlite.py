"""SQLite: a fresh database file per target, no server (nothing to kill, no network)."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from setups.base import ProxyFactory, SinkSetup, Target

#: The demo's order-status feed as a table (a CHECK a row can break: a rejected row).
ORDERS_DDL = (
    "CREATE TABLE orders (event_id INTEGER NOT NULL, order_id INTEGER NOT NULL, "
    "status TEXT NOT NULL CHECK (status <> 'bogus'), ts TEXT)"
)
STAGED = ("SELECT name FROM sqlite_master WHERE type = 'table' "
          "AND substr(name, 1, 16) = '_twophase_stage:'")


def orders_database(path: Path) -> Path:
    """``path``, a new SQLite database with an empty ``orders`` table."""
    with contextlib.closing(sqlite3.connect(path)) as connection, connection:
        connection.execute(ORDERS_DDL)
    return path


class SQLiteSetup(SinkSetup):
    name = "sqlite"
    factory = "sinks.sqlite:SQLiteSink"
    networked = False
    model_ci_examples = 30

    @classmethod
    @contextlib.contextmanager
    def started(cls, scratch: Path, proxy: ProxyFactory | None = None) -> Iterator[SQLiteSetup]:
        yield cls(scratch)

    @classmethod
    @contextlib.contextmanager
    def over(cls, scratch: Path, servers: Mapping[str, Any]) -> Iterator[SQLiteSetup]:
        yield cls(scratch / "sqlite")

    def target_options(self, **overrides: Any) -> dict[str, Any]:
        self.scratch.mkdir(parents=True, exist_ok=True)
        database = orders_database(self.scratch / f"orders-{self.number()}.db")
        return {"path": str(database), "table": "orders", **overrides}

    def visible(self, target: Target) -> list[int]:
        return [row[0] for row in self._query(target, "SELECT event_id FROM orders")]

    def in_doubt(self, target: Target) -> list[Any]:
        """The staging tables left in the database (each an unfinished transaction)."""
        return [row[0] for row in self._query(target, STAGED)]

    @staticmethod
    def _query(target: Target, statement: str) -> list[tuple[Any, ...]]:
        with contextlib.closing(sqlite3.connect(target.options["path"])) as connection:
            return list(connection.execute(statement))
