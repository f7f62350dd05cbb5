"""The table the MySQL sink's tests write to on the private MariaDB: its DDL and columns, rows
for it, sinks over it, a task's steps and a run's coordinator over it, and two fixtures.

The fixtures ``table`` (a fresh table) and ``sink`` (a sink over it, its schema checked) are
defined here under other function names; a test module registers them by importing those::

    from tests.sinks.mysql.mysql_table import checked_sink, fresh_table  # noqa: F401 - fixtures
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from setups.servers.mariadb import ConnectionParams, Db, MariaDBServer
from sinks.mysql import MySQLXASink
from twophase import Column, Handle, RetryPolicy
from twophase._coordinator import Coordinator
from twophase._state import StateStore
from twophase._task import run_transaction
from twophase.testing import contract
from twophase.testing.contract import NAMESPACE

COLUMNS = (Column("id", "bigint", False), Column("name", "string"), Column("amount", "double"))
TABLE_DDL = ("CREATE TABLE {table} (id BIGINT NOT NULL PRIMARY KEY, name VARCHAR(16), "
             "amount DOUBLE, CONSTRAINT positive CHECK (amount IS NULL OR amount >= 0)) "
             "ENGINE=InnoDB")
FAST_RETRY = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.05)


def new_query_id() -> str:
    return str(uuid.uuid4())


def rows_for(batch: int, partition: int, count: int) -> list[tuple[Any, ...]]:
    first = batch * 1_000_000 + partition * 10_000
    return [(first + i, f"n{first + i}", i * 0.5) for i in range(count)]


def ids_of(*row_sets: Sequence[tuple[Any, ...]]) -> list[int]:
    return sorted(row[0] for rows in row_sets for row in rows)


def make_sink(params: ConnectionParams, table: str, **options: Any) -> MySQLXASink:
    return MySQLXASink(**params.kwargs(), table=table, **options)


def prepare(sink: MySQLXASink, query_id: str, rows: Sequence[Sequence[Any]], *,
            batches: Sequence[pa.RecordBatch] | None = None, **ctx: Any) -> Handle:
    """A task's begin, write and pre-commit of ``rows`` (of :data:`COLUMNS` unless
    ``columns=`` says otherwise) under ``query_id``, by the framework's own steps
    (:func:`twophase.testing.contract.prepare`; ``arrow=True``: as record batches).

    ``batches``: these record batches instead, handed to ``write_arrow`` as they are (nested
    types, a zone other than UTC: what the framework's batch builder does not make).
    """
    ctx = {"columns": COLUMNS, "query_id": query_id, **ctx}
    if batches is None:
        return contract.prepare(sink, rows, **ctx)
    return run_transaction(sink, contract.context(**ctx),
                           lambda writer, txn: writer.write_arrow(txn, batches))


def start_run(sink: MySQLXASink, state: Path | str) -> Coordinator:
    """A driver's run of the query: the state under ``state``, a new epoch, its coordinator."""
    store = StateStore(state)
    epoch = store.start_run(NAMESPACE, {}).epoch
    return Coordinator(sink, store, namespace=NAMESPACE, epoch=epoch, retry=FAST_RETRY)


def prepare_batch(sink: MySQLXASink, query_id: str, batch: int, epoch: int) -> list[Handle]:
    """Batch ``batch`` as two tasks of 30 rows each prepare it under run epoch ``epoch``."""
    return [prepare(sink, query_id, rows_for(batch, p, 30), batch=batch, partition=p,
                    epoch=epoch) for p in range(2)]


@pytest.fixture(name="table")
def fresh_table(db: Db) -> str:
    return db.new_table(TABLE_DDL)


@pytest.fixture(name="sink")
def checked_sink(mariadb: MariaDBServer, table: str) -> MySQLXASink:
    created = make_sink(mariadb.params, table)
    created.check_schema(COLUMNS)
    return created
