"""twophase shipped to executors that do not have it: a standalone cluster whose executors'
Python has PySpark and pyarrow only (``bare_spark_cluster``; the driver keeps ``.venv``), and
twophase reaching them the ways users ship it, each through a crash run (the crash suite on
the cluster, killed after the decision in CI, either side of it under ``-m long``):

* the twophase wheel (as a ``.zip``) by ``spark.submit.pyFiles``, what ``--py-files`` sets:
  the SQLite sink, whose client is in the standard library (in CI);
* the same file by ``SparkContext.addPyFile`` from a driver whose session is up before the
  sink, as in a notebook (``-m long``);
* a packed environment by ``spark.archives``: twophase and the PostgreSQL sink's compiled
  client (psycopg's binary build) on the executors' path by ``spark.executorEnv.PYTHONPATH``
  (``-m long``).

The bare executor Python: see :mod:`setups.servers.bare_python`.

Not tested, documented (README, "Deploying"): a packed virtualenv's own Python as the
executors' (``PYSPARK_PYTHON=./environment/bin/python``: the crash suite's driver sets its
executors' Python to its own path, where the bare cluster has its bare one), and Spark
Connect's ``addArtifacts`` (the tests' Connect server runs in local mode).

And the start's check (:func:`twophase._preflight.require_executor_imports`): executors that
lack twophase (in CI, through a query's start), or the sink's client library (``-m long``,
the check called directly), fail the start with the module, the executor's host and the fix
named, before anything is written.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from setups.base import Target
from setups.servers.spark_cluster import SparkCluster
from setups.shipping import (
    ARCHIVE_CONF,
    POSTGRES_CLIENT,
    packed_environment,
    twophase_py_file,
)
from setups.sqlite import SQLiteSetup
from tests.test_cluster import OnCluster
from twophase._crash import AFTER_DECISION
from twophase.testing.crash import DECISION_POINTS, CrashSuite
from twophase.testing.driver import DriverSpec, generate_feed, launch

pytestmark = [pytest.mark.spark, pytest.mark.crash]

PROBE_TIMEOUT_S = 300
ADD_PY_FILE_FACTORY = "setups.shipping:sqlite_after_add_py_file"

#: The start's check on the bare executors: without twophase (SQLite), then with twophase
#: added but not the PostgreSQL sink's client library (psycopg).
START_CHECK = """
import json, sys
from pyspark.sql import SparkSession
from sinks.postgres import PostgresSink
from sinks.sqlite import SQLiteSink
from twophase.errors import ConfigurationError
from twophase._preflight import require_executor_imports
conf, py_file = json.loads(sys.argv[1]), sys.argv[2]
builder = SparkSession.builder.appName("start-check")
for key, value in conf.items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()
raised = []
for sink in (SQLiteSink(path="unused.db", table="orders"),
             PostgresSink(host="127.0.0.1", user="unused", password="unused",
                          database="unused", table="orders")):
    try:
        require_executor_imports(spark, sink)
        raised.append(None)
    except ConfigurationError as exc:
        raised.append(str(exc))
    spark.sparkContext.addPyFile(py_file)
print(json.dumps(raised))
spark.stop()
"""


@pytest.fixture(scope="module")
def py_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return twophase_py_file(tmp_path_factory.mktemp("twophase-wheel"))


class OnBareCluster(OnCluster, CrashSuite):
    """The crash suite's driver on the cluster whose executors have PySpark and pyarrow only."""

    setup_fixture = "sqlite_setup"
    crash_points: tuple[str, ...] = DECISION_POINTS

    @pytest.fixture
    def cluster(self, bare_spark_cluster: SparkCluster) -> SparkCluster:
        return bare_spark_cluster


class TestShippedByPyFiles(OnBareCluster):
    """``spark.submit.pyFiles`` (``--py-files``): the wheel reaches every executor (CI time:
    killed after the decision, where recovery must run on the bare executors' side too; the
    other ways either side of it, ``-m long``)."""

    crash_points = (AFTER_DECISION,)

    @pytest.fixture
    def spark_conf(self, cluster: SparkCluster, py_file: Path) -> dict[str, str]:
        return {**cluster.driver_conf(), "spark.submit.pyFiles": str(py_file)}


@pytest.mark.long
class TestShippedByAddPyFile(OnBareCluster):
    """``SparkContext.addPyFile`` once the session is up, before the sink (a notebook)."""

    @pytest.fixture
    def target(self, sqlite_setup: SQLiteSetup, py_file: Path) -> Target:
        target = sqlite_setup.new_target()
        return dataclasses.replace(target, factory=ADD_PY_FILE_FACTORY,
                                   options={**target.options, "py_file": str(py_file)})


@pytest.mark.long
class TestShippedByArchives(OnBareCluster):
    """``spark.archives``: a compiled client (psycopg's binary build) and twophase."""

    setup_fixture = "postgres_setup"

    @pytest.fixture
    def spark_conf(self, cluster: SparkCluster, py_file: Path,
                   tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
        archive = packed_environment(tmp_path_factory.mktemp("packed"), py_file,
                                     POSTGRES_CLIENT)
        return {**cluster.driver_conf(),
                **{key: value.format(archive=archive) for key, value in ARCHIVE_CONF.items()}}


@pytest.mark.long  # CI time: in CI a query's start on executors without twophase (below)
def test_the_start_check_names_what_each_bare_executor_lacks(
        bare_spark_cluster: SparkCluster, py_file: Path) -> None:
    check = subprocess.run(
        [sys.executable, "-c", START_CHECK, json.dumps(bare_spark_cluster.driver_conf()),
         str(py_file)], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    assert check.returncode == 0, check.stderr[-3000:]
    without_twophase, without_client = json.loads(check.stdout.strip().splitlines()[-1])
    host = socket.gethostname()
    assert f"{host}: twophase: not installed" in without_twophase
    assert "spark.submit.pyFiles" in without_twophase  # the fix
    assert f"{host}: psycopg: not installed" in without_client
    assert "twophase:" not in without_client
    assert "pip install 'twophase[postgres]'" in without_client


def test_a_query_on_executors_without_twophase_fails_at_its_start(
        bare_spark_cluster: SparkCluster, sqlite_setup: SQLiteSetup, tmp_path: Path) -> None:
    """The start's check (``twophase.spark._takeover``) refuses it before the takeover."""
    target = sqlite_setup.new_target()
    generate_feed(tmp_path / "feed", files=1, rows_per_file=10)
    spec = DriverSpec.into(target, tmp_path, spark_conf=bare_spark_cluster.driver_conf())
    run = launch(spec, workdir=tmp_path / "run")
    log = run.log.read_text()
    assert run.returncode != 0 and not run.crashed, log[-3000:]
    assert "ConfigurationError: the executors cannot run the sqlite sink" in log, log[-3000:]
    assert f"{socket.gethostname()}: twophase: not installed" in log
    assert target.visible() == []
    assert spec.state_store().read() is None  # refused before the takeover
