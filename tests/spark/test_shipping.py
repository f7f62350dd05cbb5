"""twophase shipped to executors that do not have it: a standalone cluster whose executors'
Python has PySpark and pyarrow only (``bare_spark_cluster``; the driver keeps ``.venv``), and
twophase reaching them the ways users ship it, each through a crash run (the crash suite on
the cluster, killed after the decision or either side of it; ``-m long``):

* the twophase wheel (as a ``.zip``) by ``spark.submit.pyFiles``, what ``--py-files`` sets:
  the SQLite sink, whose client is in the standard library (``-m long``; in CI the wheel and
  PyMySQL go this way to the MySQL sink's crash run on this cluster,
  ``tests/spark/test_cluster.py::TestMySQLOnCluster``);
* the same file by ``SparkContext.addPyFile`` from a driver whose session is up before the
  sink, as in a notebook (``-m long``);
* a packed environment by ``spark.archives``: twophase and the PostgreSQL sink's compiled
  client (psycopg's binary build) on the executors' path by ``spark.executorEnv.PYTHONPATH``
  (``-m long``);
* a packed virtualenv (venv-pack: pyarrow, twophase, psycopg's binary build) by
  ``spark.archives`` as the executors' own Python, ``PYSPARK_PYTHON=./environment/bin/python``,
  as on EMR, Dataproc or YARN, into PostgreSQL (``-m long``);
* over Spark Connect: a client ships the wheel by ``addArtifacts(pyfile=True)`` to a server
  (the driver) whose master is the bare cluster and whose own Python workers are bare too:
  batch jobs (``-m long``; a stream's Python workers do not get the session's artifacts in
  Spark 4.3.0, see :class:`TestShippedByAddArtifacts`).

The bare executor Python: see :mod:`setups.servers.bare_python`.

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
from collections.abc import Iterator
from pathlib import Path

import pytest

from setups.base import Target
from setups.servers.bare_python import bare_driver_python
from setups.servers.spark_cluster import SparkCluster
from setups.shipping import (
    ARCHIVE_NAME,
    ON_EXECUTORS_PATH,
    PACKED_PYTHON,
    POSTGRES_CLIENT,
    BareConnectServer,
    archives_conf,
    packed_environment,
    packed_virtualenv,
    unpack,
)
from setups.sqlite import SQLiteSetup
from tests.spark.test_cluster import OnCluster
from tests.spark.test_connect import ConnectCrashSuite
from twophase._crash import AFTER_DECISION
from twophase.testing.contract import list_in_doubt
from twophase.testing.crash import DECISION_POINTS, ROWS_PER_FILE, CrashSuite
from twophase.testing.driver import DriverSpec, RunResult, generate_feed, launch

pytestmark = [pytest.mark.spark, pytest.mark.crash]

PROBE_TIMEOUT_S = 300
SHIP_PY_FILE_FACTORY = "setups.shipping:sqlite_after_shipping_py_file"

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


@pytest.fixture(scope="session")
def packed_venv(tmp_path_factory: pytest.TempPathFactory, py_file: Path) -> Path:
    """The packed virtualenv with psycopg's binary build (about 70 MB; once a run)."""
    return packed_virtualenv(tmp_path_factory.mktemp("packed-venv"), py_file, POSTGRES_CLIENT)


@pytest.fixture(scope="session")
def unpacked_venv(tmp_path_factory: pytest.TempPathFactory, packed_venv: Path) -> Path:
    """The packed virtualenv unpacked on the driver's host (once a run)."""
    return unpack(packed_venv, tmp_path_factory.mktemp(ARCHIVE_NAME))


@pytest.fixture
def bare_connect_server(bare_spark_cluster: SparkCluster,
                        tmp_path_factory: pytest.TempPathFactory
                        ) -> Iterator[BareConnectServer]:
    """A Spark Connect server for the bare cluster (started by the suite with its settings,
    the cluster's master among them) whose own Python workers run a bare Python as well;
    stopped after the test, as its application holds every core of the cluster."""
    python = bare_driver_python(tmp_path_factory.mktemp("bare-server-python") / "venv")
    server = BareConnectServer(tmp_path_factory.mktemp("bare-connect"), python=str(python))
    yield server
    server.stop()


class OnBareCluster(OnCluster, CrashSuite):
    """The crash suite's driver on the cluster whose executors have PySpark and pyarrow only."""

    setup_fixture = "sqlite_setup"
    crash_points: tuple[str, ...] = DECISION_POINTS

    @pytest.fixture
    def cluster(self, bare_spark_cluster: SparkCluster) -> SparkCluster:
        return bare_spark_cluster


@pytest.mark.long  # CI time: in CI TestMySQLOnCluster (tests/spark/test_cluster.py) ships the
class TestShippedByPyFiles(OnBareCluster):  # wheel and PyMySQL this way to this cluster
    """``spark.submit.pyFiles`` (``--py-files``): the wheel reaches every executor, killed
    after the decision, where recovery must run on the bare executors' side too (the other
    ways either side of it)."""

    crash_points = (AFTER_DECISION,)

    @pytest.fixture
    def spark_conf(self, cluster: SparkCluster, py_file: Path) -> dict[str, str]:
        return {**cluster.driver_conf(), "spark.submit.pyFiles": str(py_file)}


class ShippedBySession:
    """The wheel shipped by the driver's session once it is up, before the sink is built (a
    notebook's order): ``addPyFile``, or over Spark Connect ``addArtifacts(pyfile=True)``."""

    @pytest.fixture
    def target(self, sqlite_setup: SQLiteSetup, py_file: Path) -> Target:
        target = sqlite_setup.new_target()
        return dataclasses.replace(target, factory=SHIP_PY_FILE_FACTORY,
                                   options={**target.options, "py_file": str(py_file)})


@pytest.mark.long
class TestShippedByAddPyFile(ShippedBySession, OnBareCluster):
    """``SparkContext.addPyFile`` once the session is up, before the sink (a notebook)."""


@pytest.mark.long
class TestShippedByArchives(OnBareCluster):
    """``spark.archives``: a compiled client (psycopg's binary build) and twophase."""

    setup_fixture = "postgres_setup"

    @pytest.fixture
    def spark_conf(self, cluster: SparkCluster, py_file: Path,
                   tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
        archive = packed_environment(tmp_path_factory.mktemp("packed"), py_file,
                                     POSTGRES_CLIENT)
        return {**cluster.driver_conf(), **archives_conf(archive), **ON_EXECUTORS_PATH}


@pytest.mark.long
class TestShippedAsTheExecutorsPython(OnBareCluster):
    """A packed virtualenv as the executors' own Python: ``spark.archives`` ships it as
    ``environment`` and the driver's ``PYSPARK_PYTHON`` is ``./environment/bin/python``
    (what Spark 4.3 reads for a driver started by Python; ``spark.pyspark.python`` and
    ``spark.executorEnv.PYSPARK_PYTHON`` it ignores there). Nothing else puts twophase or
    psycopg on the bare executors' path: the run proves they ran the archive's Python.

    Spark starts the driver's own Python workers (a data source's planning and commit) by
    the same relative path, from the driver's working directory: the driver finds the
    virtualenv unpacked there, as in cluster mode (YARN, Kubernetes)."""

    setup_fixture = "postgres_setup"

    @pytest.fixture(autouse=True)
    def _unpacked(self, unpacked_venv: Path) -> None:
        self.unpacked = unpacked_venv

    @pytest.fixture
    def spark_conf(self, cluster: SparkCluster, packed_venv: Path) -> dict[str, str]:
        return {**cluster.driver_conf(), **archives_conf(packed_venv)}

    def run_driver(self, spec: DriverSpec, workdir: Path, crash_at: str | None) -> RunResult:
        environment = workdir / ARCHIVE_NAME
        if not environment.exists():
            workdir.mkdir(parents=True, exist_ok=True)
            environment.symlink_to(self.unpacked)
        return super().run_driver(dataclasses.replace(spec, pyspark_python=PACKED_PYTHON),
                                  workdir, crash_at)


@pytest.mark.long
class TestShippedByAddArtifacts(ShippedBySession, OnBareCluster, ConnectCrashSuite):
    """Over Spark Connect: each client run ships the wheel by ``addArtifacts(pyfile=True)``
    to the server, the driver (killed at the crash points), whose master is the bare
    cluster. The server keeps the file with the client's session and puts it on the path of
    the Python workers of that session's jobs: the executors' and its own (a bare Python
    too), where nothing else has twophase.

    Through batch jobs (:func:`twophase.spark.write`): Spark 4.3.0 starts a stream's Python
    workers without its session's artifacts (a Python data source's writer tasks run with
    ``SPARK_JOB_ARTIFACT_UUID=default``, their files' root the executor's directory, not the
    session's, where the wheel is; the ``foreachBatch`` process lacks it too): a stream dies
    with ``No module named 'twophase'``."""

    @pytest.fixture(autouse=True)
    def _server(self, bare_connect_server: BareConnectServer) -> None:
        self.server = bare_connect_server

    def test_a_driver_killed_at_every_point_in_turn_delivers_every_row_exactly_once(  # type: ignore[override]
        self, target: Target, spark_conf: dict[str, str], tmp_path: Path
    ) -> None:
        """Batch jobs in place of the suite's stream: the first job killed before its
        decision, run again and killed after it; the next job finishes the first's commit,
        then writes its own rows: each row once. The state where the executors read it too
        (a shared file system): over Connect the takeover runs in a Spark task, on an
        executor here."""
        feed = tmp_path / "feed"
        expected = list(range(generate_feed(feed, files=2, rows_per_file=ROWS_PER_FILE)))
        first, second = (DriverSpec.into(target, tmp_path, input_dir=str(part), batch=True,
                                         state_location=str(tmp_path / "state"),
                                         spark_conf=spark_conf)
                         for part in sorted(feed.iterdir()))
        for point in DECISION_POINTS:
            crashed = self.run_driver(first, tmp_path / point, crash_at=point)
            assert crashed.crashed, f"the server did not die at {point}: see {crashed.log}"
            assert target.visible() == [], f"rows visible before a commit ({point})"
        finished = self.run_driver(second, tmp_path / "finished", crash_at=None)
        assert finished.returncode == 0, f"the last job failed: see {finished.log}"
        assert target.visible() == expected, "rows lost or duplicated"
        state = second.state_store().read()
        assert state is not None and state.pending == ()
        assert list_in_doubt(target.build(), state.namespace) == [], "left in doubt"
        assert target.in_doubt() == [], "left in doubt on the server"


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
