"""Crash tests: a real Spark driver SIGKILLed at the named protocol points, then restarted.

Every sink runs the shared crash suite (twophase.testing.crash): one stream whose driver is
killed at each crash point in turn and restarted, judged by the external system's own view.
Below it, what only some sinks need: the foreachBatch adapter, and MariaDB itself killed while
branches are prepared.
"""

from __future__ import annotations

import io
import sqlite3
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import MYSQL_ORDERS_DDL, ORDERS_DDL
from tests.servers.mariadb import Db, MariaDBServer
from tests.servers.moto import MotoServer
from tests.user_sink import JsonLinesSink
from twophase._crash import AFTER_DECISION, AFTER_PRE_COMMIT
from twophase.testing.crash import CrashSuite, SinkTarget
from twophase.testing.driver import DriverSpec, generate_feed, launch

pytestmark = [pytest.mark.spark, pytest.mark.crash]


def sqlite_target(tmp_path: Path) -> SinkTarget:
    database = tmp_path / "orders.db"
    with sqlite3.connect(database) as connection:
        connection.execute(ORDERS_DDL)
    return SinkTarget("sinks.sqlite:SQLiteSink", {"path": str(database), "table": "orders"})


def sqlite_visible(target: SinkTarget) -> list[int]:
    with sqlite3.connect(target.options["path"]) as connection:
        return [row[0] for row in connection.execute("SELECT event_id FROM orders ORDER BY 1")]


class TestSQLiteCrashes(CrashSuite):
    check_lost_state = True  # the state deleted after a crash at every point: refused

    @pytest.fixture
    def target(self, tmp_path: Path) -> SinkTarget:
        return sqlite_target(tmp_path)

    def visible(self, target: SinkTarget) -> list[int]:
        return sqlite_visible(target)


class TestForeachBatchCrashes(TestSQLiteCrashes):
    check_lost_state = False
    foreach_batch = True


class MySQLTarget:
    """A fresh MariaDB table through the XA sink, and what a reader of it sees."""

    @pytest.fixture
    def target(self, mariadb: MariaDBServer, db: Db) -> SinkTarget:
        table = db.new_table(MYSQL_ORDERS_DDL, prefix="orders_")
        return SinkTarget("sinks.mysql:MySQLXASink",
                          {**mariadb.params.kwargs(), "table": table, "fencing": True})

    @pytest.fixture(autouse=True)
    def _db(self, db: Db) -> None:
        self.db = db

    def visible(self, target: SinkTarget) -> list[int]:
        table = target.options["table"]
        return [row[0] for row in self.db.query(f"SELECT event_id FROM `{table}` ORDER BY 1")]


class TestMySQLCrashes(MySQLTarget, CrashSuite):
    def test_a_server_killed_while_branches_are_prepared_loses_nothing(
        self, target: SinkTarget, mariadb: MariaDBServer, tmp_path: Path
    ) -> None:
        """The driver killed with branches prepared (undecided, then decided), then kill -9
        of MariaDB while the driver is down; the restarts deliver every row exactly once."""
        points = (AFTER_PRE_COMMIT, AFTER_DECISION)
        expected = list(range(generate_feed(tmp_path / "feed", files=len(points) + 2,
                                            rows_per_file=self.rows_per_file)))
        spec = DriverSpec(input_dir=str(tmp_path / "feed"), checkpoint=str(tmp_path / "ckpt"),
                          sink_factory=target.factory, sink_kwargs=target.options)
        for batch, point in enumerate(points, start=1):
            crashed = launch(spec, workdir=tmp_path / "runs", crash_at=f"{point}@{batch}")
            assert crashed.crashed, f"the driver did not die at {point}: see {crashed.log}"
            assert self.db.xa_recover(), "nothing was prepared when the driver died"
            mariadb.kill()
            mariadb.restart_after_kill()
        finished = launch(spec, workdir=tmp_path / "runs")
        assert finished.returncode == 0, f"the last run failed: see {finished.log}"
        assert self.visible(target) == expected
        assert self.db.xa_recover() == []


class TestJsonLinesCrashes(CrashSuite):
    """The sink a user wrote from the README survives the same crashes."""

    @pytest.fixture
    def target(self, tmp_path: Path) -> SinkTarget:
        return SinkTarget("tests.user_sink:JsonLinesSink", {"directory": str(tmp_path / "out")})

    def visible(self, target: SinkTarget) -> list[int]:
        rows = JsonLinesSink(target.options["directory"]).rows()
        return sorted(row["event_id"] for row in rows)


class S3Target:
    """Parquet objects in a fresh bucket of a private moto S3, and what a reader sees."""

    @pytest.fixture
    def target(self, moto_server: MotoServer, s3_bucket: str) -> SinkTarget:
        self.server = moto_server
        return SinkTarget("sinks.s3:S3Sink", {**moto_server.options(), "bucket": s3_bucket,
                                              "prefix": "orders", "format": "parquet"})

    def visible(self, target: SinkTarget) -> list[int]:
        return s3_visible(self.server, target)


def s3_visible(server: MotoServer, target: SinkTarget) -> list[int]:
    """The sorted event_id of every row of every Parquet object under the target's prefix."""
    client, bucket = server.client(), target.options["bucket"]
    keys = [item["Key"] for item in client.list_objects_v2(
        Bucket=bucket, Prefix=f"{target.options['prefix']}/").get("Contents", ())]
    return sorted(event_id for key in keys for event_id in pq.read_table(
        io.BytesIO(client.get_object(Bucket=bucket, Key=key)["Body"].read()),
        columns=["event_id"]).column("event_id").to_pylist())


class TestS3Crashes(S3Target, CrashSuite):
    """A crash leaves open uploads, never a visible duplicate."""
