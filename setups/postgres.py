"""PostgreSQL through ``PREPARE TRANSACTION``: a fresh orders table per target on a private
server (:mod:`setups.servers.postgres`), plain or secured (``secured_postgres``: the same
setup, the sink's options verify TLS); the grants the sink's user needs
(:func:`setups.least_privilege.least_privileged_target`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from setups.base import Proxy, ProxyFactory, SinkSetup, Target, relayed
from setups.least_privilege import Grant, table_privileges
from setups.servers.postgres import PgView, PostgresServer, private_server
from sinks.postgres.markers import DEFAULT_MARKER_TABLE
from sinks.postgres.schema import MARKER_PRIVILEGES, Table, marker_ddl

# What the sink's user needs (README, Security: PostgreSQL): on the table
# :func:`~setups.least_privilege.table_privileges`; on the marker table
# :data:`~sinks.postgres.schema.MARKER_PRIVILEGES`, the table created beforehand by its owner
# (or CREATE on the schema, for the sink to create it). ``COMMIT PREPARED`` needs the user
# that prepared: the driver, executors and cleanup log in as the same user.


class PostgresSetup(SinkSetup):
    name = "postgres"
    factory = "sinks.postgres:PostgresSink"
    killable = True
    model_ci_examples = 8
    #: ``pg``: the server's view, which fails the test if it leaves a transaction prepared.
    servers = ("pg",)

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

    @classmethod
    @contextlib.contextmanager
    def over(cls, scratch: Path, servers: Mapping[str, Any]) -> Iterator[PostgresSetup]:
        yield cls(scratch, servers["pg"].server)

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

    def sink_grants(self, options: Mapping[str, Any]) -> dict[str, Grant]:
        schema = options.get("schema", "public")
        markers = Table(schema, options.get("marker_table", DEFAULT_MARKER_TABLE))
        self.view.query(marker_ddl(markers))  # by the owner: the sink's user cannot CREATE
        return {"table": (table_privileges(options), str(Table(schema, options["table"]))),
                "markers": (MARKER_PRIVILEGES, str(markers))}

    def create_sink_user(self, name: str, password: str, grants: list[Grant]) -> None:
        self.server.create_user(name, password, [f"{', '.join(privileges)} ON {on}"
                                                 for privileges, on in grants])

    def kill_server(self) -> None:
        self.server.kill()

    def start_server(self) -> None:
        self.server.start()
