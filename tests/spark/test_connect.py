"""Exactly once from a Spark Connect client: a real local Connect server (the Spark driver),
clients in processes of their own (``twophase.testing.driver`` with ``remote=``).

Both adapters and the batch ``write`` deliver every row exactly once into SQLite and MariaDB;
the crash suite runs with the *server* SIGKILLed at every crash point and the client starting
the query again; a client killed mid-stream, and a second client taking the query over while
the first runs, write nothing twice and lose nothing. In CI: the batch job into SQLite, the
example (a stream through ``foreachBatch``), the checks before the takeover, the crash suite
for SQLite through the data source (a stream) with the server killed after the decision (CI
time: either side of it under ``-m long``; every point runs in local mode in
tests/sinks/sqlite/test_sqlite_crash.py), and both
takeovers for SQLite; MariaDB, ``foreachBatch``'s crash suites, the other crash suites (every
point) and the MariaDB takeovers under ``-m long``.

Spark 4.3 binds ``foreachBatch``'s batch DataFrame to the query's cloned session on Connect
(SPARK-44462); :data:`~setups.servers.connect.USE_CLONED_SESSION` = false binds it to the root
session, as before. The ``foreachBatch`` crash suites run on a server set either way (``-m
long``): the cloned session (the default) for SQLite and MariaDB, the root session for SQLite;
in CI the example runs ``foreachBatch`` in the cloned session.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from setups.servers.connect import USE_CLONED_SESSION, ConnectServer
from tests import REPO
from twophase._crash import AFTER_DECISION, kill_session
from twophase._state import NO_BATCH
from twophase.spark import SPARK_COMMITS_DIR
from twophase.testing import Target
from twophase.testing.contract import list_in_doubt
from twophase.testing.crash import DECISION_POINTS, LOST_STATE_MESSAGE, CrashSuite
from twophase.testing.driver import AVAILABLE_NOW, DriverSpec, RunResult, generate_feed, launch
from twophase.testing.suite import TargetSuite

pytestmark = [pytest.mark.spark]

EXAMPLE = REPO / "examples" / "connect_pipeline.py"
EXAMPLE_TIMEOUT_S = 300.0

FILES = 3
ROWS_PER_FILE = 100
#: Takeovers: a stream of this many small files, one per micro-batch, every second.
TAKEOVER_FILES = 6
TAKEOVER_ROWS_PER_FILE = 50
EVERY_SECOND = {"processingTime": "1 second"}
WAIT_TIMEOUT_S = 300.0
POLL_INTERVAL_S = 0.2
#: The server's log of each run of a query it starts, and of the two ways an old run ends
#: when a new one takes over: fenced at its next commit, or stopped by Spark at the start.
RUN_STARTED = (r"Adding new query to the cache\. Query Id {query}, value \[session id: "
               r"[^,]+, query id: {query}, run id: ([0-9a-f-]+)\]")
RUN_FENCED = r"Query \[id = {query}, runId = ([0-9a-f-]+)\] terminated with error"
RUN_STOPPED = r"Stopping existing streaming query \[id={query}, runId=([0-9a-f-]+)\]"


def client_spec(server: ConnectServer, target: Target, tmp_path: Path,
                **fields: Any) -> DriverSpec:
    """A Connect client streaming the order feed in ``tmp_path/feed`` into ``target``."""
    return DriverSpec.into(target, tmp_path, remote=server.url, **fields)


def assert_finished(spec: DriverSpec, target: Target, *, last_batch: int) -> None:
    """The state has nothing pending up to ``last_batch``, the sink nothing in doubt."""
    state = spec.state_store().read()
    assert state is not None
    assert (state.pending, state.last_done_batch) == ((), last_batch)
    assert list_in_doubt(target.build(), state.namespace) == [], "left in doubt"


def spark_committed_through(spec: DriverSpec) -> int:
    """The last batch Spark's checkpoint logs as finished: how Spark split the feed into
    batches is its own (after a takeover it may put two files into one)."""
    commits = Path(spec.checkpoint) / SPARK_COMMITS_DIR
    return max((int(path.name) for path in commits.iterdir() if path.name.isdigit()),
               default=NO_BATCH)


def done_through(spec: DriverSpec) -> int:
    """The last batch the state records as done (committed everywhere)."""
    state = spec.state_store().read()
    return NO_BATCH if state is None else state.last_done_batch


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"not after {WAIT_TIMEOUT_S:.0f}s: {what}"
        time.sleep(POLL_INTERVAL_S)


class DeliverySuite(TargetSuite):
    """Each adapter, and a batch job, from a Connect client: every row exactly once."""

    @pytest.mark.parametrize("foreach_batch", [False, True], ids=["data_source", "foreach_batch"])
    def test_a_stream_from_a_connect_client_is_delivered_exactly_once(
        self, connect: ConnectServer, target: Target, tmp_path: Path, *,
        foreach_batch: bool
    ) -> None:
        expected = list(range(generate_feed(tmp_path / "feed", files=FILES,
                                            rows_per_file=ROWS_PER_FILE)))
        spec = client_spec(connect, target, tmp_path, foreach_batch=foreach_batch)
        run = launch(spec, workdir=tmp_path / "client")
        assert run.returncode == 0, f"the client failed: see {run.log}"
        assert target.visible() == expected
        assert_finished(spec, target, last_batch=FILES - 1)

    def test_a_batch_job_from_a_connect_client_is_delivered_exactly_once(
        self, connect: ConnectServer, target: Target, tmp_path: Path
    ) -> None:
        expected = list(range(generate_feed(tmp_path / "feed", files=FILES,
                                            rows_per_file=ROWS_PER_FILE)))
        spec = client_spec(connect, target, tmp_path, batch=True,
                           state_location=str(tmp_path / "state"))
        run = launch(spec, workdir=tmp_path / "client")
        assert run.returncode == 0, f"the client failed: see {run.log}"
        assert target.visible() == expected
        assert_finished(spec, target, last_batch=0)


class TestSQLiteFromConnect(DeliverySuite):
    setup_fixture = "sqlite_setup"

    @pytest.mark.long  # CI time: through foreachBatch in the example and the crash suite
    @pytest.mark.parametrize("foreach_batch", [True], ids=["foreach_batch"])
    def test_a_stream_through_foreach_batch_from_a_connect_client_is_delivered_exactly_once(
        self, connect: ConnectServer, target: Target, tmp_path: Path, *, foreach_batch: bool
    ) -> None:
        super().test_a_stream_from_a_connect_client_is_delivered_exactly_once(
            connect, target, tmp_path, foreach_batch=foreach_batch)

    @pytest.mark.long  # CI time: a stream through the data source from a Connect client runs in
    # CI in the crash suite (TestSQLiteConnectCrashes: every row exactly once after each kill)
    @pytest.mark.parametrize("foreach_batch", [False], ids=["data_source"])
    def test_a_stream_from_a_connect_client_is_delivered_exactly_once(
        self, connect: ConnectServer, target: Target, tmp_path: Path, *, foreach_batch: bool
    ) -> None:
        super().test_a_stream_from_a_connect_client_is_delivered_exactly_once(
            connect, target, tmp_path, foreach_batch=foreach_batch)

    def test_a_trigger_the_server_cannot_parse_is_refused_before_the_takeover(
        self, connect: ConnectServer, target: Target, tmp_path: Path
    ) -> None:
        """The client sends the interval unparsed: it is parsed on the server before the
        takeover, which would otherwise fence a live run of the query for nothing."""
        generate_feed(tmp_path / "feed", files=1, rows_per_file=ROWS_PER_FILE)
        spec = client_spec(connect, target, tmp_path, trigger={"processingTime": "ten seconds"})
        refused = launch(spec, workdir=tmp_path / "refused")
        assert refused.returncode != 0 and not refused.crashed
        assert "ConfigurationError: Spark refuses the trigger" in refused.log.read_text()
        assert spec.state_store().read() is None, "the takeover ran"
        assert target.visible() == []

    def test_the_checks_before_the_takeover_run_on_the_server_and_refuse_on_the_client(
        self, connect: ConnectServer, target: Target, tmp_path: Path
    ) -> None:
        """The checkpoint is read on the server's side: a restart whose state is gone is
        refused, with twophase's own error raised in the client, and writes nothing."""
        expected = list(range(generate_feed(tmp_path / "feed", files=1,
                                            rows_per_file=ROWS_PER_FILE)))
        spec = client_spec(connect, target, tmp_path)
        assert launch(spec, workdir=tmp_path / "first").returncode == 0
        generate_feed(tmp_path / "more", files=1, rows_per_file=ROWS_PER_FILE)
        (tmp_path / "more" / "orders-00000.json").rename(tmp_path / "feed" / "more.json")
        state = Path(spec.state_store().location)
        state.rename(tmp_path / "state-aside")
        refused = launch(spec, workdir=tmp_path / "refused")
        assert refused.returncode != 0 and not refused.crashed
        log = refused.log.read_text()
        assert "twophase.errors.ConfigurationError: the checkpoint" in log, log[-3000:]
        assert LOST_STATE_MESSAGE in log
        assert target.visible() == expected

    def test_the_example_delivers_the_feed_exactly_once(
        self, connect: ConnectServer, target: Target, tmp_path: Path
    ) -> None:
        """``examples/connect_pipeline.py`` as a user runs it (through foreachBatch)."""
        expected = list(range(generate_feed(tmp_path / "feed", files=FILES,
                                            rows_per_file=ROWS_PER_FILE)))
        command = [sys.executable, str(EXAMPLE), "--remote", connect.url, "--input",
                   str(tmp_path / "feed"), "--checkpoint", str(tmp_path / "ckpt"), "--sqlite",
                   target.options["path"], "--table", target.options["table"],
                   "--foreach-batch", "--available-now"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}
        run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=EXAMPLE_TIMEOUT_S, check=False)
        assert run.returncode == 0, f"the example failed:\n{run.stdout[-3000:]}{run.stderr[-3000:]}"
        assert target.visible() == expected


@pytest.mark.long  # CI time: Connect's adapters and batch jobs run in CI into SQLite above (a
# client's path does not depend on the sink); MySQL in CI everywhere else
class TestMySQLFromConnect(DeliverySuite):
    setup_fixture = "mysql_setup"


# -- crashes -------------------------------------------------------------------------------


class ConnectCrashSuite(CrashSuite):
    """The crash suite over Spark Connect: the *server* is the driver, so it is the server
    that runs armed and dies at each crash point (its JVM and Python workers with it); the
    client, unarmed, loses its server and is ended; the next client starts the query again
    on a restarted server. The suite's ``spark_conf`` is the server's (a client sets none)."""

    @pytest.fixture(autouse=True)
    def _server(self, connect_server: ConnectServer) -> None:
        self.server = connect_server

    def run_driver(self, spec: DriverSpec, workdir: Path, crash_at: str | None) -> RunResult:
        self.server.ensure(crash_at, spec.spark_conf)
        client: list[int] = []

        def end_client_of_dead_server() -> None:
            if client and not self.server.running():
                kill_session(client[0])  # it would retry its lost server for minutes

        run = launch(replace(spec, remote=self.server.url), workdir=workdir,
                     on_start=client.append, while_running=end_client_of_dead_server)
        if crash_at is None:
            return run
        return replace(run, crashed=self.server.killed(), log=self.server.log)


class TestSQLiteConnectCrashes(ConnectCrashSuite):
    """Killed after the decision: the restarted server's recovery commits what the dead one
    decided (CI time; either side of the decision under ``-m long``, below)."""

    setup_fixture = "sqlite_setup"
    crash_points: tuple[str, ...] = (AFTER_DECISION,)


@pytest.mark.long
class TestSQLiteConnectCrashesEitherSide(TestSQLiteConnectCrashes):
    crash_points = DECISION_POINTS


class ForeachBatchConnectCrashSuite(ConnectCrashSuite):
    """Through ``foreachBatch``, its batch DataFrame in the query's cloned session (Spark
    4.3's default) or, with ``cloned_session = False``, in the root session (as before)."""

    foreach_batch = True
    cloned_session = True

    @pytest.fixture
    def spark_conf(self) -> dict[str, str]:
        """The server's settings: none for the cloned session (the default: no restart)."""
        return {} if self.cloned_session else {USE_CLONED_SESSION: "false"}


@pytest.mark.long  # CI time: recovery over Connect in CI by TestSQLiteConnectCrashes, the
# foreachBatch adapter over Connect by the example (TestSQLiteFromConnect)
class TestSQLiteForeachBatchConnectCrashes(ForeachBatchConnectCrashSuite):
    """Killed after the decision (recovery over Connect through foreachBatch); every point in
    the root session and for MariaDB under ``-m long`` too."""

    setup_fixture = "sqlite_setup"
    crash_points = (AFTER_DECISION,)


@pytest.mark.long
class TestSQLiteForeachBatchRootSessionConnectCrashes(ForeachBatchConnectCrashSuite):
    setup_fixture = "sqlite_setup"
    cloned_session = False


@pytest.mark.long
class TestMySQLConnectCrashes(ConnectCrashSuite):
    setup_fixture = "mysql_setup"


@pytest.mark.long
class TestMySQLForeachBatchConnectCrashes(ForeachBatchConnectCrashSuite):
    setup_fixture = "mysql_setup"


# -- clients that die or compete -----------------------------------------------------------


class TakeoverSuite(TargetSuite):
    """A stream whose client dies, or that a second client starts while the first runs."""

    def test_a_killed_clients_query_runs_on_until_a_new_client_takes_it_over(
        self, connect: ConnectServer, target: Target, tmp_path: Path
    ) -> None:
        """kill -9 of the client leaves its query running on the server (its session lives
        on); the restarted client's run fences it and Spark stops it: nothing twice."""
        expected = list(range(generate_feed(tmp_path / "feed", files=TAKEOVER_FILES,
                                            rows_per_file=TAKEOVER_ROWS_PER_FILE)))
        spec = client_spec(connect, target, tmp_path, trigger=EVERY_SECOND)
        client: list[int] = []

        def kill_client_after_a_batch() -> None:
            if client and done_through(spec) >= 0:
                kill_session(client[0])

        killed = launch(spec, workdir=tmp_path / "killed", on_start=client.append,
                        while_running=kill_client_after_a_batch)
        assert killed.crashed, f"the client was not killed: see {killed.log}"
        at_kill = done_through(spec)
        wait_until(lambda: done_through(spec) > at_kill, "the query goes on without a client")
        restarted = launch(replace(spec, trigger=AVAILABLE_NOW), workdir=tmp_path / "restarted")
        assert restarted.returncode == 0, f"the restarted client failed: see {restarted.log}"
        assert target.visible() == expected
        assert_finished(spec, target, last_batch=spark_committed_through(spec))
        self.assert_old_run_ended(connect, spec)

    def test_a_second_client_takes_the_query_over_from_a_running_one(
        self, connect: ConnectServer, target: Target, tmp_path: Path
    ) -> None:
        """Two live clients start the same query: the second's run fences the first's, and
        Spark stops the first's run (its client sees its query end): nothing twice."""
        expected = list(range(generate_feed(tmp_path / "feed", files=TAKEOVER_FILES,
                                            rows_per_file=TAKEOVER_ROWS_PER_FILE)))
        spec = client_spec(connect, target, tmp_path, trigger=EVERY_SECOND)
        first: list[RunResult] = []
        runner = threading.Thread(target=lambda: first.append(
            launch(spec, workdir=tmp_path / "first", timeout_s=WAIT_TIMEOUT_S)))
        runner.start()
        try:
            wait_until(lambda: done_through(spec) >= 0 or not runner.is_alive(),
                       "the first client's query commits a batch")
            assert runner.is_alive(), f"the first client ended on its own: {first}"
            second = launch(replace(spec, trigger=AVAILABLE_NOW), workdir=tmp_path / "second")
        finally:
            runner.join(WAIT_TIMEOUT_S)
        assert first, "the first client's query was not stopped by the second's start"
        assert second.returncode == 0, f"the second client failed: see {second.log}"
        assert target.visible() == expected
        assert_finished(spec, target, last_batch=spark_committed_through(spec))
        self.assert_old_run_ended(connect, spec)

    @staticmethod
    def assert_old_run_ended(server: ConnectServer, spec: DriverSpec) -> None:
        """The server's view: two runs of the query started; the old one ended before the new
        one started (fenced at its next commit, or stopped by Spark): none runs on."""
        state = spec.state_store().read()
        assert state is not None and state.query_id is not None
        query, log = re.escape(state.query_id), server.log.read_text()
        started = re.findall(RUN_STARTED.format(query=query), log)
        ended = {*re.findall(RUN_FENCED.format(query=query), log),
                 *re.findall(RUN_STOPPED.format(query=query), log)}
        assert len(started) == 2, f"not two runs of the query: see {server.log}"
        assert started[0] in ended, f"the old run {started[0]} runs on: see {server.log}"


class TestSQLiteTakeovers(TakeoverSuite):
    setup_fixture = "sqlite_setup"


@pytest.mark.long
class TestMySQLTakeovers(TakeoverSuite):
    setup_fixture = "mysql_setup"
