"""What every private test server needs: a free loopback port, a way to stop its process, and
(:class:`ServerProcess`) the life of a server process of its own."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

HOST = "127.0.0.1"
#: The mode of a file holding keys or passwords (a server's configuration, a sink's password).
OWNER_ONLY = 0o600


class Startable(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


S = TypeVar("S", bound=Startable)


class ServerMissingError(RuntimeError):
    """A server's program, jars or library is not installed; the message names the fix. The
    test fixtures that start the server turn it into a failure (never a skip)."""


def write_owner_only(path: Path, content: str | bytes) -> None:
    """``content`` into the file ``path``, created readable by its owner only (never for a
    moment by anyone else)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, OWNER_ONLY)
    with os.fdopen(descriptor, "wb") as out:
        out.write(content.encode() if isinstance(content, str) else content)


def free_port(host: str = HOST) -> int:
    """A TCP port nothing listens on now (the OS picks it; a server binds it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def stop_process(process: subprocess.Popen[bytes] | None, timeout_s: float) -> None:
    """SIGTERM a server that still runs, SIGKILL it if it has not ended within ``timeout_s``."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class ServerProcess:
    """A private server process in a session of its own: started by a subclass's ``start``
    through :meth:`_launch`, SIGKILLed with every child (:meth:`kill`, as a crash or a power
    cut), stopped by its clean-shutdown signal, and waited for until :meth:`_ready`."""

    #: The program's name, for messages.
    program: ClassVar[str]
    #: The signal of a clean (and quick) shutdown.
    stop_signal: ClassVar[int] = signal.SIGTERM
    ready_timeout_s: ClassVar[float] = 30.0
    stop_timeout_s: ClassVar[float] = 30.0
    poll_interval_s: ClassVar[float] = 0.05

    def __init__(self, log: Path, port: int) -> None:
        self.log, self.port = log, port
        self._process: subprocess.Popen[bytes] | None = None

    def _ready(self) -> bool:
        """Whether the server takes connections now."""
        raise NotImplementedError

    def _launch(self, command: list[str], **popen: Any) -> None:
        """Start ``command`` in a session of its own and wait until the server is ready."""
        popen.setdefault("stdout", subprocess.DEVNULL)
        popen.setdefault("stderr", subprocess.DEVNULL)
        self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                         start_new_session=True, **popen)
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"{self.program} exited with {self._process.returncode} at "
                                   f"start; log {self.log}:\n{self._log_tail()}")
            if self._ready():
                return
            time.sleep(self.poll_interval_s)
        raise RuntimeError(f"{self.program} on port {self.port} not ready after "
                           f"{self.ready_timeout_s}s; log {self.log}:\n{self._log_tail()}")

    def kill(self) -> None:
        """SIGKILL the server and every process of its session (no shutdown, no flush)."""
        process = self._process
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        self._process = None

    def stop(self) -> None:
        """Shut down cleanly, or kill if it does not stop in time."""
        process = self._process
        if process is None:
            return
        process.send_signal(self.stop_signal)
        try:
            process.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
        self._process = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int:
        """The server's process id (a process group leader: its children are in its group)."""
        if self._process is None:
            raise RuntimeError(f"{self.program} is not running")
        return self._process.pid

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return "(no log)"


@contextlib.contextmanager
def in_scratch(prefix: str, make: Callable[[Path], S]) -> Iterator[S]:
    """The server ``make`` builds in a fresh temporary directory (named from ``prefix``),
    started; stopped and its directory deleted after."""
    base_dir = Path(tempfile.mkdtemp(prefix=prefix))
    server = make(base_dir)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(base_dir, ignore_errors=True)
