"""The newcomer's tests of ``my_pg_sink``, written to twophase 0.1.0's README (commit 8da4bfe):
the contract suite with a ``sink`` fixture and ``visible(sink)``, the crash suite with a
``SinkTarget``, ``visible(target)`` and ``check_finished(target)``. Kept unchanged;
tests/test_compat.py runs them against the current code (named so that the repository's own
test run does not collect them). The server: psycopg's connect options as JSON in ``MY_PG``.
"""

from __future__ import annotations

import json
import os
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from my_pg_sink import MyPgSink  # type: ignore[import-not-found]  # (mypy: see test_compat)
from psycopg import sql

from twophase.testing.contract import SinkContract
from twophase.testing.crash import CrashSuite, SinkTarget
from twophase.testing.driver import FEED_START


def connect_options() -> dict[str, Any]:
    options: dict[str, Any] = json.loads(os.environ["MY_PG"])
    return options


def sink_options(table: str) -> dict[str, Any]:
    return {"table": table, **connect_options()}


def new_table() -> str:
    table = f"orders_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(**connect_options(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (event_id bigint PRIMARY KEY, order_id bigint "
                             "NOT NULL, status text NOT NULL, ts timestamptz)")
                     .format(sql.Identifier(table)))
    return table


def read(table: str, columns: str = "event_id") -> list[Any]:
    with psycopg.connect(**connect_options(), autocommit=True) as conn:
        rows = conn.execute(sql.SQL(f"SELECT {columns} FROM {{}} ORDER BY event_id")
                            .format(sql.Identifier(table))).fetchall()
    return [row[0] if len(row) == 1 else row for row in rows]


class TestMyPgSinkContract(SinkContract):
    @pytest.fixture
    def sink(self) -> MyPgSink:
        return MyPgSink(new_table(), **connect_options())

    def visible(self, sink: MyPgSink) -> list[int]:
        return sorted(read(sink.table))


class TestMyPgSinkCrashes(CrashSuite):
    @pytest.fixture
    def target(self) -> SinkTarget:
        return SinkTarget("my_pg_sink:MyPgSink", sink_options(new_table()))

    def visible(self, target: SinkTarget) -> list[int]:
        return sorted(read(target.options["table"]))

    def check_finished(self, target: SinkTarget) -> None:
        rows = read(target.options["table"], "event_id, ts")
        assert all(ts == FEED_START + timedelta(seconds=event_id) for event_id, ts in rows), \
            "a ts is not the feed's instant"
        with psycopg.connect(**connect_options(), autocommit=True) as conn:
            assert conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall() == []
