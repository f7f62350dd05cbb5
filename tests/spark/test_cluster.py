"""On a real Spark standalone cluster (a master and two workers, executors in their own JVMs and
Python workers, in a mount namespace where the driver's disk is an empty tmpfs).

The crash suite runs for the networked sinks with the driver killed at every driver-side point
and an executor killed after its pre-commit: with the state on the driver's disk (tasks cannot
read it; they learn with the task which batches were decided before the run) and with the state
on S3 (tasks read it there). In CI (CI time) an executor is killed after its pre-commit and
MySQL's driver after the decision, on the cluster whose executors have PySpark and pyarrow only
(``bare_spark_cluster``): twophase and PyMySQL reach them by ``spark.submit.pyFiles``, as
``--py-files`` ships them (every point over MySQL in the model; on the cluster in the MySQL +
Kafka group, tests/spark/test_group_crash.py, ``-m long``); PostgreSQL, Kafka, HTTP and S3 go
through every point under ``-m long``, on the cluster whose executors have the driver's
virtualenv. Plus the proof that executors cannot read the driver's state directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from setups.servers.moto import MotoServer
from setups.servers.spark_cluster import SparkCluster
from tests.spark.test_failover import s3_state
from twophase._crash import AFTER_DECISION, AFTER_PRE_COMMIT
from twophase._state import StateStore
from twophase.testing.crash import CrashSuite

pytestmark = [pytest.mark.spark, pytest.mark.crash]


PROBE = """
import json, os, sys
from pyspark.sql import SparkSession
from twophase._state import StateStore
conf, directory = json.loads(sys.argv[1]), sys.argv[2]
builder = SparkSession.builder.appName("probe")
for key, value in conf.items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()
seen = spark.sparkContext.parallelize(range(4), 4).map(lambda _: (
    os.path.exists(directory), StateStore(directory).read() is None)).collect()
print(json.dumps({"executors": seen, "driver": os.path.exists(directory)}))
spark.stop()
"""


class OnCluster:
    """The crash suite's driver on the cluster, its checkpoint on the driver's disk."""

    @pytest.fixture
    def cluster(self, spark_cluster: SparkCluster) -> SparkCluster:
        return spark_cluster

    @pytest.fixture
    def spark_conf(self, cluster: SparkCluster) -> dict[str, str]:
        return cluster.driver_conf()

    @pytest.fixture
    def driver_disk(self, cluster: SparkCluster, tmp_path: Path) -> Path:
        disk = cluster.driver_disk / tmp_path.name
        disk.mkdir(mode=0o700)
        return disk


class TestMySQLOnCluster(OnCluster, CrashSuite):
    """State on the driver's disk: tasks cannot read it. The executors have neither twophase
    nor PyMySQL but as the job ships them (``--py-files``)."""

    setup_fixture = "mysql_setup"

    @pytest.fixture
    def cluster(self, bare_spark_cluster: SparkCluster) -> SparkCluster:
        return bare_spark_cluster

    @pytest.fixture
    def spark_conf(self, cluster: SparkCluster, py_file: Path,
                   mysql_client_py_file: Path) -> dict[str, str]:
        return {**cluster.driver_conf(),
                "spark.submit.pyFiles": f"{py_file},{mysql_client_py_file}"}
    #: CI time: the cluster's own paths, an executor killed after its pre-commit (its retried
    #: task aborts the orphan) and a driver killed after the decision (tasks learn what was
    #: decided); before the decision the restart's sweep is the driver's alone, as in local
    #: mode (every point on the cluster over MySQL: TestMySQLKafkaGroupOnCluster, -m long)
    crash_points = (AFTER_DECISION, AFTER_PRE_COMMIT)


@pytest.mark.long
class TestPostgresOnCluster(OnCluster, CrashSuite):
    """Prepared transactions opened by executors, committed by the driver's session."""

    setup_fixture = "postgres_setup"


@pytest.mark.long
class TestHttpOnCluster(OnCluster, CrashSuite):
    """Staging on a directory the driver and executors share (as a shared file system)."""

    setup_fixture = "http_setup"


@pytest.mark.long
class TestKafkaOnCluster(OnCluster, CrashSuite):
    """Transactions opened by executors, committed by the driver with EndTxn."""

    setup_fixture = "kafka_setup"


@pytest.mark.long  # CI time: the state on S3 is in CI through TestS3DriverFailover
class TestS3OnCluster(OnCluster, CrashSuite):
    """State on S3: tasks read it there, and the driver's disk holds nothing of it."""

    setup_fixture = "s3_setup"

    @pytest.fixture
    def state(self, moto_server: MotoServer) -> tuple[str | None, dict[str, Any]]:
        return s3_state(moto_server)


def test_executors_cannot_read_the_drivers_state_directory(bare_spark_cluster: SparkCluster,
                                                           py_file: Path, tmp_path: Path) -> None:
    state = bare_spark_cluster.driver_disk / tmp_path.name / "ckpt" / "twophase"
    StateStore(state).start_run("orders", {})
    conf = {**bare_spark_cluster.driver_conf(), "spark.submit.pyFiles": str(py_file)}
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(conf), str(state)],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    assert probe.returncode == 0, probe.stderr[-3000:]
    result = json.loads(probe.stdout.strip().splitlines()[-1])
    assert result["driver"] is True
    assert result["executors"] == [[False, True]] * 4  # no directory, no state: nothing read
