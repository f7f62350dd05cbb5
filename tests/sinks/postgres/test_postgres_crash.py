"""PostgresSink under the shared crash suite: a real Spark driver SIGKILLed at every named
crash point and restarted, on the data source path (COPY from Arrow) and on foreachBatch
(rows). The server itself killed with transactions prepared:
tests/sinks/postgres/test_postgres_sink.py. The keyed mode's crash suites under ``-m long``
(CI time: the Debezium pipeline crashes a keyed PostgreSQL table in CI,
tests/spark/test_debezium_pipeline.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from psycopg import sql

from setups import PostgresSetup
from setups.servers.postgres import PgView
from twophase._crash import CRASH_POINTS
from twophase.testing.crash import DECISION_POINTS, CrashSuite, KeyedCrashSuite, KeyedFeedTarget

pytestmark = [pytest.mark.spark, pytest.mark.crash]

#: The keyed crash suite's table: the feed's order_id its key, event_id its version.
KEYED_FEED_DDL = ("CREATE TABLE {table} (order_id bigint PRIMARY KEY, event_id bigint NOT NULL, "
                  "ts timestamptz)")


class TestPostgresCrashes(CrashSuite):
    """The data source path: COPY of Arrow's CSV; over the secured server (``hostssl`` only,
    verified TLS), as a role holding exactly the README's grants, its password a
    ``Secret(file=...)`` (:mod:`setups.least_privilege`)."""

    setup_fixture = "least_privileged_postgres_setup"
    #: CI time: every point under -m long (TestPostgresForeachBatchCrashes, the cluster's)
    crash_points = DECISION_POINTS


@pytest.mark.long
class TestPostgresForeachBatchCrashes(CrashSuite):
    setup_fixture = "postgres_setup"
    foreach_batch = True


@dataclass(eq=False)
class PostgresKeyedFeedTarget(KeyedFeedTarget):
    view: PgView | None = None

    def state(self) -> dict[int, int]:
        assert self.view is not None
        return {key: version for key, version in self.view.query(
            sql.SQL("SELECT order_id, event_id FROM {}").format(
                sql.Identifier(self.options["table"])))}

    def in_doubt(self) -> list[Any]:
        assert self.view is not None
        return self.view.prepared()


@pytest.mark.long  # CI time: keyed PostgreSQL crashed in CI by the Debezium pipeline
class TestPostgresKeyedCrashes(KeyedCrashSuite):  # (tests/spark/test_debezium_pipeline.py)
    """A change stream (late, repeated, deleting changes) in the keyed mode, prepared
    transactions routed by key, the driver killed either side of the decision: the table
    equals the feed's newest changes, nothing left prepared."""

    publish = "prepared"

    @pytest.fixture
    def target(self, postgres_setup: PostgresSetup) -> PostgresKeyedFeedTarget:
        table = postgres_setup.view.new_table(KEYED_FEED_DDL, prefix="live_")
        return PostgresKeyedFeedTarget("sinks.postgres:PostgresSink", {
            **postgres_setup.server.params.sink_options(), "table": table,
            "publish": self.publish, "mode": "keyed", "key": ["order_id"],
            "version": "event_id", "deleted": "status"}, view=postgres_setup.view)


@pytest.mark.long
class TestPostgresStagedKeyedCrashes(TestPostgresKeyedCrashes):
    """The staged mode: changes reduced when the batch is published, at every point."""

    publish = "staged"
    crash_points = CRASH_POINTS
