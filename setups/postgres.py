"""PostgreSQL through ``PREPARE TRANSACTION``: a fresh orders table per target on a private
server (:mod:`setups.servers.postgres`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from setups.base import Proxy, ProxyFactory, SinkSetup, Target, relayed
from setups.servers.postgres import PgView, PostgresServer, private_server


class PostgresSetup(SinkSetup):
    name = "postgres"
    factory = "sinks.postgres:PostgresSink"
    killable = True

    def __init__(self, scratch: Path, server: PostgresServer, proxy: Proxy | None = None
                 ) -> None:
        super().__init__(scratch, proxy)
        self.server, self.view = server, PgView(server)

    @classmethod
    @contextlib.contextmanager
    def started(cls, scratch: Path, proxy: ProxyFactory | None = None,
                settings: Mapping[str, str] | None = None) -> Iterator[PostgresSetup]:
        with private_server(settings) as server, relayed(proxy, server.port) as relay:
            yield cls(scratch, server, relay)

    def target_options(self, **overrides: Any) -> dict[str, Any]:
        options = {**self.server.params.sink_options(), "table": self.view.new_orders_table(),
                   **overrides}
        if self.proxy is not None:
            options["port"] = self.proxy.port
        return options

    def visible(self, target: Target) -> list[int]:
        return self.view.event_ids(target.options["table"])

    def in_doubt(self, target: Target) -> list[Any]:
        """The prepared transactions of the test database (tests run one at a time)."""
        return self.view.prepared()

    def kill_server(self) -> None:
        self.server.kill()

    def start_server(self) -> None:
        self.server.start()
