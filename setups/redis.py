"""Redis Streams (a private durable ``redis-server``): a fresh stream per target, read by
``redis-cli`` (``XRANGE``, not the sink's code); what is in doubt is the sink's index and
staging keys beside the stream, listed by ``redis-cli`` too.

:class:`SecuredRedisSetup` is the same over a server that takes verified TLS only, the sink
logging in as an ACL user holding exactly :func:`sinks.redis.acl_rules` for its stream, its
password read by reference (:func:`setups.least_privilege.sink_with_password_file`)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from setups import least_privilege
from setups.base import Proxy, ProxyFactory, SinkSetup, Target, relayed
from setups.servers.local import write_owner_only
from setups.servers.redis import RedisServer, RedisUser, private_server
from sinks.redis import acl_rules
from sinks.redis.keys import StreamKeys

READ_TIMEOUT_S = 60.0


def entries(server: RedisServer, stream: str, user: RedisUser | None = None
            ) -> list[dict[str, str]]:
    """Every entry of ``stream``, oldest first, as ``redis-cli --json XRANGE`` prints it."""
    done = subprocess.run([*server.cli_command(user), "--json", "XRANGE", stream, "-", "+"],
                          capture_output=True, text=True, errors="surrogateescape", check=True,
                          timeout=READ_TIMEOUT_S)
    return [dict(zip(fields[::2], fields[1::2], strict=True))
            for _id, fields in json.loads(done.stdout or "[]")]


class RedisSetup(SinkSetup):
    name = "redis"
    factory = "sinks.redis:RedisStreamSink"
    killable = True
    model_ci_examples = 8
    servers = ("redis_node",)
    since = "0.5.0"

    def __init__(self, scratch: Path, server: RedisServer, proxy: Proxy | None = None) -> None:
        super().__init__(scratch, proxy)
        self.server = server

    @classmethod
    @contextlib.contextmanager
    def started(cls, scratch: Path, proxy: ProxyFactory | None = None) -> Iterator[RedisSetup]:
        with private_server() as server, relayed(proxy, server.port) as relay:
            yield cls(scratch, server, relay)

    @classmethod
    @contextlib.contextmanager
    def over(cls, scratch: Path, servers: Mapping[str, Any]) -> Iterator[RedisSetup]:
        yield cls(scratch, servers["redis_node"])

    def target_options(self, **overrides: Any) -> dict[str, Any]:
        options = {**self.server.sink_options(), "stream": f"orders-{uuid.uuid4().hex[:12]}",
                   **overrides}
        if self.proxy is not None:
            options["port"] = self.proxy.port
        return options

    def visible(self, target: Target) -> list[int]:
        """Read as the server's default user (on the secured server: over verified TLS)."""
        return [int(entry["event_id"])
                for entry in entries(self.server, target.options["stream"])]

    def in_doubt(self, target: Target) -> list[Any]:
        """The sink's index entries and staging streams of the target's stream."""
        keys = StreamKeys(target.options["stream"])
        staged = self.server.cli("HKEYS", keys.staged).split()
        stages = self.server.cli("--scan", "--pattern", keys.stages).split()
        return [*staged, *stages]

    @staticmethod
    def sink_rules(stream: str) -> list[str]:
        """The ACL rules of a user holding exactly what the sink needs for ``stream``."""
        return acl_rules(stream, StreamKeys(stream).pattern)

    def kill_server(self) -> None:
        self.server.kill()

    def start_server(self) -> None:
        self.server.start()


class SecuredRedisSetup(RedisSetup):
    """The secured server (TLS only, the run's CA); each target's stream written by an ACL
    user of its own holding exactly the sink's rules for it, its password read from a file."""

    name = "redis-secured"
    factory = least_privilege.FACTORY

    def target_options(self, **overrides: Any) -> dict[str, Any]:
        options = super().target_options(**overrides)
        password = uuid.uuid4().hex
        user = self.server.create_user(f"sink-{uuid.uuid4().hex[:8]}", password,
                                       self.sink_rules(options["stream"]))
        password_file = self.scratch / f"{user.name}.password"
        self.scratch.mkdir(parents=True, exist_ok=True)
        write_owner_only(password_file, password)
        return {**options, "sink": RedisSetup.factory, "username": user.name,
                "password_file": str(password_file)}
