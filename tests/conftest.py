"""Shared fixtures. Servers are real processes started here and stopped at the end of the run;
each sink's setup (:mod:`setups`) is built over them per test."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from setups import (
    HttpSetup,
    KafkaSetup,
    MySQLSetup,
    PostgresSetup,
    S3Setup,
    SQLiteSetup,
)
from setups.kafka import SecuredKafkaSetup
from setups.least_privilege import LeastPrivileged
from setups.servers.http_receiver import ReceiverProcess
from setups.servers.kafka import KafkaBroker
from setups.servers.mariadb import Db, MariaDBServer
from setups.servers.moto import MotoServer
from setups.servers.postgres import PgView, PostgresServer
from setups.sqlite import orders_database
from sinks.sqlite import SQLiteSink

pytest_plugins = ["setups.servers.mariadb", "setups.servers.moto", "setups.servers.spark",
                  "setups.servers.spark_cluster", "setups.servers.connect",
                  "setups.servers.http_receiver", "setups.servers.kafka",
                  "setups.servers.postgres", "setups.servers.prometheus", "setups.servers.tls"]


@pytest.fixture
def sqlite_setup(tmp_path: Path) -> SQLiteSetup:
    return SQLiteSetup(tmp_path / "sqlite")


@pytest.fixture
def mysql_setup(mariadb: MariaDBServer, db: Db, tmp_path: Path) -> MySQLSetup:
    return MySQLSetup(tmp_path, mariadb)


@pytest.fixture
def postgres_setup(pg: PgView, tmp_path: Path) -> PostgresSetup:
    return PostgresSetup(tmp_path, pg.server)


@pytest.fixture
def secured_mysql_setup(secured_mariadb: MariaDBServer, tmp_path: Path
                        ) -> Iterator[MySQLSetup]:
    """The MySQL setup over the secured server: the sink verifies TLS (fails the test if it
    leaves a prepared branch behind)."""
    view = Db(secured_mariadb)
    view.rollback_all_prepared()
    yield MySQLSetup(tmp_path, secured_mariadb)
    secured_mariadb.start()
    assert view.rollback_all_prepared() == [], "prepared XA branches left behind"


@pytest.fixture
def secured_postgres_setup(secured_postgres: PostgresServer, tmp_path: Path
                           ) -> Iterator[PostgresSetup]:
    """The PostgreSQL setup over the secured server (``hostssl`` only): the sink verifies TLS."""
    view = PgView(secured_postgres)
    view.rollback_all_prepared()
    yield PostgresSetup(tmp_path, secured_postgres)
    secured_postgres.start()
    assert view.rollback_all_prepared() == [], "prepared transactions left behind"


@pytest.fixture
def least_privileged_mysql_setup(secured_mysql_setup: MySQLSetup) -> LeastPrivileged:
    """Targets on the secured server written by a user holding exactly the sink's grants."""
    return LeastPrivileged(secured_mysql_setup)


@pytest.fixture
def least_privileged_postgres_setup(secured_postgres_setup: PostgresSetup) -> LeastPrivileged:
    """Targets on the secured server written by a role holding exactly the sink's grants."""
    return LeastPrivileged(secured_postgres_setup)


@pytest.fixture
def s3_setup(moto_server: MotoServer, s3_bucket: str, tmp_path: Path) -> S3Setup:
    return S3Setup(tmp_path, moto_server, s3_bucket)


@pytest.fixture
def s3_secured_setup(moto_secured: MotoServer, tmp_path: Path) -> S3Setup:
    """S3 over HTTPS (the run's CA, verified), each sink as a least-privilege IAM user."""
    return S3Setup.secured(tmp_path, moto_secured, moto_secured.new_bucket())


@pytest.fixture
def kafka_setup(kafka_broker: KafkaBroker, tmp_path: Path) -> Iterator[KafkaSetup]:
    with kafka_broker.reader() as reader:
        yield KafkaSetup(tmp_path, kafka_broker, reader)


@pytest.fixture
def kafka_secured_setup(kafka_secured_broker: KafkaBroker,
                        tmp_path: Path) -> Iterator[SecuredKafkaSetup]:
    with kafka_secured_broker.reader() as reader:
        yield SecuredKafkaSetup(tmp_path, kafka_secured_broker, reader)


@pytest.fixture
def http_setup(http_receiver: ReceiverProcess, tmp_path: Path) -> HttpSetup:
    return HttpSetup(tmp_path, http_receiver)


@pytest.fixture
def http_secured_setup(http_secured: ReceiverProcess, tmp_path: Path) -> HttpSetup:
    """HTTP over HTTPS (the run's CA, verified), with the token and the signing secret."""
    return HttpSetup(tmp_path, http_secured)


@pytest.fixture
def orders_db(tmp_path: Path) -> Path:
    """A SQLite database with an empty ``orders`` table (the demo's order-status feed)."""
    return orders_database(tmp_path / "orders.db")


@pytest.fixture
def sqlite_sink(orders_db: Path) -> SQLiteSink:
    return SQLiteSink(orders_db, "orders")


@pytest.fixture
def sqlite_reader(orders_db: Path) -> Iterator[sqlite3.Connection]:
    connection = sqlite3.connect(orders_db)
    yield connection
    connection.close()
