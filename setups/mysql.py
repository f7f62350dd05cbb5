"""MariaDB through the XA sink: a fresh table (and marker table) per target on a private
server (:mod:`setups.servers.mariadb`), plain or secured (``secured_mariadb``: the same setup,
the sink's options verify TLS); the grants the sink's user needs
(:func:`setups.least_privilege.least_privileged_target`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from setups.base import Proxy, ProxyFactory, SinkSetup, Target, relayed
from setups.least_privilege import KEYED_PRIVILEGES, Grant, table_privileges
from setups.servers.mariadb import Db, MariaDBServer, private_server
from sinks.mysql.fencing import DEFAULT_FENCE_TABLE
from sinks.mysql.keyed import MAX_NAME_LENGTH
from sinks.mysql.markers import DEFAULT_MARKER_TABLE
from sinks.mysql.schema import Table
from twophase.kit import KEYED
from twophase.kit.sql import tombstone_table_name

#: What the sink's user needs, by role (README, Security: MySQL / MariaDB). CREATE on the
#: marker and fence tables only if the sink creates them (``check_schema``); XA statements,
#: ``XA RECOVER`` and ``XA COMMIT`` of another session's branch need none on MariaDB.
MARKER_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "CREATE")
FENCE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "CREATE")

ORDERS_DDL = (
    "CREATE TABLE `{table}` (event_id BIGINT NOT NULL PRIMARY KEY, order_id BIGINT NOT NULL, "
    "status VARCHAR(16) NOT NULL CHECK (status <> 'bogus'), ts DATETIME(6)) ENGINE=InnoDB"
)


class MySQLSetup(SinkSetup):
    name = "mysql"
    factory = "sinks.mysql:MySQLXASink"
    killable = True
    model_ci_examples = 10
    #: ``db``: the test fails if it leaves an XA branch prepared.
    servers = ("mariadb", "db")

    def __init__(self, scratch: Path, server: MariaDBServer, proxy: Proxy | None = None) -> None:
        super().__init__(scratch, proxy)
        self.server, self.db = server, Db(server)

    @classmethod
    @contextlib.contextmanager
    def started(cls, scratch: Path, proxy: ProxyFactory | None = None) -> Iterator[MySQLSetup]:
        with private_server() as server, relayed(proxy, server.params.port) as relay:
            yield cls(scratch, server, relay)

    @classmethod
    @contextlib.contextmanager
    def over(cls, scratch: Path, servers: Mapping[str, Any]) -> Iterator[MySQLSetup]:
        yield cls(scratch, servers["mariadb"])

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

    def sink_grants(self, options: Mapping[str, Any]) -> dict[str, Grant]:
        database = options.get("database", self.server.params.database)
        grants = {"table": (table_privileges(options), str(Table(database, options["table"]))),
                  "markers": (MARKER_PRIVILEGES, str(Table(
                      database, options.get("marker_table", DEFAULT_MARKER_TABLE))))}
        if options.get("fencing"):
            grants["fence"] = (FENCE_PRIVILEGES, str(Table(
                database, options.get("fence_table", DEFAULT_FENCE_TABLE))))
        if options.get("mode") == KEYED:
            tombstones = tombstone_table_name(options["table"], MAX_NAME_LENGTH)
            grants["tombstones"] = ((*KEYED_PRIVILEGES, "CREATE"),
                                    str(Table(database, tombstones)))
            grants["changes"] = (("CREATE TEMPORARY TABLES",), f"`{database}`.*")
        return grants

    def create_sink_user(self, name: str, password: str, grants: list[Grant]) -> None:
        self.server.create_user(name, password, [f"{', '.join(privileges)} ON {on}"
                                                 for privileges, on in grants])

    def kill_server(self) -> None:
        self.server.kill()

    def start_server(self) -> None:
        self.server.start()
