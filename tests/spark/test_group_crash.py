"""Sink groups of real systems under the shared crash suite: a Spark driver SIGKILLed at every
crash point in turn, between two members' commits too (``GROUP_CRASH_POINTS``), each member
judged by its own reader (the setups' ``visible``: the table, a read_committed consumer, the
S3 listing, the receiver's store, ``redis-cli``) and every member's server checked for what it
holds in doubt.

The groups: PostgreSQL, then an Iceberg table, then Kafka (a table, the lake read by DuckDB's
Iceberg reader, a change feed; in CI before the decision and, after it, between two members'
commits (a group killed after its decision with nothing committed yet: in CI the secret canary's
group of five, tests/spark/test_secret_canary.py), ``-m long`` every point); under ``-m long``
(CI time) MySQL XA then Kafka (the outbox:
the table commits before the topic, which takes some of the columns; in local mode and on the
standalone cluster; in CI the pair runs its chaos round, tests/spark/test_chaos.py), MySQL XA,
then a Delta table, then Kafka (either side of the decision and between members, and every
point), PostgreSQL then S3, SQLite then the HTTP receiver, two SQLite tables over Spark
Connect, and MySQL XA then an Iceberg table whose SQL catalog is PostgreSQL's; MySQL XA then a
Redis stream, and MySQL XA then a NATS JetStream subject (each in CI either side of the
decision, ``-m long`` every point).
Each member keeps the options its setup gives; its namespace is the group's plus its name, so
the members' are distinct. The group of SQLite and a directory of JSON-lines files:
tests/unit/test_group.py.
"""

from __future__ import annotations

import pytest

from setups import (
    DeltaSetup,
    HttpSetup,
    IcebergSetup,
    KafkaSetup,
    MySQLSetup,
    NatsSetup,
    PostgresSetup,
    RedisSetup,
    S3Setup,
    SQLiteSetup,
)
from tests.spark.test_cluster import OnCluster
from tests.spark.test_connect import ConnectCrashSuite
from twophase._crash import BEFORE_DECISION, BETWEEN_MEMBERS, GROUP_CRASH_POINTS
from twophase.testing import GroupTarget
from twophase.testing.crash import DECISION_POINTS, CrashSuite

pytestmark = [pytest.mark.spark, pytest.mark.crash]

#: The columns of the topic's records (keyed by order_id): the table keeps every column.
EVENT_COLUMNS = ["event_id", "order_id", "status"]


class OnTableAndTopic(CrashSuite):
    """The outbox: the table commits, then the topic; a read_committed consumer never finds
    an event whose row the table lacks, and at the end both hold every row once."""

    crash_points = GROUP_CRASH_POINTS

    @pytest.fixture
    def target(self, mysql_setup: MySQLSetup, kafka_setup: KafkaSetup) -> GroupTarget:
        return GroupTarget.of({"orders": mysql_setup.new_target(),
                               "events": kafka_setup.new_target()},
                              columns={"events": EVENT_COLUMNS})


@pytest.mark.long  # CI time: a group crashed in CI either side of the decision and between
# members by the PostgreSQL + Iceberg + Kafka group below; this pair in CI in its chaos round
# (tests/spark/test_chaos.py); every group point over SQLite in the model
class TestMySQLKafkaGroupCrashes(OnTableAndTopic):
    """In local mode: the driver and its executors in one session."""


@pytest.mark.long
class TestMySQLKafkaGroupOnCluster(OnCluster, OnTableAndTopic):
    """On the standalone cluster: executors open both members' transactions, the driver
    commits them member by member."""


@pytest.mark.long
class TestSQLiteGroupConnectCrashes(ConnectCrashSuite):
    """Over Spark Connect: the server is the driver that dies at each point."""

    crash_points = GROUP_CRASH_POINTS

    @pytest.fixture
    def target(self, sqlite_setup: SQLiteSetup) -> GroupTarget:
        return GroupTarget.of({"orders": sqlite_setup.new_target(),
                               "copy": sqlite_setup.new_target()})


@pytest.mark.long
class TestPostgresS3GroupCrashes(CrashSuite):
    """A table, then Parquet objects under a prefix: the listing never shows a row the table
    lacks; no open upload is left."""

    crash_points = GROUP_CRASH_POINTS

    @pytest.fixture
    def target(self, postgres_setup: PostgresSetup, s3_setup: S3Setup) -> GroupTarget:
        return GroupTarget.of({"orders": postgres_setup.new_target(),
                               "files": s3_setup.new_target()})


@pytest.mark.long
class TestSQLiteHttpGroupCrashes(CrashSuite):
    """A local table, then the reference receiver: the receiver never stores a record the
    table lacks, nor one twice."""

    crash_points = GROUP_CRASH_POINTS

    @pytest.fixture
    def target(self, sqlite_setup: SQLiteSetup, http_setup: HttpSetup) -> GroupTarget:
        return GroupTarget.of({"orders": sqlite_setup.new_target(),
                               "hooks": http_setup.new_target()})


class OnTableLakeAndFeed(CrashSuite):
    """MySQL XA, then a Delta table, then Kafka: the lake never shows a row the table lacks
    nor the topic (read_committed) an event the lake lacks; at the end each holds every row
    once, no Parquet file is left unreferenced in the lake and no XA branch prepared."""

    @pytest.fixture
    def target(self, mysql_setup: MySQLSetup, delta_setup: DeltaSetup,
               kafka_setup: KafkaSetup) -> GroupTarget:
        return GroupTarget.of({"orders": mysql_setup.new_target(),
                               "lake": delta_setup.new_target(),
                               "changes": kafka_setup.new_target()},
                              commit_order=["orders", "lake", "changes"],
                              columns={"changes": EVENT_COLUMNS})


@pytest.mark.long  # CI time: a lake between members crashed in CI by the PostgreSQL + Iceberg
# + Kafka group below; Delta crashed in CI by tests/sinks/delta/test_delta_crash.py, a member of
# a group in tests/sinks/delta/test_delta_sink.py
class TestMySQLDeltaKafkaGroupCrashes(OnTableLakeAndFeed):
    """Either side of the decision, and between two members' commits (the table's
    committed, the lake's and the topic's not)."""

    crash_points = (*DECISION_POINTS, BETWEEN_MEMBERS)


@pytest.mark.long
class TestMySQLDeltaKafkaGroupEveryPoint(OnTableLakeAndFeed):
    """Every point of a group's driver, between members included."""

    crash_points = GROUP_CRASH_POINTS


class OnTableIcebergAndFeed(CrashSuite):
    """PostgreSQL, then an Iceberg table (the embedded SQL catalog), then Kafka: the lake never
    shows a row the table lacks nor the topic (read_committed) an event the lake lacks; at the
    end each holds every row once, no Parquet file is left that no snapshot added, no intent
    left in the table and no transaction prepared in PostgreSQL."""

    @pytest.fixture
    def target(self, postgres_setup: PostgresSetup, iceberg_setup: IcebergSetup,
               kafka_setup: KafkaSetup) -> GroupTarget:
        return GroupTarget.of({"orders": postgres_setup.new_target(),
                               "lake": iceberg_setup.new_target(),
                               "changes": kafka_setup.new_target()},
                              commit_order=["orders", "lake", "changes"],
                              columns={"changes": EVENT_COLUMNS})


class TestPostgresIcebergKafkaGroupCrashes(OnTableIcebergAndFeed):
    """CI: either side of the decision: before it, and after it between two members' commits
    (the table's committed, the lake's and the topic's not). CI time: a group killed after its
    decision with nothing committed is recovered in CI by the secret canary
    (tests/spark/test_secret_canary.py, a group of five members) and the group model."""

    crash_points = (BEFORE_DECISION, BETWEEN_MEMBERS)


@pytest.mark.long
class TestPostgresIcebergKafkaGroupEveryPointCrashes(OnTableIcebergAndFeed):
    """Every point of a group's driver, between members included."""

    crash_points = GROUP_CRASH_POINTS


@pytest.mark.long
class TestMySQLIcebergGroupCrashes(CrashSuite):
    """MySQL XA, then an Iceberg table whose SQL catalog is the private PostgreSQL's database:
    the lake never shows a row the table lacks; at the end both hold every row once, no XA
    branch prepared, no file no snapshot added, no intent left. Every point."""

    crash_points = GROUP_CRASH_POINTS

    @pytest.fixture
    def target(self, mysql_setup: MySQLSetup, iceberg_pg_setup: IcebergSetup) -> GroupTarget:
        return GroupTarget.of({"orders": mysql_setup.new_target(),
                               "lake": iceberg_pg_setup.new_target()},
                              commit_order=["orders", "lake"])


class OnTableAndStream(CrashSuite):
    """MySQL XA, then a Redis stream of the rows' events (``commit_order``: the row before its
    event) on the secured server (verified TLS, an ACL user holding exactly the sink's rules,
    its password read from a file): the stream (read by ``redis-cli``) never holds an event
    whose row the table lacks; at the end both hold every row once, no XA branch prepared,
    nothing staged in Redis."""

    @pytest.fixture
    def target(self, mysql_setup: MySQLSetup, redis_secured_setup: RedisSetup
               ) -> GroupTarget:
        return GroupTarget.of({"orders": mysql_setup.new_target(),
                               "events": redis_secured_setup.new_target()},
                              commit_order=["orders", "events"],
                              columns={"events": EVENT_COLUMNS})


class TestMySQLRedisGroupCrashes(OnTableAndStream):
    """CI: either side of the decision: before it, and after it between the members' commits
    (the table's committed, the stream's not)."""

    crash_points = (BEFORE_DECISION, BETWEEN_MEMBERS)


@pytest.mark.long
class TestMySQLRedisGroupEveryPoint(OnTableAndStream):
    """Every point of a group's driver, between members included."""

    crash_points = GROUP_CRASH_POINTS


class OnTableAndSubject(CrashSuite):
    """MySQL XA, then a NATS JetStream subject of the rows' events (the row before its
    event) on the secured server (verified TLS, a user holding exactly the sink's
    permissions, its password read from a file): the subject (read by a consumer of the
    setup's own) never holds an event whose row the table lacks; at the end both hold every
    row once, nothing prepared, nothing staged."""

    @pytest.fixture
    def target(self, mysql_setup: MySQLSetup, nats_secured_setup: NatsSetup
               ) -> GroupTarget:
        return GroupTarget.of({"orders": mysql_setup.new_target(),
                               "events": nats_secured_setup.new_target()},
                              commit_order=["orders", "events"],
                              columns={"events": EVENT_COLUMNS})


class TestMySQLNatsGroupCrashes(OnTableAndSubject):
    """CI: either side of the decision: before it, and after it between the members' commits."""

    crash_points = (BEFORE_DECISION, BETWEEN_MEMBERS)


@pytest.mark.long
class TestMySQLNatsGroupEveryPoint(OnTableAndSubject):
    """Every point of a group's driver, between members included."""

    crash_points = GROUP_CRASH_POINTS
