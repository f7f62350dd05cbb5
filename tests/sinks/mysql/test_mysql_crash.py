"""MySQLXASink under the shared crash suite: a real Spark driver SIGKILLed at the named crash
points and restarted, as the least-privileged user over verified TLS; then MariaDB itself
killed while branches are prepared; a keyed change stream.

All under ``-m long`` (CI time): in CI MySQL is crashed on the standalone cluster
(``tests/spark/test_cluster.py``), its keyed mode by the Debezium pipeline
(``tests/spark/test_debezium_pipeline.py``), MariaDB killed with branches prepared in
``tests/sinks/mysql/test_mysql_sink.py``, and the model runs every crash point over it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from setups import MySQLSetup
from setups.servers.mariadb import Db
from twophase._crash import AFTER_DECISION, AFTER_PRE_COMMIT, CRASH_POINTS
from twophase.testing import Target
from twophase.testing.crash import DECISION_POINTS, CrashSuite, KeyedCrashSuite, KeyedFeedTarget
from twophase.testing.driver import DriverSpec, generate_feed, launch

pytestmark = [pytest.mark.spark, pytest.mark.crash]

#: The keyed crash suite's table: the feed's order_id its key, event_id its version.
KEYED_FEED_DDL = ("CREATE TABLE `{table}` (order_id BIGINT NOT NULL PRIMARY KEY, "
                  "event_id BIGINT NOT NULL, ts DATETIME(6)) ENGINE=InnoDB")


@pytest.mark.long  # CI time: MySQL crashed in CI on the cluster (tests/spark/test_cluster.py),
class TestMySQLCrashes(CrashSuite):  # the server kill-9 in tests/sinks/mysql/test_mysql_sink.py
    """Over the secured server (verified TLS), as a user holding exactly the README's grants,
    its password a ``Secret(file=...)`` (:mod:`setups.least_privilege`)."""

    setup_fixture = "least_privileged_mysql_setup"
    #: Either side of the decision: every point over MySQL runs under -m long in the MySQL +
    #: Kafka group (tests/spark/test_group_crash.py), from a Kafka source
    #: (tests/spark/test_pipeline.py) and over Spark Connect; in CI in the model
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


@dataclass(eq=False)
class MySQLKeyedFeedTarget(KeyedFeedTarget):
    db: Db | None = None

    def state(self) -> dict[int, int]:
        assert self.db is not None
        return {key: version for key, version in self.db.query(
            f"SELECT order_id, event_id FROM `{self.options['table']}`")}

    def in_doubt(self) -> list[Any]:
        assert self.db is not None
        return self.db.xa_recover()


@pytest.mark.long  # CI time: keyed MySQL crashed in CI by the Debezium pipeline
class TestMySQLKeyedCrashes(KeyedCrashSuite):  # (tests/spark/test_debezium_pipeline.py)
    """A change stream (late, repeated, deleting changes) in the keyed mode, routed by key,
    the driver killed either side of the decision: the table equals the feed's newest
    changes, no branch left prepared."""

    @pytest.fixture
    def target(self, mysql_setup: MySQLSetup) -> MySQLKeyedFeedTarget:
        table = mysql_setup.db.new_table(KEYED_FEED_DDL, prefix="live_")
        return MySQLKeyedFeedTarget("sinks.mysql:MySQLXASink", {
            **mysql_setup.server.params.kwargs(), "table": table, "marker_table": f"m_{table}",
            "mode": "keyed", "key": ["order_id"], "version": "event_id",
            "deleted": "status"}, db=mysql_setup.db)


@pytest.mark.long
class TestMySQLKeyedCrashesAtEveryPoint(TestMySQLKeyedCrashes):
    crash_points = CRASH_POINTS
