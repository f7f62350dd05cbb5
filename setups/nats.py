"""NATS JetStream through a compare-and-set chain: a fresh stream and subject per target on a
private nats-server (:mod:`setups.servers.nats`), read back by the test's own consumer.

:class:`SecuredNatsSetup` is the same over a server that takes verified TLS only, each target
written by a user of its own holding exactly :func:`sinks.nats.access.permissions` for it, its
password read by reference (:func:`setups.least_privilege.sink_with_password_file`)."""

from __future__ import annotations

import contextlib
import itertools
import os
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from setups import least_privilege
from setups.base import Proxy, ProxyFactory, SinkSetup, Target, relayed
from setups.servers.local import HOST, write_owner_only
from setups.servers.nats import NatsServer, NatsUser, private_server
from setups.servers.tls import CertificateAuthority
from sinks.nats.access import Permissions, permissions
from sinks.nats.subjects import Layout

#: Where the sink's staged messages and proofs go: ``<prefix><stream>`` (named in the options,
#: so that this setup reads the staging without the sink's code).
STAGING_PREFIX = "STAGE_"
#: Stream numbers of this process: a fresh name per target, whichever setup makes it.
_stream_numbers = itertools.count()


class NatsSetup(SinkSetup):
    name = "nats"
    factory = "sinks.nats:JetStreamSink"
    since = "0.5.0"
    killable = True
    model_ci_examples = 8
    #: ``nats``: the session's server, started again if a test killed it.
    servers = ("nats",)

    def __init__(self, scratch: Path, server: NatsServer, proxy: Proxy | None = None) -> None:
        super().__init__(scratch, proxy)
        self.server, self.view = server, server.view()

    @classmethod
    @contextlib.contextmanager
    def started(cls, scratch: Path, proxy: ProxyFactory | None = None) -> Iterator[NatsSetup]:
        with private_server() as server, relayed(proxy, server.port) as relay:
            yield cls(scratch, server, relay)

    @classmethod
    @contextlib.contextmanager
    def over(cls, scratch: Path, servers: Mapping[str, Any]) -> Iterator[NatsSetup]:
        yield cls(scratch, servers["nats"])

    def new_stream(self, **config: Any) -> tuple[str, str]:
        """A fresh stream (``config`` over file storage, limits retention) whose one subject
        nobody used before: its name and subject."""
        number = f"{os.getpid()}_{next(_stream_numbers)}"
        stream, subject = f"ORDERS_{number}", f"orders.{number}"
        self.view.create_stream(stream, [subject], **config)
        return stream, subject

    def target_options(self, **overrides: Any) -> dict[str, Any]:
        stream_config = overrides.pop("stream_config", {})
        stream, subject = self.new_stream(**stream_config)
        options = self.server.sink_options()
        if self.proxy is not None:
            options["servers"] = f"nats://{HOST}:{self.proxy.port}"
        return {**options, "stream": stream, "subject": subject,
                "staging_stream": f"{STAGING_PREFIX}{stream}", **overrides}

    def visible(self, target: Target) -> list[int]:
        return self.view.event_ids(target.options["stream"], target.options["subject"])

    def in_doubt(self, target: Target) -> list[Any]:
        """The staged transactions of the target's staging stream (its subjects that still
        hold messages)."""
        staged = self.view.subjects(target.options["staging_stream"], "twophase.stage.>")
        return sorted(staged)

    def kill_server(self) -> None:
        self.server.kill()

    def start_server(self) -> None:
        self.server.start()


class SecuredNatsSetup(NatsSetup):
    """The secured server (TLS only, the run's CA); each target written by a user of its own
    holding exactly the sink's permissions for it, its password read from a 0600 file."""

    name = "nats-secured"
    factory = least_privilege.FACTORY
    servers = ("secured_nats",)

    @classmethod
    @contextlib.contextmanager
    def started(cls, scratch: Path, proxy: ProxyFactory | None = None) -> Iterator[NatsSetup]:
        """A secured server of its own, its certificate from a CA made under ``scratch``."""
        ca = CertificateAuthority(scratch / "tls-ca")
        with private_server(ca=ca) as server, relayed(proxy, server.port) as relay:
            yield cls(scratch, server, relay)

    @classmethod
    @contextlib.contextmanager
    def over(cls, scratch: Path, servers: Mapping[str, Any]) -> Iterator[NatsSetup]:
        yield cls(scratch, servers["secured_nats"])

    @staticmethod
    def sink_permissions(options: Mapping[str, Any]) -> Permissions:
        """What the sink needs for the target of ``options``: the one list of the sink's."""
        return permissions(options["subject"],
                           Layout(options["stream"], options["staging_stream"]))

    def new_user(self, permissions: Permissions) -> tuple[NatsUser, Path]:
        """A user of the server holding ``permissions``, and the 0600 file of its password."""
        user = self.server.add_user(NatsUser(f"sink-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex,
                                             permissions))
        self.scratch.mkdir(parents=True, exist_ok=True)
        password_file = self.scratch / f"{user.name}.password"
        write_owner_only(password_file, user.password)
        return user, password_file

    def target_options(self, **overrides: Any) -> dict[str, Any]:
        options = super().target_options(**overrides)
        user, password_file = self.new_user(self.sink_permissions(options))
        return {**options, "sink": NatsSetup.factory, "user": user.name,
                "password_file": str(password_file)}
