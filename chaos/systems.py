"""The sinks' systems as a chaos scenario drives them: started here, behind a fault proxy.

A :class:`System` starts the sink's real server (MariaDB, PostgreSQL, moto S3, a Kafka
broker, the HTTP receiver; SQLite has none) and a :class:`~chaos.proxy.FaultProxy` in front of
it, builds fresh targets whose sink reaches the server through the proxy, reads what a reader
of a target sees (straight from the server), and kills and restarts the server. Adding a sink
to the chaos suite is one subclass here and one line in :data:`SYSTEMS`.
"""

from __future__ import annotations

import contextlib
import itertools
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

from chaos.proxy import HOST, FaultProxy
from tests.conftest import MYSQL_ORDERS_DDL, ORDERS_DDL
from tests.servers import http_receiver, kafka, mariadb, moto, postgres
from tests.servers.local import free_port
from tests.test_crash import s3_visible, sqlite_visible
from twophase.testing.crash import SinkTarget

#: The fault kinds a scenario injects (see chaos.scenario); which apply depends on the system.
DRIVER_KILL = "driver kill"
ZOMBIE = "zombie driver"
SERVER_KILL = "server kill"
NETWORK_CUT = "network cut"
NETWORK_RESET = "network reset"
NETWORK_SLOW = "network slowed"
NETWORK_FAULTS = (NETWORK_CUT, NETWORK_RESET, NETWORK_SLOW)


class System:
    """A sink's external system; subclasses start it in :meth:`running`."""

    name: ClassVar[str]
    #: Besides driver kills and zombies, which everyone gets.
    server_faults: ClassVar[tuple[str, ...]] = ()
    proxy: FaultProxy | None = None

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self._numbers = itertools.count()

    @contextlib.contextmanager
    def running(self) -> Iterator[System]:
        yield self

    def new_target(self) -> SinkTarget:
        raise NotImplementedError

    def visible(self, target: SinkTarget) -> list[int]:
        """The sorted event_id of every row a reader of ``target`` sees."""
        raise NotImplementedError

    def kill_server(self) -> None:
        raise NotImplementedError(f"{self.name} has no server to kill")

    def start_server(self) -> None:
        """Start the server again after :meth:`kill_server` (a no-op if it runs)."""

    def _proxied(self, upstream_port: int) -> FaultProxy:
        self.proxy = FaultProxy((HOST, upstream_port))
        return self.proxy

    def _number(self) -> int:
        return next(self._numbers)


class SQLiteSystem(System):
    """An embedded database file: no server, no network."""

    name = "sqlite"

    def new_target(self) -> SinkTarget:
        database = self.scratch / f"orders-{self._number()}.db"
        with sqlite3.connect(database) as connection:
            connection.execute(ORDERS_DDL)
        return SinkTarget("sinks.sqlite:SQLiteSink", {"path": str(database), "table": "orders"})

    def visible(self, target: SinkTarget) -> list[int]:
        return sqlite_visible(target)


class MySQLSystem(System):
    name = "mysql"
    server_faults = (SERVER_KILL, *NETWORK_FAULTS)

    @contextlib.contextmanager
    def running(self) -> Iterator[System]:
        with mariadb.private_server() as self.server, \
                self._proxied(self.server.params.port):
            self.db = mariadb.Db(self.server)
            yield self

    def new_target(self) -> SinkTarget:
        assert self.proxy is not None
        table = self.db.new_table(MYSQL_ORDERS_DDL, prefix="orders_")
        return SinkTarget("sinks.mysql:MySQLXASink", {
            **self.server.params.kwargs(), "port": self.proxy.port, "table": table,
            "fencing": True})

    def visible(self, target: SinkTarget) -> list[int]:
        table = target.options["table"]
        return [row[0] for row in self.db.query(f"SELECT event_id FROM `{table}` ORDER BY 1")]

    def kill_server(self) -> None:
        self.server.kill()

    def start_server(self) -> None:
        if not self.server.running:
            self.server.start()


class PostgresSystem(System):
    name = "postgres"
    server_faults = (SERVER_KILL, *NETWORK_FAULTS)

    @contextlib.contextmanager
    def running(self) -> Iterator[System]:
        with postgres.private_server() as self.server, self._proxied(self.server.port):
            self.view = postgres.PgView(self.server)
            yield self

    def new_target(self) -> SinkTarget:
        assert self.proxy is not None
        target = postgres.PgTarget.fresh(self.view, port=self.proxy.port)
        return SinkTarget(target.FACTORY, target.options())

    def visible(self, target: SinkTarget) -> list[int]:
        return self.view.event_ids(target.options["table"])

    def kill_server(self) -> None:
        self.server.kill()

    def start_server(self) -> None:
        self.server.start()


class S3System(System):
    """moto keeps its objects in memory: its "kill" would lose them, which no S3 does, so
    the object store fails here by the network only (cut, reset, slowed)."""

    name = "s3"
    server_faults = NETWORK_FAULTS

    @contextlib.contextmanager
    def running(self) -> Iterator[System]:
        with moto.private_server(self.scratch / "moto") as self.server, \
                self._proxied(self.server.port):
            self.bucket = self.server.new_bucket("chaos")
            yield self

    def new_target(self) -> SinkTarget:
        assert self.proxy is not None
        return SinkTarget("sinks.s3:S3Sink", {
            **self.server.options(), "endpoint_url": f"http://{self.proxy.address}",
            "bucket": self.bucket, "prefix": f"orders-{self._number()}", "format": "parquet"})

    def visible(self, target: SinkTarget) -> list[int]:
        return s3_visible(self.server, target)


class KafkaSystem(System):
    """The broker advertises the proxy, so every client connection (the transaction
    coordinator's markers too) crosses it."""

    name = "kafka"
    server_faults = (SERVER_KILL, *NETWORK_FAULTS)

    @contextlib.contextmanager
    def running(self) -> Iterator[System]:
        port = free_port(HOST)
        with self._proxied(port) as proxy, kafka.private_broker(
                self.scratch / "kafka", {"advertised.listeners": f"PLAINTEXT://{proxy.address}"},
                port=port) as self.broker:
            yield self

    def new_target(self) -> SinkTarget:
        topic = self.broker.new_topic("chaos")
        return SinkTarget("sinks.kafka:KafkaSink", {
            **self.broker.options(), "topic": topic, "key": "order_id",
            "transactional_id_prefix": f"{topic}-", "transaction_timeout_ms": 300_000})

    def visible(self, target: SinkTarget) -> list[int]:
        return sorted(self.broker.event_ids(target.options["topic"]))

    def kill_server(self) -> None:
        self.broker.kill()

    def start_server(self) -> None:
        if self.broker.process is None or self.broker.process.poll() is not None:
            self.broker.start()


class HttpSystem(System):
    name = "http"
    server_faults = (SERVER_KILL, *NETWORK_FAULTS)

    @contextlib.contextmanager
    def running(self) -> Iterator[System]:
        with http_receiver.started(self.scratch / "receiver") as self.receiver, \
                self._proxied(self.receiver.port):
            yield self

    def new_target(self) -> SinkTarget:
        assert self.proxy is not None
        path = http_receiver.new_path()
        return SinkTarget("sinks.http:HttpSink", {
            **self.receiver.sink_options(path), "url": f"http://{self.proxy.address}{path}",
            "staging": str(self.scratch / f"staging-{self._number()}"), "encoding": "jsonl",
            "compression": "gzip", "max_records_per_request": 50})

    def visible(self, target: SinkTarget) -> list[int]:
        return sorted(self.receiver.event_ids(urlsplit(target.options["url"]).path))

    def kill_server(self) -> None:
        self.receiver.kill()

    def start_server(self) -> None:
        process = self.receiver.process
        if process is None or process.poll() is not None:
            self.receiver.start()


SYSTEMS: dict[str, Callable[[Path], System]] = {
    system.name: system
    for system in (SQLiteSystem, MySQLSystem, PostgresSystem, S3System, KafkaSystem,
                   HttpSystem)}


def in_doubt(target: SinkTarget, namespace: str) -> list[Any]:
    """The sink's own list of transactions of ``namespace`` still in doubt."""
    return list(target.build().list_in_doubt(namespace))
