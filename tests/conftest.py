"""Shared fixtures and the suite's markers. Servers are real processes started by the plugins
of ``tests/fixtures/`` and stopped at the end of the run; each sink's setup (:mod:`setups`) is
built over them per test: for every registered sink (:data:`setups.SETUPS`) the fixture
``<name>_setup`` (:func:`tests.sink_sets.fixture_of`), then variants over the secured servers.

Every test is marked ``server``, ``spark`` and with its sinks' names from what it takes
(:mod:`tests.markers`), so ``scripts/test -m "not server and not spark"`` starts nothing and
``scripts/test -m kafka`` runs one sink's tests; :mod:`tests.durations` sums the run's
durations by room against the budgets."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from setups import (
    SETUPS,
    DeltaSetup,
    HttpSetup,
    IcebergSetup,
    MySQLSetup,
    PostgresSetup,
    S3Setup,
    SinkSetup,
)
from setups.kafka import SecuredKafkaSetup
from setups.least_privilege import LeastPrivileged
from setups.nats import SecuredNatsSetup
from setups.redis import SecuredRedisSetup
from setups.servers.http_receiver import ReceiverProcess
from setups.servers.iceberg_rest import IcebergRestServer
from setups.servers.kafka import KafkaBroker
from setups.servers.mariadb import Db, MariaDBServer
from setups.servers.moto import MotoServer
from setups.servers.nats import NatsServer
from setups.servers.postgres import PgView, PostgresServer
from setups.servers.redis import RedisServer
from setups.sqlite import orders_database
from sinks.sqlite import SQLiteSink
from tests import markers
from tests.sink_sets import fixture_of
from twophase.testing.contract import QUERY_ID, use_query_id

pytest_plugins = ["tests.fixtures.tls", "tests.fixtures.mariadb", "tests.fixtures.moto",
                  "tests.fixtures.spark", "tests.fixtures.spark_cluster", "tests.fixtures.connect",
                  "tests.fixtures.http_receiver", "tests.fixtures.kafka", "tests.fixtures.postgres",
                  "tests.fixtures.prometheus", "tests.fixtures.iceberg_rest",
                  "tests.fixtures.redis", "tests.fixtures.nats", "tests.durations"]


def pytest_configure(config: pytest.Config) -> None:
    """A ``-m`` that says nothing of ``long`` keeps CI's selection (``addopts``' ``-m 'not
    long'``, which any ``-m`` replaces): ``-m kafka`` runs Kafka's CI tests, ``-m "kafka and
    long"`` its long ones, ``-m ''`` everything."""
    config.option.markexpr = markers.without_long(config.option.markexpr)


@pytest.hookimpl(tryfirst=True)  # before -m selects by them
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    markers.mark(items)


@pytest.hookimpl(tryfirst=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
                         ) -> None:
    markers.check_marked(fixturedef.argname, request)


def setup_fixture(setup: type[SinkSetup]) -> Callable[..., Any]:
    """The fixture of a registered sink's setup: built over the values of the fixtures its
    ``servers`` name, its files in the test's temporary directory."""

    @pytest.fixture(name=fixture_of(setup.name))
    def built(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SinkSetup]:
        servers = {name: request.getfixturevalue(name) for name in setup.servers}
        with setup.over(tmp_path, servers) as sink_setup:
            yield sink_setup

    return built


globals().update({fixture_of(name): setup_fixture(setup) for name, setup in SETUPS.items()})


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
def s3_secured_setup(moto_secured: MotoServer, tmp_path: Path) -> S3Setup:
    """S3 over HTTPS (the run's CA, verified), each sink as a least-privilege IAM user."""
    return S3Setup.secured(tmp_path, moto_secured, moto_secured.new_bucket())


@pytest.fixture
def delta_s3_setup(moto_server: MotoServer, s3_bucket: str, tmp_path: Path) -> DeltaSetup:
    """Delta tables under fresh prefixes of the S3 lab's bucket (conditional puts)."""
    return DeltaSetup.on_s3(tmp_path / "delta", moto_server, s3_bucket)


@pytest.fixture
def iceberg_pg_setup(postgres: PostgresServer, tmp_path: Path) -> IcebergSetup:
    """Iceberg tables whose SQL catalog is the private PostgreSQL server's database."""
    return IcebergSetup.on_postgres(tmp_path / "iceberg", postgres)


@pytest.fixture
def iceberg_s3_setup(moto_server: MotoServer, s3_bucket: str, tmp_path: Path) -> IcebergSetup:
    """Iceberg tables of the embedded catalog with their files on the S3 lab's bucket."""
    return IcebergSetup.on_s3(tmp_path / "iceberg", moto_server, s3_bucket)


@pytest.fixture
def iceberg_rest_setup(iceberg_rest: IcebergRestServer, tmp_path: Path) -> IcebergSetup:
    """Iceberg tables of Iceberg's own REST catalog server (its JDBC catalog behind HTTP)."""
    return IcebergSetup.on_rest(tmp_path / "iceberg", iceberg_rest)


@pytest.fixture
def kafka_secured_setup(kafka_secured_broker: KafkaBroker,
                        tmp_path: Path) -> Iterator[SecuredKafkaSetup]:
    with kafka_secured_broker.reader() as reader:
        yield SecuredKafkaSetup(tmp_path, kafka_secured_broker, reader)


@pytest.fixture
def redis_secured_setup(secured_redis: RedisServer, tmp_path: Path) -> SecuredRedisSetup:
    """Redis over verified TLS only, each stream written by an ACL user holding exactly the
    sink's rules, its password read from a file."""
    return SecuredRedisSetup(tmp_path, secured_redis)


@pytest.fixture
def nats_secured_setup(secured_nats: NatsServer, tmp_path: Path) -> SecuredNatsSetup:
    """NATS over verified TLS only, each target written by a user holding exactly the sink's
    permissions, its password read from a file."""
    return SecuredNatsSetup(tmp_path, secured_nats)


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


#: A stream's ways into the sink: Spark's Python data source, or ``foreachBatch`` writing each
#: partition as Arrow (``mapInArrow``) or, on a driver without pyarrow, as Spark's Rows.
WRITE_PATHS = ("data-source", "foreach-batch", "foreach-batch-rows")


@pytest.fixture(params=WRITE_PATHS)
def foreach_batch(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """``write_stream``'s ``foreach_batch`` for each of :data:`WRITE_PATHS` (the Rows path:
    the driver told it has no pyarrow)."""
    if request.param == "foreach-batch-rows":
        monkeypatch.setattr("twophase._spark.has_pyarrow", lambda: False)
    return bool(request.param != "data-source")


@pytest.fixture(autouse=True)
def _default_query_id() -> Iterator[None]:
    """Every test starts under the builders' default query id (twophase.testing.contract): a
    test that set its own and failed before putting it back must not decide whose orphans the
    next test's sweep may abort."""
    use_query_id(QUERY_ID)
    yield
