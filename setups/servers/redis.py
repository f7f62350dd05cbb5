"""Private ``redis-server`` processes (Debian's ``redis-server`` 7.0): one durable server
(:class:`RedisServer`: AOF with ``appendfsync always``, ``noeviction``, its files in a
directory of its own, so a ``kill -9`` and a restart keep every acknowledged write), a
secured one (TLS only, verified with the tests' private CA, and an ACL user), and a cluster of
three such servers (:class:`RedisCluster`), read by ``redis-cli`` (:meth:`RedisServer.cli`).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from setups.servers.local import HOST, ServerMissingError, ServerProcess, free_port, in_scratch
from setups.servers.tls import CertificateAuthority, Issued

#: The settings that make an acknowledged write survive a crash of the server (and of the
#: OS: ``always`` fsyncs before it replies) and never evict a key.
DURABLE_SETTINGS: Mapping[str, str] = {
    "appendonly": "yes", "appendfsync": "always", "maxmemory-policy": "noeviction",
    "save": "", "aof-load-truncated": "yes"}
CLUSTER_NODES = 3
CLUSTER_READY_TIMEOUT_S = 30.0
FIX_INSTALL = "install Debian's redis-server and redis-tools: apt-get install -y redis-server " \
    "redis-tools"


class RedisMissingError(ServerMissingError):
    """Debian's ``redis-server`` or ``redis-cli`` is not installed."""


def require_installed() -> None:
    for program in ("redis-server", "redis-cli"):
        if shutil.which(program) is None:
            raise RedisMissingError(f"{program} is not installed ({FIX_INSTALL}).")


@dataclass(frozen=True)
class RedisUser:
    """An ACL user of the server, as the sink's options name it."""

    name: str
    password: str


class RedisServer(ServerProcess):
    """One private ``redis-server`` on its own port and directory (``settings`` over
    :data:`DURABLE_SETTINGS`; TLS only, with a certificate of ``ca``, if given)."""

    program = "redis-server"

    def __init__(self, base_dir: Path, settings: Mapping[str, str] | None = None,
                 ca: CertificateAuthority | None = None, port: int | None = None) -> None:
        super().__init__(base_dir / "server.log", port or free_port(HOST))
        self.base_dir = base_dir
        self.settings = {**DURABLE_SETTINGS, **(settings or {})}
        self.ca = ca
        self.certificate: Issued | None = ca.issue(f"redis-{self.port}") if ca else None

    @property
    def tls(self) -> bool:
        return self.ca is not None

    def config_lines(self) -> list[str]:
        listen = (["port 0", f"tls-port {self.port}", f"tls-cert-file {self.certificate.certfile}",
                   f"tls-key-file {self.certificate.keyfile}",
                   f"tls-ca-cert-file {self.ca.cafile}", "tls-auth-clients optional"]
                  if self.certificate is not None and self.ca is not None
                  else [f"port {self.port}"])
        return [*listen, f"bind {HOST}", f"dir {self.base_dir}", "daemonize no",
                f"logfile {self.log}", "protected-mode no",
                *(f"{name} {value}" if value else f'{name} ""'
                  for name, value in self.settings.items())]

    def start(self) -> None:
        """Start the server on its directory (replaying its AOF) and wait until it answers."""
        if self.running:
            return
        config = self.base_dir / "redis.conf"
        config.write_text("\n".join(self.config_lines()) + "\n")
        self._launch(["redis-server", str(config)])

    def _ready(self) -> bool:
        try:
            return self.cli("PING", timeout_s=2).strip() == "PONG"
        except (subprocess.SubprocessError, OSError, RuntimeError):
            return False

    def cli_command(self, user: RedisUser | None = None) -> list[str]:
        """``redis-cli`` connected to this server (as the default user unless ``user``)."""
        command = ["redis-cli", "-h", HOST, "-p", str(self.port)]
        if self.ca is not None:
            command += ["--tls", "--cacert", str(self.ca.cafile)]
        if user is not None:
            command += ["--user", user.name, "--pass", user.password, "--no-auth-warning"]
        return command

    def cli(self, *arguments: str, timeout_s: float = 30.0, user: RedisUser | None = None
            ) -> str:
        """What ``redis-cli --raw`` prints for one command (raises on an error reply)."""
        done = subprocess.run([*self.cli_command(user), "--raw", *arguments],
                              capture_output=True, text=True, errors="surrogateescape",
                              timeout=timeout_s, check=False)
        if done.returncode != 0 or done.stdout.startswith("ERR") or (
                done.stdout.startswith(("WRONGTYPE", "NOPERM", "NOAUTH"))):
            raise RuntimeError(f"redis-cli {' '.join(arguments)}: {done.stdout}{done.stderr}")
        return done.stdout

    def client(self) -> redis.Redis:
        """A redis-py client of the default user (over verified TLS on a secured server)."""
        if self.ca is None:
            return redis.Redis(host=HOST, port=self.port)
        return redis.Redis(host=HOST, port=self.port, ssl=True, ssl_ca_certs=str(self.ca.cafile))

    def create_user(self, name: str, password: str, rules: Sequence[str]) -> RedisUser:
        """An ACL user with exactly ``rules`` (``~pattern``, ``+command``...)."""
        self.cli("ACL", "SETUSER", name, "reset", "on", f">{password}", *rules)
        return RedisUser(name, password)

    def sink_options(self) -> dict[str, Any]:
        """How the sink reaches this server (TLS verified with the tests' CA, if secured)."""
        options: dict[str, Any] = {"host": HOST, "port": self.port}
        if self.ca is not None:
            options["ca_bundle"] = str(self.ca.cafile)
        else:
            options["tls"] = "off"
        return options


def private_server(settings: Mapping[str, str] | None = None,
                   ca: CertificateAuthority | None = None
                   ) -> contextlib.AbstractContextManager[RedisServer]:
    """A private durable server (TLS only if ``ca``); stopped and deleted after."""
    require_installed()
    return in_scratch("twophase-redis-", lambda base_dir: RedisServer(base_dir, settings, ca))


class RedisCluster:
    """Three private servers in cluster mode, every slot assigned, no replicas."""

    def __init__(self, base_dir: Path) -> None:
        self.nodes = [RedisServer(base_dir / f"node{index}",
                                  {"cluster-enabled": "yes",
                                   "cluster-config-file": "nodes.conf",
                                   "cluster-node-timeout": "5000",
                                   # the bus's default, port + 10000, may pass 65535
                                   "cluster-port": str(free_port(HOST))})
                      for index in range(CLUSTER_NODES)]
        for node in self.nodes:
            node.base_dir.mkdir(parents=True, exist_ok=True)

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        addresses = [f"{HOST}:{node.port}" for node in self.nodes]
        subprocess.run(["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas",
                        "0", "--cluster-yes"], capture_output=True, check=True, timeout=60)
        deadline = time.monotonic() + CLUSTER_READY_TIMEOUT_S
        while not self.ready():
            if time.monotonic() > deadline:
                raise RuntimeError("the private Redis cluster did not reach cluster_state:ok "
                                   "on every node")
            time.sleep(0.1)

    def ready(self) -> bool:
        """Every node says the cluster is ok (each learns it on its own, over the bus)."""
        return all("cluster_state:ok" in node.cli("CLUSTER", "INFO") for node in self.nodes)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def sink_options(self) -> dict[str, Any]:
        return {**self.nodes[0].sink_options(), "cluster": True}

    def node_of(self, key: str) -> RedisServer:
        """The node that serves ``key``'s slot (from its own ``CLUSTER NODES`` line)."""
        slot = int(self.nodes[0].cli("CLUSTER", "KEYSLOT", key))
        for node in self.nodes:
            myself = next(row.split() for row in node.cli("CLUSTER", "NODES").splitlines()
                          if "myself" in row.split()[2])
            for assigned in myself[8:]:
                low, _, high = assigned.partition("-")
                if int(low) <= slot <= int(high or low):
                    return node
        raise RuntimeError(f"no node of the private cluster serves slot {slot}")


def private_cluster() -> contextlib.AbstractContextManager[RedisCluster]:
    """Three private servers as one cluster; stopped and deleted after."""
    require_installed()
    return in_scratch("twophase-redis-cluster-", RedisCluster)
