"""The reference receiver (``python -m sinks.http.receiver``) on a free loopback port.

The test fixtures over it (the pytest plugin ``tests/fixtures/http_receiver.py``):

* ``http_receiver`` (session): one receiver process for the whole run, requiring a bearer
  token and a signature, with its own SQLite store; stopped at the end.
* ``http_secured`` (session): the same over HTTPS, with a certificate of the run's CA
  (``tls_ca``): its sink options name the CA file (``ca_bundle=``), the token and the secret.
* ``receiver_path`` (function): a fresh URL path on it, so each test counts its own records.
* ``private_receiver`` (function): a factory of receivers of a test's own (another store, other
  options: ``--max-body``, ``--key-expiry``, ``--forward``, TLS), for tests that SIGKILL and
  restart them (:meth:`ReceiverProcess.kill`, :meth:`ReceiverProcess.restart`).

If aiohttp is not installed the fixtures FAIL (they never skip): ``pip install -e '.[dev]'``.
The benchmark ``bench/http_sink.py`` starts its receiver through :func:`started` too.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import os
import signal
import sqlite3
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from setups.servers.local import ServerMissingError, free_port, stop_process
from setups.servers.tls import CertificateAuthority
from sinks.http.protocol import WELL_KNOWN

HOST = "127.0.0.1"
TOKEN = "test-bearer-token"
SIGNING_SECRET = "test-signing-secret"
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
INSTALL_HINT = "install the dev extra: pip install -e '.[dev]' (it brings aiohttp)"

_paths = itertools.count()


@dataclass
class ReceiverProcess:
    """One receiver process, its store and the secrets its clients need."""

    workdir: Path
    port: int
    options: list[str] = field(default_factory=list)
    token: str | None = TOKEN
    signing_secret: str | None = SIGNING_SECRET
    certfile: Path | None = None
    #: The CA file its clients verify ``certfile`` against (None: the certificate itself).
    cafile: Path | None = None
    #: False if ``certfile`` names another host (the readiness check then skips host names).
    names_host: bool = True
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def db(self) -> Path:
        return self.workdir / "receipts.sqlite"

    @property
    def log(self) -> Path:
        return self.workdir / "receiver.log"

    def url(self, path: str = "/") -> str:
        return f"{'https' if self.certfile else 'http'}://{HOST}:{self.port}{path}"

    def sink_options(self, path: str) -> dict[str, Any]:
        """What an HttpSink needs to reach it (the crash suite passes these to the driver)."""
        tls = {"ca_bundle": str(self.cafile)} if self.certfile and self.cafile else {}
        return {"url": self.url(path), "token": self.token,
                "signing_secret": self.signing_secret, **tls}

    # -- process ---------------------------------------------------------------------------

    def start(self) -> None:
        args = [sys.executable, "-m", "sinks.http.receiver", "--db", str(self.db),
                "--host", HOST, "--port", str(self.port), *self.options]
        if self.token:
            args += ["--token-file", str(self._secret_file("token", self.token))]
        if self.signing_secret:
            args += ["--signing-secret-file",
                     str(self._secret_file("signing-secret", self.signing_secret))]
        if self.certfile:
            args += ["--certfile", str(self.certfile),
                     "--keyfile", str(self.certfile.with_suffix(".key"))]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.starts += 1
        self._wait_ready()

    def kill(self) -> None:
        """SIGKILL: no shutdown, no flush but what SQLite already made durable."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def restart(self, options: list[str] | None = None) -> None:
        """Start again on the same port and store (after :meth:`kill` or :meth:`stop`)."""
        self.stop()
        if options is not None:
            self.options = options
        self.start()

    def stop(self) -> None:
        stop_process(self.process, STOP_TIMEOUT_S)

    def _secret_file(self, name: str, value: str) -> Path:
        path = self.workdir / name
        path.write_text(value)
        path.chmod(0o600)
        return path

    def _wait_ready(self) -> None:
        assert self.process is not None
        context = None
        if self.certfile:
            context = ssl.create_default_context(cafile=str(self.cafile or self.certfile))
            context.check_hostname = self.names_host
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the receiver exited with {self.process.returncode}: "
                                   f"{self.log.read_text()[-2000:]}")
            with contextlib.suppress(OSError, urllib.error.URLError):
                urllib.request.urlopen(self.url(WELL_KNOWN), timeout=1, context=context).close()
                return
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"the receiver did not answer within {READY_TIMEOUT_S}s: {self.log}")

    # -- its own view --------------------------------------------------------------------------

    def records(self, path: str | None = None) -> list[dict[str, Any]]:
        """Every record delivered (to ``path``), in order of arrival."""
        with contextlib.closing(sqlite3.connect(self.db)) as db:
            rows = db.execute("SELECT record FROM records WHERE ? IS NULL OR path = ? "
                              "ORDER BY id", (path, path)).fetchall()
        return [json.loads(record) for (record,) in rows]

    def event_ids(self, path: str | None = None) -> list[int]:
        return sorted(int(record["event_id"]) for record in self.records(path))

    def key_states(self) -> dict[str, str]:
        """Every idempotency key the store holds, and its state."""
        with contextlib.closing(sqlite3.connect(self.db)) as db:
            return dict(db.execute("SELECT key, state FROM idempotency_keys").fetchall())


#: Starts a private receiver of a test (the ``private_receiver`` fixture).
Receivers = Callable[..., ReceiverProcess]


def require_aiohttp() -> None:
    """Raises :class:`ServerMissingError` if aiohttp (the receiver's server) is missing."""
    if importlib.util.find_spec("aiohttp") is None:
        raise ServerMissingError(f"the HTTP receiver needs aiohttp: {INSTALL_HINT}")


@contextlib.contextmanager
def started(workdir: Path, options: list[str] | None = None, **settings: Any,
            ) -> Iterator[ReceiverProcess]:
    """A receiver on a free port with a fresh store in ``workdir``; stopped on exit."""
    require_aiohttp()
    workdir.mkdir(parents=True, exist_ok=True)
    receiver = ReceiverProcess(workdir, free_port(HOST), list(options or ()), **settings)
    try:
        receiver.start()
        yield receiver
    finally:
        receiver.stop()


def new_path() -> str:
    return f"/hooks/t{next(_paths)}"


@contextlib.contextmanager
def secured(workdir: Path, tls_ca: CertificateAuthority) -> Iterator[ReceiverProcess]:
    """A receiver over HTTPS with a certificate of ``tls_ca``, requiring token and signature."""
    with started(workdir, certfile=tls_ca.issue("http-receiver").certfile,
                 cafile=tls_ca.cafile) as receiver:
        yield receiver


class Downstream:
    """A webhook in this process (a forwarding receiver's downstream): counts what reaches it,
    can hold requests or refuse them."""

    def __init__(self) -> None:
        self.hits: list[bytes] = []
        self.arrived = threading.Event()
        self.gate = threading.Event()
        self.gate.set()
        self.answers: list[tuple[int, bytes]] = []  # answered first, then 200
        self.headers: dict[str, str] = {}  # sent with every answer
        downstream = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                downstream.arrived.set()
                downstream.gate.wait(30)
                status, answer = (downstream.answers.pop(0) if downstream.answers
                                  else (200, b'{"ok": true}'))
                if status < 300:
                    downstream.hits.append(body)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                for name, value in downstream.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/webhook"

    def records(self) -> list[int]:
        return sorted(record["event_id"] for body in self.hits for record in json.loads(body))

    def close(self) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()
