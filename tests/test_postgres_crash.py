"""PostgresSink under the shared crash suite: a real Spark driver SIGKILLed at every named
crash point and restarted, on the data source path (COPY from Arrow) and on foreachBatch
(rows). The server itself killed with transactions prepared: tests/test_postgres_sink.py."""

from __future__ import annotations

import pytest

from tests.servers.postgres import PgTarget, PgView
from twophase.testing.crash import CrashSuite, SinkTarget

pytestmark = [pytest.mark.spark, pytest.mark.crash]


class PostgresCrashTarget:
    """A fresh orders table per test, and what a reader of it sees."""

    @pytest.fixture
    def target(self, pg: PgView) -> SinkTarget:
        self.pg_target = PgTarget.fresh(pg)
        return SinkTarget(PgTarget.FACTORY, self.pg_target.options())

    def visible(self, target: SinkTarget) -> list[int]:
        return self.pg_target.visible()

    def check_finished(self, target: SinkTarget) -> None:
        assert self.pg_target.in_doubt() == [], "prepared transactions left behind"


class TestPostgresCrashes(PostgresCrashTarget, CrashSuite):
    """The data source path: COPY of Arrow's CSV."""


@pytest.mark.long
class TestPostgresForeachBatchCrashes(PostgresCrashTarget, CrashSuite):
    foreach_batch = True
