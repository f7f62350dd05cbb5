"""A private nats-server with JetStream for tests and benchmarks, and the tests' own view of it.

* :class:`NatsServer`: Debian's ``nats-server`` (2.9.10) on its own port of 127.0.0.1, JetStream
  on, file storage under a directory of its own, a monitoring port whose ``/healthz`` says when
  JetStream is ready. :meth:`~NatsServer.kill` SIGKILLs it (a crash: no flush),
  :meth:`~NatsServer.start` starts it again on the same store directory and port (acknowledged
  messages survive a process crash: measured, notes/redis-nats.md §2.2). Its configuration is
  a file it is started with (JSON, which nats-server reads).
* Secured (``ca=``): TLS only, a certificate of the tests' CA, and ``authorization { users }``:
  an administrator for the test's view, and users added with exactly the permissions given
  (:meth:`~NatsServer.add_user`, :meth:`~NatsServer.set_password`): each change rewrites the
  configuration and reloads it (SIGHUP, which nats-server 2.9 takes: its ``/varz``
  ``config_load_time`` says when it has).
* :class:`NatsView`: the test's own nats-py client, never the sink's code: streams made as an
  operator makes them, what a reader of a subject sees (an ephemeral consumer, message by
  message, with the headers), what a staging stream still holds.

A missing ``nats-server`` FAILS the fixture (never skips): ``apt-get install nats-server``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import nats
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError

from setups.servers.local import (
    HOST,
    ServerMissingError,
    ServerProcess,
    free_port,
    in_scratch,
    write_owner_only,
)
from setups.servers.tls import CertificateAuthority, Issued
from sinks.nats.access import Permissions

T = TypeVar("T")

PROGRAM = "/usr/sbin/nats-server"
INSTALL_HINT = "install Debian's NATS server: apt-get install nats-server"
READY_TIMEOUT_S = 30.0
HEALTH_TIMEOUT_S = 1.0
#: How long the view waits for the next message of a subject it knows holds more.
READ_TIMEOUT_S = 10.0
#: How long a reload of the configuration (SIGHUP) may take to apply.
RELOAD_TIMEOUT_S = 10.0
RELOAD_POLL_S = 0.01
#: How long a client has for its TLS handshake.
TLS_TIMEOUT_S = 2.0
#: The secured server's user of the test's view (every permission).
ADMIN = "admin"


class NatsMissingError(ServerMissingError):
    """``nats-server`` is not installed."""


def require_installed() -> str:
    """The server's program, or :class:`NatsMissingError` naming the fix."""
    found = shutil.which("nats-server") or (PROGRAM if Path(PROGRAM).exists() else None)
    if found is None:
        raise NatsMissingError(f"nats-server not found on PATH nor at {PROGRAM}: {INSTALL_HINT}")
    return found


@dataclass(frozen=True)
class NatsUser:
    """A user of the secured server: ``permissions`` None may do everything."""

    name: str
    password: str
    permissions: Permissions | None = None

    def as_config(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"user": self.name, "password": self.password}
        if self.permissions is not None:
            entry["permissions"] = self.permissions.as_config()
        return entry


class NatsServer(ServerProcess):
    """One private nats-server on its own port, JetStream stored under ``base_dir/store``;
    TLS only with a certificate of ``ca`` and users (module docstring), if given."""

    program = "nats-server"
    ready_timeout_s = READY_TIMEOUT_S

    def __init__(self, base_dir: Path, ca: CertificateAuthority | None = None) -> None:
        super().__init__(base_dir / "server.log", free_port(HOST))
        self.base_dir = base_dir
        self.store_dir = base_dir / "store"
        self.config_file = base_dir / "nats.conf"
        self.monitor_port = free_port(HOST)
        self.ca = ca
        self.certificate: Issued | None = ca.issue(f"nats-{self.port}") if ca else None
        self.users: dict[str, NatsUser] = {}
        self.admin: NatsUser | None = None
        if ca is not None:
            self.admin = NatsUser(ADMIN, secrets.token_hex(16))
            self.users[ADMIN] = self.admin

    @property
    def url(self) -> str:
        return f"nats://{HOST}:{self.port}"

    def config(self) -> dict[str, Any]:
        """The server's configuration (written as JSON, which nats-server reads)."""
        config: dict[str, Any] = {
            "listen": f"{HOST}:{self.port}", "http": f"{HOST}:{self.monitor_port}",
            "jetstream": {"store_dir": str(self.store_dir)}}
        if self.certificate is not None and self.ca is not None:
            config["tls"] = {"cert_file": str(self.certificate.certfile),
                             "key_file": str(self.certificate.keyfile),
                             "ca_file": str(self.ca.cafile), "timeout": TLS_TIMEOUT_S}
        if self.users:
            config["authorization"] = {"users": [user.as_config()
                                                 for user in self.users.values()]}
        return config

    def _write_config(self) -> None:
        """The configuration file, readable by the owner only (it holds passwords)."""
        self.base_dir.mkdir(parents=True, exist_ok=True)
        write_owner_only(self.config_file, json.dumps(self.config(), indent=1))

    def start(self) -> None:
        """Start the server on its store directory and wait until JetStream is ready."""
        if self.running:
            return
        self._write_config()
        self._launch([require_installed(), "--config", str(self.config_file),
                      "--log", str(self.log)])

    def _ready(self) -> bool:
        health = f"http://{HOST}:{self.monitor_port}/healthz?js-enabled-only=true"
        try:
            with urllib.request.urlopen(health, timeout=HEALTH_TIMEOUT_S) as reply:
                return bool(json.load(reply).get("status") == "ok")
        except (OSError, urllib.error.URLError, ValueError):
            return False

    def _config_load_time(self) -> str:
        varz = f"http://{HOST}:{self.monitor_port}/varz"
        with urllib.request.urlopen(varz, timeout=HEALTH_TIMEOUT_S) as reply:
            return str(json.load(reply)["config_load_time"])

    def reload(self) -> None:
        """Rewrite the configuration and, if the server runs, reload it (SIGHUP) and wait
        until it has (its ``config_load_time`` changes; a configuration it refuses times
        out, naming its log)."""
        self._write_config()
        if not self.running:
            return
        loaded = self._config_load_time()
        os.kill(self.pid, signal.SIGHUP)
        deadline = time.monotonic() + RELOAD_TIMEOUT_S
        while self._config_load_time() == loaded:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nats-server did not reload {self.config_file} within "
                                   f"{RELOAD_TIMEOUT_S}s; log {self.log}:\n{self._log_tail()}")
            time.sleep(RELOAD_POLL_S)

    def add_user(self, user: NatsUser) -> NatsUser:
        """``user`` added (or replaced), the configuration reloaded."""
        self.users[user.name] = user
        self.reload()
        return user

    def set_password(self, name: str, password: str) -> NatsUser:
        """The user ``name``'s password changed, the configuration reloaded."""
        user = NatsUser(name, password, self.users[name].permissions)
        return self.add_user(user)

    def view(self) -> NatsView:
        """The test's own client of this server (the administrator over verified TLS, if
        secured)."""
        if self.ca is None or self.admin is None:
            return NatsView(self.url)
        return NatsView(self.url, str(self.ca.cafile), self.admin.name, self.admin.password)

    def sink_options(self) -> dict[str, Any]:
        """How the sink reaches this server (TLS verified with the tests' CA, if secured)."""
        if self.ca is None:
            return {"servers": self.url, "tls": "off"}
        return {"servers": self.url, "ca_bundle": str(self.ca.cafile)}


def private_server(ca: CertificateAuthority | None = None
                   ) -> contextlib.AbstractContextManager[NatsServer]:
    """Start a private server in a fresh directory (secured if ``ca``); stop it and delete
    everything after."""
    require_installed()
    return in_scratch("twophase-nats-", lambda base_dir: NatsServer(base_dir, ca))


@dataclass(frozen=True)
class Message:
    """A message as a reader of the subject receives it."""

    seq: int
    data: bytes
    headers: dict[str, str]

    @property
    def event_id(self) -> int:
        return int(json.loads(self.data)["event_id"])


@dataclass(frozen=True)
class NatsView:
    """The test's own client of the server (module docstring)."""

    url: str
    #: A secured server's: the CA to verify it with, the administrator's user and password.
    ca_file: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)

    def run(self, step: Callable[[JetStreamContext], Awaitable[T]]) -> T:
        tls = ssl.create_default_context(cafile=self.ca_file) if self.ca_file else None

        async def connected() -> T:
            client = await nats.connect(self.url, allow_reconnect=False, tls=tls,
                                        user=self.user, password=self.password)
            try:
                return await step(client.jetstream())
            finally:
                await client.close()

        return asyncio.run(connected())

    def create_stream(self, name: str, subjects: list[str], **config: Any) -> None:
        """A file-backed stream of limits retention, ``config`` over that."""
        settings: dict[str, Any] = {"storage": api.StorageType.FILE, **config}
        self.run(lambda js: js.add_stream(name=name, subjects=subjects, **settings))

    def messages(self, stream: str, subject: str) -> list[Message]:
        """Every message of ``subject``, in stream order, through an ephemeral consumer."""
        async def read(js: JetStreamContext) -> list[Message]:
            held = await _count(js, stream, subject)
            if not held:
                return []
            subscription = await js.subscribe(subject, stream=stream, ordered_consumer=True)
            try:
                received = [await subscription.next_msg(timeout=READ_TIMEOUT_S)
                            for _ in range(held)]
            finally:
                await subscription.unsubscribe()
            return [Message(message.metadata.sequence.stream, message.data,
                            dict(message.headers or {})) for message in received]

        return self.run(read)

    def event_ids(self, stream: str, subject: str) -> list[int]:
        """The ``event_id`` of every message a reader of ``subject`` sees, in stream order."""
        return [message.event_id for message in self.messages(stream, subject)]

    def subjects(self, stream: str, subject_filter: str) -> dict[str, int]:
        """The subjects of ``stream`` matching ``subject_filter`` that hold messages, with
        their counts ({} for a stream that does not exist)."""
        async def listed(js: JetStreamContext) -> dict[str, int]:
            try:
                info = await js.stream_info(stream, subjects_filter=subject_filter)
            except NotFoundError:
                return {}
            return {name: held for name, held in (info.state.subjects or {}).items() if held}

        return self.run(listed)


async def _count(js: JetStreamContext, stream: str, subject: str) -> int:
    info = await js.stream_info(stream, subjects_filter=subject)
    return int((info.state.subjects or {}).get(subject, 0))
