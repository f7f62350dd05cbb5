"""SQLiteSink under the shared crash suite: a real Spark driver SIGKILLed at every named crash
point and restarted, on the data source path and (either side of the decision) through the
foreachBatch adapter; a restart without its state is refused. A stream that runs until stopped
commits each batch behind the next: killed while a decided batch commits behind a running one.

In CI: every point on the data source path, and a query that ends by itself committing behind
(through foreachBatch); under ``-m long`` (CI time) the state lost after a decision (refused;
in CI by tests/spark/test_spark_edges.py), the pipelined stream that runs until stopped,
foreachBatch either side of the decision and the keyed change stream."""

from __future__ import annotations

import contextlib
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from setups.sqlite import STAGED
from twophase._crash import AFTER_DECISION, COMMITTING_BEHIND, CRASH_POINTS, MID_COMMIT
from twophase.testing.crash import DECISION_POINTS, CrashSuite, KeyedCrashSuite, KeyedFeedTarget

pytestmark = [pytest.mark.spark, pytest.mark.crash]

#: A trigger that runs until stopped: its batches commit behind the next one.
PIPELINED_TRIGGER = {"processingTime": "0 seconds"}


class TestSQLiteCrashes(CrashSuite):
    setup_fixture = "sqlite_setup"


@pytest.mark.long  # CI time: a lost state refused in CI by tests/spark/test_spark_edges.py
class TestSQLiteLostStateCrashes(TestSQLiteCrashes):
    """Killed after a decision, restarted without its state (deleted with the decided batch
    pending): refused, writing nothing; restored, the query goes on."""

    check_lost_state = True
    crash_points = (AFTER_DECISION,)


@pytest.mark.long
class TestForeachBatchCrashes(TestSQLiteCrashes):
    """Either side of the decision (``-m long``; in CI foreachBatch is crashed after the
    decision, by TestPipelinedAvailableNowCrashes below and tests/spark/test_metrics.py: the
    adapters share the coordinator, whose every point runs above; every point through
    foreachBatch: tests/sinks/postgres/test_postgres_crash.py, ``-m long``)."""

    foreach_batch = True
    crash_points = DECISION_POINTS


@pytest.mark.long  # CI time: commits behind crashed in CI by TestPipelinedAvailableNowCrashes
class TestPipelinedCrashes(TestSQLiteCrashes):  # (and the model's pipelined schedules)
    """Batches commit behind the next one (``processingTime``): the driver killed as a
    decided batch's commit behind begins and in its middle, while Spark runs the next
    batch (every point of a pipelined run over Kafka and through foreachBatch: ``-m long``,
    tests/sinks/kafka/test_kafka_crash.py)."""

    trigger = PIPELINED_TRIGGER
    crash_points: tuple[str, ...] = (COMMITTING_BEHIND, MID_COMMIT)


class TestPipelinedAvailableNowCrashes(TestSQLiteCrashes):
    """A query that ends by itself (``availableNow``) asked to commit behind (``commits =
    "behind"``, which runs it through foreachBatch): the driver killed while a batch commits
    behind the next and, the last run, its query's ``awaitTermination`` returning only once
    the last batch is visible."""

    commits = "behind"
    #: CI time: in the middle of a commit behind, under ``-m long`` (TestPipelinedCrashes)
    crash_points = (COMMITTING_BEHIND,)


@pytest.mark.long
class TestPipelinedForeachBatchCrashes(TestPipelinedCrashes):
    """The same through foreachBatch: the commit behind runs in the driver's own process."""

    foreach_batch = True
    crash_points = (*CRASH_POINTS, COMMITTING_BEHIND)


@dataclass(eq=False)
class SQLiteKeyedFeedTarget(KeyedFeedTarget):
    def state(self) -> dict[int, int]:
        with contextlib.closing(sqlite3.connect(self.options["path"])) as connection:
            return dict(connection.execute("SELECT order_id, event_id FROM live"))

    def in_doubt(self) -> list[Any]:
        with contextlib.closing(sqlite3.connect(self.options["path"])) as connection:
            return list(connection.execute(STAGED))


@pytest.mark.long  # CI time: a keyed change stream crashed in CI by the Debezium pipeline
class TestSQLiteKeyedCrashes(KeyedCrashSuite):  # (tests/spark/test_debezium_pipeline.py)
    """A change stream (late, repeated, deleting changes) in the keyed mode through the
    foreachBatch adapter, the driver killed either side of the decision: the table equals the
    feed's newest changes (the plain feed through foreachBatch: ``-m long``)."""

    foreach_batch = True

    @pytest.fixture
    def target(self, tmp_path: Path) -> SQLiteKeyedFeedTarget:
        path = tmp_path / "live.db"
        with contextlib.closing(sqlite3.connect(path)) as connection, connection:
            connection.execute("CREATE TABLE live (order_id INTEGER PRIMARY KEY, "
                               "event_id INTEGER NOT NULL, ts TEXT)")
        return SQLiteKeyedFeedTarget("sinks.sqlite:SQLiteSink", {
            "path": str(path), "table": "live", "mode": "keyed", "key": ["order_id"],
            "version": "event_id", "deleted": "status"})


@pytest.mark.long
class TestSQLiteKeyedCrashesAtEveryPoint(TestSQLiteKeyedCrashes):
    """The same at every crash point, on the data source path."""

    foreach_batch = False
    crash_points = CRASH_POINTS
