"""Crash tests: a real Spark driver SIGKILLed at the named protocol points, then restarted.

Every sink runs the shared crash suite (twophase.testing.crash) over its setup (:mod:`setups`):
one stream whose driver is killed at each crash point in turn and restarted, judged by the
external system's own view, and nothing left in doubt on the server at the end. Below it,
what only some sinks need: the foreachBatch adapter, and MariaDB itself killed while branches
are prepared.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from setups import MySQLSetup
from tests.test_user_sink import JsonLinesTarget
from twophase._crash import AFTER_DECISION, AFTER_PRE_COMMIT
from twophase.testing import Target
from twophase.testing.crash import DECISION_POINTS, CrashSuite
from twophase.testing.driver import DriverSpec, generate_feed, launch

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


class TestMySQLCrashes(CrashSuite):
    """Over the secured server (verified TLS), as a user holding exactly the README's grants,
    its password a ``Secret(file=...)`` (:mod:`setups.least_privilege`)."""

    setup_fixture = "least_privileged_mysql_setup"
    #: CI time: every point runs in CI in the MySQL + Kafka group (tests/test_group_crash.py),
    #: and under -m long from a Kafka source (tests/test_pipeline.py) and over Spark Connect
    crash_points = DECISION_POINTS

    def test_a_server_killed_while_branches_are_prepared_loses_nothing(
        self, target: Target, secured_mysql_setup: MySQLSetup, tmp_path: Path
    ) -> None:
        """The driver killed with branches prepared (undecided, then decided), then kill -9
        of MariaDB while the driver is down; the restarts deliver every row exactly once."""
        points = (AFTER_PRE_COMMIT, AFTER_DECISION)
        expected = list(range(generate_feed(tmp_path / "feed", files=len(points) + 2,
                                            rows_per_file=self.rows_per_file)))
        spec = DriverSpec.into(target, tmp_path)
        for batch, point in enumerate(points, start=1):
            crashed = launch(spec, workdir=tmp_path / "runs", crash_at=f"{point}@{batch}")
            assert crashed.crashed, f"the driver did not die at {point}: see {crashed.log}"
            assert target.in_doubt(), "nothing was prepared when the driver died"
            secured_mysql_setup.kill_server()
            secured_mysql_setup.server.restart_after_kill()
        finished = launch(spec, workdir=tmp_path / "runs")
        assert finished.returncode == 0, f"the last run failed: see {finished.log}"
        assert target.visible() == expected
        assert target.in_doubt() == []


@pytest.mark.long
class TestJsonLinesCrashes(CrashSuite):
    """The sink a user wrote from the README survives the same crashes (its contract suite
    runs in CI: tests/test_user_sink.py)."""

    @pytest.fixture
    def target(self, tmp_path: Path) -> JsonLinesTarget:
        return JsonLinesTarget.in_directory(tmp_path / "out")


@pytest.mark.long  # CI time: the same sink and setup run in CI under TestS3DriverFailover
class TestS3Crashes(CrashSuite):
    """A crash leaves open uploads, never a visible duplicate; over HTTPS (the certificate
    verified against the run's CA), the sink running as a user holding exactly the README's
    least-privilege policy of its prefix."""

    setup_fixture = "s3_secured_setup"
