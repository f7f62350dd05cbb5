"""MySQLXASink under the shared crash suite: a real Spark driver SIGKILLed at the named crash
points and restarted, as the least-privileged user over verified TLS; then MariaDB itself
killed while branches are prepared."""

from __future__ import annotations

from pathlib import Path

import pytest

from setups import MySQLSetup
from twophase._crash import AFTER_DECISION, AFTER_PRE_COMMIT
from twophase.testing import Target
from twophase.testing.crash import DECISION_POINTS, CrashSuite
from twophase.testing.driver import DriverSpec, generate_feed, launch

pytestmark = [pytest.mark.spark, pytest.mark.crash]


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
