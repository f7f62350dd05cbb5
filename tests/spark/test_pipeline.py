"""The pipeline end to end: Kafka -> Spark -> MySQL (XA) and Kafka -> Spark -> Kafka, crashed.

The shared crash suite with a Kafka source: the generated feed is produced into a source topic
of the secured broker (SASL_SSL, SCRAM-SHA-512, ACLs enforced), and the driver reads it through
Spark's Kafka source (one file's rows per micro-batch) as the sink's least-privileged user, who
may only READ that topic (Spark's source assigns partitions itself: no consumer group, no other
ACL), its password by reference (Kafka's DirectoryConfigProvider reads it from a file);
SIGKILLed at crash points in turn and restarted (``-m long``, CI time: a Kafka source is crashed
in CI by tests/spark/test_debezium_pipeline.py): either side of the decision into Kafka over
SASL_SSL as that user, with the sink's ACLs, every point into MariaDB. At the end every source
record is in the target exactly once, nothing is in doubt, and the target's own view has
nothing left open: no prepared XA branch in MariaDB, no open transaction of the query's
transactional ids on the broker. Below it, in CI, ``examples/orders_pipeline.py`` run as is
(``--kafka-user``: SASL_SSL, the same ACLs), into each target.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kafka.admin import ACLOperation, ResourceType

from setups.servers.kafka import (
    APP_USER,
    TOPIC_PARTITIONS,
    BrokerSecurity,
    KafkaBroker,
    allow,
    spark_kafka_jars,
)
from setups.servers.mariadb import Db, MariaDBServer
from sinks.kafka import KafkaSink
from sinks.kafka.access import grants
from sinks.kafka.registry import DEFAULT_REGISTRY_TOPIC
from tests import REPO
from twophase.testing.crash import DECISION_POINTS, CrashSuite, FeedSource
from twophase.testing.driver import generate_feed

pytestmark = [pytest.mark.spark, pytest.mark.crash]

#: One partition: ``maxOffsetsPerTrigger`` then cuts the feed exactly at its files' ends.
SOURCE_PARTITIONS = 1
EXAMPLE = REPO / "examples" / "orders_pipeline.py"
KAFKA_PASSWORD_ENV = "KAFKA_PASSWORD"  # the example reads the password from it
#: The example's sink's transactional ids: KafkaSink's default prefix, then its namespace.
EXAMPLE_ID_PREFIX = "twophase-"
EXAMPLE_TIMEOUT_S = 600.0
#: Orders of the example's feed that get a later event (which the upsert must keep).
UPDATED_ORDERS = 20
LIVE_DDL = ("CREATE TABLE `{table}` (order_id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL, "
            "ts DATETIME(6) NOT NULL, event_id BIGINT NOT NULL) ENGINE=InnoDB")


def readable_topic(broker: KafkaBroker, prefix: str, partitions: int) -> str:
    """A new topic of the secured broker that the sink's user may READ, and nothing more."""
    topic = broker.new_topic(prefix, partitions=partitions)
    broker.grant([allow(APP_USER, ACLOperation.READ, ResourceType.TOPIC, topic)])
    return topic


def security_of(broker: KafkaBroker) -> BrokerSecurity:
    assert broker.security is not None, "not the secured broker"
    return broker.security


class KafkaSource:
    """The feed produced into a fresh source topic of the secured broker, read by Spark's
    Kafka source as the sink's user."""

    rows_per_file: int

    @pytest.fixture
    def source(self, kafka_secured_broker: KafkaBroker, tmp_path: Path) -> FeedSource:
        broker, security = kafka_secured_broker, security_of(kafka_secured_broker)
        topic = readable_topic(broker, "feed", SOURCE_PARTITIONS)
        password = security.write_password(APP_USER, tmp_path / "source.password")
        return FeedSource(
            spec={"source_kafka": {"bootstrap_servers": broker.bootstrap_servers,
                                   "topic": topic,
                                   "max_offsets_per_trigger": self.rows_per_file,
                                   "options": security.spark_source_options(APP_USER,
                                                                            password)}},
            fill=lambda feed: _move_to_topic(broker, topic, feed),
            spark_conf={"spark.jars": ",".join(spark_kafka_jars())})


def _move_to_topic(broker: KafkaBroker, topic: str, feed: Path) -> None:
    """Produce the feed's files into ``topic``, then delete them: the driver reads only Kafka."""
    broker.produce_feed(topic, feed)
    for path in feed.glob("*.json"):
        path.unlink()


@pytest.mark.long
class TestKafkaToMySQL(KafkaSource, CrashSuite):
    """Kafka in, MariaDB out: no XA branch left prepared at the end."""

    setup_fixture = "mysql_setup"


@pytest.mark.long  # CI time: a Kafka source through a driver kill in CI by the Debezium pipeline
# (tests/spark/test_debezium_pipeline.py); this source as the least-privileged user over
# SASL_SSL in CI by the examples below
class TestKafkaToKafka(KafkaSource, CrashSuite):
    """Kafka in and out, both over SASL_SSL as the least-privileged user: no open transaction
    holds rows of the target topic at the end."""

    setup_fixture = "kafka_secured_setup"
    crash_points = DECISION_POINTS


@pytest.fixture
def orders_topic(kafka_secured_broker: KafkaBroker,
                 tmp_path: Path) -> tuple[str, list[dict[str, Any]]]:
    """A source topic of the secured broker holding a generated feed keyed by order (as the
    example expects), then a later event of some of its orders; and those events in order.
    The sink's user may READ it."""
    feed = tmp_path / "feed"
    count = generate_feed(feed, files=3, rows_per_file=100)
    first = [json.loads(line) for line in (feed / "orders-00000.json").read_text().splitlines()]
    later = [{**event, "event_id": count + number, "status": "delivered",
              "ts": f"2026-12-01T00:00:{number:02d}+00:00"}
             for number, event in enumerate(first[:UPDATED_ORDERS])]
    (feed / "updates.json").write_text("".join(json.dumps(event) + "\n" for event in later))
    topic = readable_topic(kafka_secured_broker, "orders", TOPIC_PARTITIONS)
    assert kafka_secured_broker.produce_feed(topic, feed,
                                             key="order_id") == count + UPDATED_ORDERS
    lines = [line for path in sorted(feed.glob("*.json"))
             for line in path.read_text().splitlines()]
    return topic, [json.loads(line) for line in lines]


def run_example(kafka_broker: KafkaBroker, topic: str, tmp_path: Path, *args: str,
                env: dict[str, str] | None = None) -> None:
    """The example to the end of the source topic (``--available-now``), as a user runs it:
    over SASL_SSL as the sink's user."""
    security = security_of(kafka_broker)
    command = [sys.executable, str(EXAMPLE), "--bootstrap", kafka_broker.bootstrap_servers,
               "--kafka-user", APP_USER, "--kafka-ca-file", str(security.cafile),
               "--source-topic", topic, "--checkpoint", str(tmp_path / "ckpt"),
               "--jars", ",".join(spark_kafka_jars()), "--available-now", *args]
    environment = {**os.environ, **(env or {}), KAFKA_PASSWORD_ENV: security.passwords[APP_USER],
                   "PYSPARK_PYTHON": sys.executable,
                   "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO),
                                                               os.environ.get("PYTHONPATH"))))}
    run = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True,
                         timeout=EXAMPLE_TIMEOUT_S, check=False)
    assert run.returncode == 0, f"the example failed:\n{run.stdout[-3000:]}{run.stderr[-3000:]}"


def test_the_example_upserts_each_orders_latest_status_into_mysql(
    kafka_secured_broker: KafkaBroker, orders_topic: tuple[str, list[dict[str, Any]]],
    mariadb: MariaDBServer, db: Db, tmp_path: Path
) -> None:
    topic, events = orders_topic
    table = db.new_table(LIVE_DDL, prefix="orders_live_")
    params = mariadb.params
    run_example(kafka_secured_broker, topic, tmp_path, "--mysql-host", params.host,
                "--mysql-port", str(params.port), "--mysql-user", params.user,
                "--mysql-database", params.database, "--mysql-table", table,
                "--mysql-tls", params.tls,
                env={"MYSQL_PASSWORD": params.password})
    latest = {event["order_id"]: (event["status"], event["event_id"]) for event in events}
    rows = db.query(f"SELECT order_id, status, event_id FROM `{table}`")
    assert {order: (status, event) for order, status, event in rows} == latest
    assert db.xa_recover() == []


def test_the_example_copies_every_event_into_a_kafka_topic_once(
    kafka_secured_broker: KafkaBroker, orders_topic: tuple[str, list[dict[str, Any]]],
    tmp_path: Path
) -> None:
    """Into a topic of the secured broker, as a user granted the sink's ACLs for it."""
    broker = kafka_secured_broker
    topic, events = orders_topic
    target = broker.new_topic("orders-copy")
    namespace = KafkaSink(broker.bootstrap_servers, target).default_namespace()
    ids = f"{EXAMPLE_ID_PREFIX}{namespace}."
    broker.grant(grant.acl(f"User:{APP_USER}") for grant in grants(
        [target], ids, DEFAULT_REGISTRY_TOPIC, create_registry=True))
    run_example(broker, topic, tmp_path, "--target-topic", target)
    assert broker.event_ids(target) == [event["event_id"] for event in events]
    assert broker.open_transactions(ids) == {}
