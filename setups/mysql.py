"""MariaDB through the XA sink: a fresh table (and marker table) per target on a private
server (:mod:`setups.servers.mariadb`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from setups.base import Proxy, ProxyFactory, SinkSetup, Target, relayed
from setups.servers.mariadb import Db, MariaDBServer, private_server

ORDERS_DDL = (
    "CREATE TABLE `{table}` (event_id BIGINT NOT NULL PRIMARY KEY, order_id BIGINT NOT NULL, "
    "status VARCHAR(16) NOT NULL CHECK (status <> 'bogus'), ts DATETIME(6)) ENGINE=InnoDB"
)


class MySQLSetup(SinkSetup):
    name = "mysql"
    factory = "sinks.mysql:MySQLXASink"
    killable = True

    def __init__(self, scratch: Path, server: MariaDBServer, proxy: Proxy | None = None) -> None:
        super().__init__(scratch, proxy)
        self.server, self.db = server, Db(server)

    @classmethod
    @contextlib.contextmanager
    def started(cls, scratch: Path, proxy: ProxyFactory | None = None) -> Iterator[MySQLSetup]:
        with private_server() as server, relayed(proxy, server.params.port) as relay:
            yield cls(scratch, server, relay)

    def target_options(self, **overrides: Any) -> dict[str, Any]:
        table = self.db.new_table(ORDERS_DDL, prefix="orders_")
        options = {**self.server.params.kwargs(), "table": table, "marker_table": f"m_{table}",
                   "fencing": True, **overrides}
        if self.proxy is not None:
            options["port"] = self.proxy.port
        return options

    def visible(self, target: Target) -> list[int]:
        return [row[0] for row in self.db.query(
            f"SELECT event_id FROM `{target.options['table']}`")]

    def in_doubt(self, target: Target) -> list[Any]:
        """Every prepared XA branch on the server (tests run one at a time)."""
        return self.db.xa_recover()

    def kill_server(self) -> None:
        self.server.kill()

    def start_server(self) -> None:
        self.server.start()
