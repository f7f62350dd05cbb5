"""A real Spark standalone cluster for tests: a master and two workers from the installed pyspark.

The test fixture ``spark_cluster`` (session; ``tests/fixtures/spark_cluster.py``) is a
:class:`SparkCluster` with

* a master (``spark-class org.apache.spark.deploy.master.Master``) on a free loopback port;
* two workers (``...deploy.worker.Worker``), one core and 1 GiB each, every one with its own
  working and temporary directories, and in a private mount namespace (``unshare --mount``) in
  which the *driver's disk* (:attr:`SparkCluster.driver_disk`, where tests put checkpoints and
  local state) is an empty tmpfs: executors, their JVMs and their Python workers run in that
  namespace and cannot read what the driver keeps there, as on a real cluster.

``bare_spark_cluster`` is another such cluster whose executors' Python has PySpark
and pyarrow only: in its workers' namespace the driver's virtualenv (``sys.prefix``, where
the driver's ``PYSPARK_PYTHON`` is) is replaced by a bare one (:mod:`setups.servers.bare_python`),
so twophase and the sinks' client libraries reach its executors only as a job ships them
(``spark.submit.pyFiles``, ``addPyFile``, ``spark.archives``), as on a real cluster.

Executors reach the test servers (MariaDB, moto, ...) over loopback as usual. Needs root (or
CAP_SYS_ADMIN) for the mount namespace and Java 17; a missing piece FAILS the fixture.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

from setups.servers.bare_python import bare_venv, site_packages
from setups.servers.local import free_port

HOST = "127.0.0.1"
WORKERS = 2
WORKER_CORES = 1
WORKER_MEMORY = "1g"
READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 15.0
#: What a driver passes to run its executors on this cluster (small, quick to start).
DRIVER_CONF = {
    "spark.executor.memory": "512m",
    "spark.executor.cores": "1",
    "spark.cores.max": str(WORKERS * WORKER_CORES),
    "spark.task.maxFailures": "4",
    "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1",
}


def _spark_class() -> str:
    path = Path(pyspark.__file__).parent / "bin" / "spark-class"
    if not path.exists():
        raise RuntimeError(f"{path} is missing: reinstall pyspark (pip install -e '.[dev]')")
    return str(path)


@dataclass
class SparkCluster:
    """The master's URL, the directory hidden from the workers, and the processes."""

    master_url: str
    master_ui_port: int
    driver_disk: Path
    root: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def driver_conf(self) -> dict[str, str]:
        return {"spark.master": self.master_url, **DRIVER_CONF,
                "spark.pyspark.python": sys.executable}

    def alive_workers(self) -> int:
        with urllib.request.urlopen(f"http://{HOST}:{self.master_ui_port}/json/",
                                    timeout=5) as reply:
            status = json.load(reply)
        return sum(1 for worker in status.get("workers", []) if worker.get("state") == "ALIVE")

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _start(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _hidden(driver_disk: Path, command: list[str],
            binds: Sequence[tuple[Path, Path]] = ()) -> list[str]:
    """``command`` in a private mount namespace where ``driver_disk`` is an empty tmpfs and
    each ``(source, target)`` of ``binds`` is bind-mounted, in order."""
    if shutil.which("unshare") is None:
        raise RuntimeError("unshare (util-linux) is missing: apt-get install util-linux")
    mounts = "".join(f" && mount --bind {shlex.quote(str(source))} {shlex.quote(str(target))}"
                     for source, target in binds)
    script = f'mount -t tmpfs -o size=1m,mode=0700 tmpfs "$0"{mounts} && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
            str(driver_disk), *command]


def _bare_executors(root: Path) -> list[tuple[Path, Path]]:
    """The bind mounts that give the workers a bare Python at the driver's virtualenv's
    place: the driver's virtualenv moved aside (the bare one links PySpark and pyarrow
    there), then the bare virtualenv over it."""
    driver_venv = Path(sys.prefix)
    aside = root / "driver-venv"
    aside.mkdir()
    bare = bare_venv(root / "bare-venv", site_packages(aside))
    return [(driver_venv, aside), (bare, driver_venv)]


def _wait_workers(cluster: SparkCluster, logs: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        for process in cluster.processes:
            if process.poll() is not None:
                raise RuntimeError(f"a cluster process exited with {process.returncode}: see "
                                   f"the logs in {logs}")
        with contextlib.suppress(OSError, ValueError):
            if cluster.alive_workers() == WORKERS:
                return
        time.sleep(0.5)
    raise RuntimeError(f"the cluster did not get {WORKERS} workers within {READY_TIMEOUT_S}s: "
                       f"see the logs in {logs}")


@contextlib.contextmanager
def private_cluster(root: Path, *, bare_executors: bool = False) -> Iterator[SparkCluster]:
    """Start the master and the workers under ``root``; stop them on exit. With
    ``bare_executors`` the executors' Python has PySpark and pyarrow only."""
    root.mkdir(parents=True, exist_ok=True)
    binds = _bare_executors(root) if bare_executors else []
    driver_disk = root / "driver-disk"
    driver_disk.mkdir(mode=0o700, exist_ok=True)
    logs = root / "logs"
    logs.mkdir(exist_ok=True)
    port, ui_port = free_port(HOST), free_port(HOST)
    spark_class = _spark_class()
    cluster = SparkCluster(f"spark://{HOST}:{port}", ui_port, driver_disk, root)
    base_env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": HOST,
                "SPARK_NO_DAEMONIZE": "1"}
    if bare_executors:  # nothing of the caller's path (the source tree, say) either
        base_env.pop("PYTHONPATH", None)
    try:
        cluster.processes.append(_start(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", HOST,
             "--port", str(port), "--webui-port", str(ui_port)], logs / "master.log", base_env))
        for number in range(WORKERS):
            home = root / f"worker-{number}"
            (home / "tmp").mkdir(parents=True, exist_ok=True)
            env = {**base_env, "TMPDIR": str(home / "tmp"), "SPARK_LOCAL_DIRS": str(home / "tmp"),
                   "SPARK_WORKER_DIR": str(home / "work")}
            cluster.processes.append(_start(_hidden(driver_disk, [
                spark_class, "org.apache.spark.deploy.worker.Worker", cluster.master_url,
                "--host", HOST, "--cores", str(WORKER_CORES), "--memory", WORKER_MEMORY,
                "--work-dir", str(home / "work"), "--webui-port", "0"], binds),
                logs / f"worker-{number}.log", env))
        _wait_workers(cluster, logs)
        yield cluster
    finally:
        cluster.stop()
