"""SQLiteSink under the shared crash suite: a real Spark driver SIGKILLed at every named crash
point and restarted, on the data source path and (either side of the decision) through the
foreachBatch adapter; a restart without its state is refused."""

from __future__ import annotations

import pytest

from twophase.testing.crash import DECISION_POINTS, CrashSuite

pytestmark = [pytest.mark.spark, pytest.mark.crash]


class TestSQLiteCrashes(CrashSuite):
    setup_fixture = "sqlite_setup"
    check_lost_state = True  # the state deleted with a decided batch pending: refused


class TestForeachBatchCrashes(TestSQLiteCrashes):
    """Either side of the decision in CI (CI time: the adapters share the coordinator, whose
    every point runs above; every point through foreachBatch: tests/test_postgres_crash.py,
    ``-m long``)."""

    check_lost_state = False
    foreach_batch = True
    crash_points = DECISION_POINTS
