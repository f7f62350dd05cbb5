"""A real Spark Connect server for tests, from the installed pyspark's own jars (no download).

The test fixture ``connect_server`` (session; ``tests/fixtures/connect.py``) is a
:class:`ConnectServer`, ``spark-submit --class
org.apache.spark.sql.connect.service.SparkConnectServer`` in local mode on a free loopback
port. Its Python workers run this interpreter with the repository on their
path, so they import twophase, the sinks and the tests' own sinks. Its log, pid and scratch
files stay in a private directory.

The server is the Spark driver: the crash tests restart it *armed* (``TWOPHASE_CRASH_AT`` in
its environment, inherited by its JVM and every Python worker it starts), and a crash point
then SIGKILLs the whole server. For that the server runs in a process session of its own led
by a small Python process (a crash point kills only sessions led by Python).

A test may start it with Spark settings of its own on top of ``SERVER_CONF`` (as the
``foreachBatch`` crash tests do with :data:`USE_CLONED_SESSION` either way); it is restarted
whenever a test asks for other settings, and the ``connect`` fixture runs it with none.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

from setups.servers.local import HOST, free_port
from twophase.testing.crash_points import CRASH_ENV, kill_session

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
READY_MESSAGE = "Spark Connect server started at"
READY_TIMEOUT_S = 120.0
POLL_INTERVAL_S = 0.2
#: The server's Spark settings: small and quick, like the local test session.
SERVER_CONF = {
    "spark.master": "local[2]",
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
    "spark.sql.streaming.minBatchesToRetain": "10",
}
#: Spark 4.3 (SPARK-44462): a Connect ``foreachBatch`` function's batch DataFrame is bound to the
#: query's cloned session ("true", the default) or, as before 4.3, to the root session that
#: started the query ("false"). A SQL setting: the server's value is every session's default.
USE_CLONED_SESSION = "spark.sql.connect.streaming.foreachBatch.useClonedSession"
#: The session leader: waits for spark-submit, so that the session is led by Python.
LEADER = "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"
REPO = Path(__file__).resolve().parents[2]


@dataclass
class ConnectServer:
    """One Spark Connect server process session; ``url`` is what a client connects to."""

    root: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    crash_at: str | None = None
    #: The Spark settings it runs with on top of SERVER_CONF.
    conf: dict[str, str] = field(default_factory=dict)
    starts: int = 0

    @property
    def url(self) -> str:
        return f"sc://{HOST}:{self.port}"

    @property
    def log(self) -> Path:
        return self.root / "server.log"

    def start(self, crash_at: str | None = None, conf: dict[str, str] | None = None) -> None:
        """Start the server (armed at ``crash_at``, if given, with the Spark settings ``conf``
        on top of SERVER_CONF) and wait until it serves."""
        if self.running():
            raise RuntimeError(f"the Connect server {self.url} is running: stop it first")
        self.crash_at, self.conf = crash_at, dict(conf or {})
        self.starts += 1
        offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("a") as log:
            log.write(f"\n=== server start {self.starts}, crash point {crash_at or 'none'}, "
                      f"settings {self.conf} ===\n")
            log.flush()
            self.process = subprocess.Popen(
                [sys.executable, "-c", LEADER, *self._command()], cwd=self.root,
                env=self._environment(crash_at), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._wait_ready(offset)

    def ensure(self, crash_at: str | None = None, conf: dict[str, str] | None = None) -> None:
        """Make the server run armed and set as asked (restarting it if it runs otherwise)."""
        if self.running() and (self.crash_at, self.conf) == (crash_at, dict(conf or {})):
            return
        self.stop()
        self.start(crash_at, conf)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def killed(self) -> bool:
        """Did the server end by SIGKILL (as an armed crash point kills it)?"""
        return self.process is not None and self.process.poll() == -9

    def stop(self) -> None:
        """End the whole server session (leader, JVM, Python workers) with SIGKILL."""
        if self.process is None:
            return
        kill_session(self.process.pid)
        self.process.wait()

    def _command(self) -> list[str]:
        spark_home = Path(pyspark.__file__).parent
        conf = {**SERVER_CONF, **self.conf, "spark.connect.grpc.binding.address": HOST,
                "spark.connect.grpc.binding.port": str(self.port),
                "spark.local.dir": str(self.root / "local")}
        return [str(spark_home / "bin" / "spark-submit"), "--class", SERVER_CLASS,
                "--name", "twophase-connect-tests",
                *(arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}"))]

    def _environment(self, crash_at: str | None) -> dict[str, str]:
        env = {**os.environ, "SPARK_HOME": str(Path(pyspark.__file__).parent),
               "PYSPARK_PYTHON": sys.executable, "TMPDIR": str(self.root / "tmp"),
               "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO),
                                                           os.environ.get("PYTHONPATH"))))}
        (self.root / "tmp").mkdir(exist_ok=True)
        env.pop(CRASH_ENV, None)
        if crash_at:
            env[CRASH_ENV] = crash_at
        return env

    def _wait_ready(self, offset: int) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self._logged_ready(offset) or not self._accepts():
            if not self.running():
                raise RuntimeError(f"the Spark Connect server ended at its start: see "
                                   f"{self.log}:\n" + self.log.read_text()[offset:][-3000:])
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the Spark Connect server did not start in "
                                   f"{READY_TIMEOUT_S:.0f}s: see {self.log}")
            time.sleep(POLL_INTERVAL_S)

    def _logged_ready(self, offset: int) -> bool:
        with self.log.open() as log:
            log.seek(offset)
            return READY_MESSAGE in log.read()

    def _accepts(self) -> bool:
        try:
            socket.create_connection((HOST, self.port), timeout=1).close()
        except OSError:
            return False
        return True
