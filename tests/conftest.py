"""Shared fixtures. Servers are real processes started here and stopped at the end of the run."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from sinks.sqlite import SQLiteSink

pytest_plugins = ["tests.servers.mariadb", "tests.servers.moto", "tests.servers.spark",
                  "tests.servers.spark_cluster", "tests.servers.connect",
                  "tests.servers.http_receiver", "tests.servers.kafka", "tests.servers.postgres",
                  "tests.servers.prometheus"]

ORDERS_DDL = (
    "CREATE TABLE orders (event_id INTEGER NOT NULL, order_id INTEGER NOT NULL, "
    "status TEXT NOT NULL CHECK (status <> 'bogus'), ts TEXT)"
)
MYSQL_ORDERS_DDL = (
    "CREATE TABLE `{table}` (event_id BIGINT NOT NULL PRIMARY KEY, order_id BIGINT NOT NULL, "
    "status VARCHAR(16) NOT NULL CHECK (status <> 'bogus'), ts DATETIME(6)) ENGINE=InnoDB"
)


@pytest.fixture
def orders_db(tmp_path: Path) -> Path:
    """A SQLite database with an empty ``orders`` table (the demo's order-status feed)."""
    path = tmp_path / "orders.db"
    with sqlite3.connect(path) as connection:
        connection.execute(ORDERS_DDL)
    return path


@pytest.fixture
def sqlite_sink(orders_db: Path) -> SQLiteSink:
    return SQLiteSink(orders_db, "orders")


@pytest.fixture
def sqlite_reader(orders_db: Path) -> Iterator[sqlite3.Connection]:
    connection = sqlite3.connect(orders_db)
    yield connection
    connection.close()
