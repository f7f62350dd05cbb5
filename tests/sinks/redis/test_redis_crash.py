"""RedisStreamSink under the shared crash suite: a real Spark driver SIGKILLed at each crash
point and restarted, judged by ``redis-cli`` (XRANGE), with a reader polling the stream's
length all along: it must never see part of a batch (each batch is one commit script). The
server itself killed while batches are staged and while one commits:
tests/sinks/redis/test_redis_sink.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from setups import RedisSetup
from tests.sinks.redis import LengthReader
from twophase._crash import CRASH_POINTS
from twophase.testing.crash import DECISION_POINTS, CrashSuite
from twophase.testing.driver import DriverSpec, RunResult

pytestmark = [pytest.mark.spark, pytest.mark.crash]

@pytest.mark.long  # CI time: crashed in CI either side of the decision over the same secured
class TestRedisCrashes(CrashSuite):  # server in the MySQL + Redis group (test_group_crash.py);
    # a polling reader of a committing stream in CI in test_redis_sink.py
    """Either side of the decision (every point: TestRedisEveryPoint), over verified TLS as
    an ACL user holding exactly the sink's rules, its password read from a file by the driver
    and every executor."""

    setup_fixture = "redis_secured_setup"
    crash_points: tuple[str, ...] = DECISION_POINTS

    @pytest.fixture(autouse=True)
    def _setup(self, request: pytest.FixtureRequest) -> None:
        self.setup: RedisSetup = request.getfixturevalue(self.setup_fixture)

    def run_driver(self, spec: DriverSpec, workdir: Path, crash_at: str | None) -> RunResult:
        reader = LengthReader(self.setup.server, spec.sink_kwargs["stream"])
        with reader.polling():
            result = super().run_driver(spec, workdir, crash_at)
        partial = sorted(length for length in reader.seen if length % self.rows_per_file)
        assert partial == [], f"a reader saw part of a batch: lengths {partial}"
        return result


@pytest.mark.long
class TestRedisEveryPoint(TestRedisCrashes):
    setup_fixture = "redis_setup"
    crash_points = CRASH_POINTS


@pytest.mark.long
class TestRedisForeachBatchCrashes(TestRedisCrashes):
    foreach_batch = True
