"""What every private test server needs: a free loopback port, and a way to stop its process."""

from __future__ import annotations

import socket
import subprocess

HOST = "127.0.0.1"


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
