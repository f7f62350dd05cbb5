"""A private Prometheus for tests: Debian's ``prometheus`` on loopback, own data directory.

The test fixtures over it (the pytest plugin ``tests/fixtures/prometheus.py``):

* ``prometheus_server`` (session): a :class:`PrometheusServer` started once per test session
  with a short scrape interval and a file of scrape targets that tests fill;
* ``prometheus`` (function): the same server, its targets emptied first;
* ``pushgateway`` (function): a private ``prometheus-pushgateway`` (its URL), for one test.

A test names what to scrape with :meth:`~PrometheusServer.scrape` (a loopback port and a job)
and reads what Prometheus stored through its HTTP query API: :meth:`~PrometheusServer.query`
now, or :meth:`~PrometheusServer.wait_for` a condition on it (scrapes come every
``SCRAPE_INTERVAL``; a test waits for the condition, never for a time).

``promtool`` (same package) checks and unit-tests rule files: :func:`promtool`.

If Debian's Prometheus is missing, the fixture FAILS (it never skips): install it with
``apt-get install prometheus``.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from setups.servers.local import HOST, ServerMissingError, free_port, stop_process

BINARY = "prometheus"
PROMTOOL = "promtool"
PUSHGATEWAY = "prometheus-pushgateway"
INSTALL_HINT = ("install Debian's Prometheus: apt-get install prometheus "
                "prometheus-pushgateway")
SCRAPE_INTERVAL = "250ms"
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
POLL_INTERVAL_S = 0.1
WAIT_TIMEOUT_S = 30.0
CONFIG = f"""\
global:
  scrape_interval: {SCRAPE_INTERVAL}
  scrape_timeout: 200ms
scrape_configs:
  - job_name: tests
    file_sd_configs:
      - files: [targets.json]
        refresh_interval: 1s
"""

Sample = tuple[dict[str, str], float]


def binary(name: str) -> str:
    """The path of Prometheus's program ``name``; :class:`ServerMissingError` if missing."""
    path = shutil.which(name)
    if path is None:
        raise ServerMissingError(f"{name} not found on PATH: {INSTALL_HINT}")
    return path


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """Run ``promtool`` with ``args``; its output and exit code are the caller's to judge."""
    return subprocess.run([binary(PROMTOOL), *map(str, args)], capture_output=True, text=True,
                          timeout=120, check=False)


@dataclass
class PrometheusServer:
    base_dir: Path
    port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def targets_file(self) -> Path:
        return self.base_dir / "targets.json"

    def start(self) -> None:
        (self.base_dir / "prometheus.yml").write_text(CONFIG)
        self.clear_targets()
        log = (self.base_dir / "prometheus.log").open("ab")
        self.process = subprocess.Popen(
            [binary(BINARY), "--config.file=prometheus.yml", "--storage.tsdb.path=data",
             f"--web.listen-address={HOST}:{self.port}", "--log.level=warn"],
            cwd=self.base_dir, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_ready(f"{self.url}/-/ready", self.process, "prometheus")
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}: {self._log_tail()}") from exc

    def stop(self) -> None:
        stop_process(self.process, STOP_TIMEOUT_S)

    def clear_targets(self) -> None:
        self._write_targets([])

    def scrape(self, port: int, job: str) -> None:
        """Scrape ``127.0.0.1:port`` from now on, its series labelled ``job``."""
        groups = json.loads(self.targets_file.read_text())
        groups.append({"targets": [f"{HOST}:{port}"], "labels": {"job": job}})
        self._write_targets(groups)

    def _write_targets(self, groups: list[dict[str, Any]]) -> None:
        """Replace the targets file at once (Prometheus watches it)."""
        partial = self.targets_file.with_suffix(".tmp")
        partial.write_text(json.dumps(groups))
        partial.replace(self.targets_file)

    def query(self, expr: str) -> list[Sample]:
        """The instant vector ``expr`` evaluates to now: (labels, value) per series."""
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
        if body["status"] != "success":
            raise AssertionError(f"query {expr!r} failed: {body}")
        return [(item["metric"], float(item["value"][1])) for item in body["data"]["result"]]

    def value(self, expr: str) -> float | None:
        """The single value of ``expr`` now (None: no series); several series are an error."""
        samples = self.query(expr)
        if len(samples) > 1:
            raise AssertionError(f"{expr!r} has {len(samples)} series: {samples}")
        return samples[0][1] if samples else None

    def wait_for(self, expected: dict[str, float | Callable[[float | None], bool]],
                 timeout_s: float = WAIT_TIMEOUT_S) -> dict[str, float | None]:
        """Wait until every expression in ``expected`` has its value (or satisfies its
        predicate); return what was seen. Fails with the last values seen."""
        deadline = time.monotonic() + timeout_s
        while True:
            seen = {expr: self.value(expr) for expr in expected}
            if all(_matches(seen[expr], want) for expr, want in expected.items()):
                return seen
            if time.monotonic() > deadline:
                raise AssertionError(f"Prometheus never showed {expected}; last seen {seen}")
            time.sleep(POLL_INTERVAL_S)

    def _log_tail(self) -> str:
        log = self.base_dir / "prometheus.log"
        return log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"


@contextlib.contextmanager
def private_prometheus() -> Iterator[PrometheusServer]:
    """A private Prometheus on loopback for the block (a temporary data directory, deleted
    after)."""
    binary(BINARY)
    base = Path(tempfile.mkdtemp(prefix="twophase-prometheus-"))
    server = PrometheusServer(base, free_port())
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def private_pushgateway(workdir: Path) -> Iterator[str]:
    """A private Pushgateway on loopback (no persistence) for the block: its URL."""
    url = f"http://{HOST}:{free_port()}"
    process = subprocess.Popen([binary(PUSHGATEWAY), f"--web.listen-address={url[7:]}",
                                "--log.level=warn"], cwd=workdir,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_ready(f"{url}/-/ready", process, "prometheus-pushgateway")
        yield url
    finally:
        stop_process(process, STOP_TIMEOUT_S)


def _wait_ready(url: str, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not _answers(url):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not become ready at {url}")
        time.sleep(POLL_INTERVAL_S)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _matches(value: float | None, want: float | Callable[[float | None], bool]) -> bool:
    return want(value) if callable(want) else value == want
