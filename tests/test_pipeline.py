"""The pipeline end to end: Kafka -> Spark -> MySQL (XA) and Kafka -> Spark -> Kafka, crashed.

The shared crash suite with a Kafka source: the generated feed is produced into a source topic
of a real broker, and the driver reads it through Spark's Kafka source (one file's rows per
micro-batch), SIGKILLed at crash points in turn and restarted: either side of the decision
into Kafka (CI time: the Kafka sink goes through every point in CI in the MySQL + Kafka group,
tests/test_group_crash.py), every point into MariaDB (``-m long``). At the end every source
record is in the target exactly once, nothing is in doubt, and the target's own view has
nothing left open: no prepared XA branch in MariaDB, no open transaction of the query's
transactional ids on the broker. Below it, ``examples/orders_pipeline.py`` run as is, into
each target.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from setups.servers.kafka import KafkaBroker, spark_kafka_jars
from setups.servers.mariadb import Db, MariaDBServer
from sinks.kafka import KafkaSink
from twophase.testing.crash import DECISION_POINTS, CrashSuite, FeedSource
from twophase.testing.driver import generate_feed

pytestmark = [pytest.mark.spark, pytest.mark.crash]

#: One partition: ``maxOffsetsPerTrigger`` then cuts the feed exactly at its files' ends.
SOURCE_PARTITIONS = 1
REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "orders_pipeline.py"
EXAMPLE_TIMEOUT_S = 600.0
#: Orders of the example's feed that get a later event (which the upsert must keep).
UPDATED_ORDERS = 20
LIVE_DDL = ("CREATE TABLE `{table}` (order_id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL, "
            "ts DATETIME(6) NOT NULL, event_id BIGINT NOT NULL) ENGINE=InnoDB")


class KafkaSource:
    """The feed produced into a fresh source topic, read by Spark's Kafka source."""

    rows_per_file: int

    @pytest.fixture
    def source(self, kafka_broker: KafkaBroker) -> FeedSource:
        topic = kafka_broker.new_topic("feed", partitions=SOURCE_PARTITIONS)
        return FeedSource(
            spec={"source_kafka": {"bootstrap_servers": kafka_broker.bootstrap_servers,
                                   "topic": topic,
                                   "max_offsets_per_trigger": self.rows_per_file}},
            fill=lambda feed: _move_to_topic(kafka_broker, topic, feed),
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


class TestKafkaToKafka(KafkaSource, CrashSuite):
    """Kafka in and out: no open transaction holds rows of the target topic at the end."""

    setup_fixture = "kafka_setup"
    crash_points = DECISION_POINTS


@pytest.fixture
def orders_topic(kafka_broker: KafkaBroker, tmp_path: Path) -> tuple[str, list[dict[str, Any]]]:
    """A source topic holding a generated feed keyed by order (as the example expects), then a
    later event of some of its orders; and those events in order."""
    feed = tmp_path / "feed"
    count = generate_feed(feed, files=3, rows_per_file=100)
    first = [json.loads(line) for line in (feed / "orders-00000.json").read_text().splitlines()]
    later = [{**event, "event_id": count + number, "status": "delivered",
              "ts": f"2026-12-01T00:00:{number:02d}+00:00"}
             for number, event in enumerate(first[:UPDATED_ORDERS])]
    (feed / "updates.json").write_text("".join(json.dumps(event) + "\n" for event in later))
    topic = kafka_broker.new_topic("orders")
    assert kafka_broker.produce_feed(topic, feed, key="order_id") == count + UPDATED_ORDERS
    lines = [line for path in sorted(feed.glob("*.json"))
             for line in path.read_text().splitlines()]
    return topic, [json.loads(line) for line in lines]


def run_example(kafka_broker: KafkaBroker, topic: str, tmp_path: Path, *args: str,
                env: dict[str, str] | None = None) -> None:
    """The example to the end of the source topic (``--available-now``), as a user runs it."""
    command = [sys.executable, str(EXAMPLE), "--bootstrap", kafka_broker.bootstrap_servers,
               "--source-topic", topic, "--checkpoint", str(tmp_path / "ckpt"),
               "--jars", ",".join(spark_kafka_jars()), "--available-now", *args]
    environment = {**os.environ, **(env or {}), "PYSPARK_PYTHON": sys.executable,
                   "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO),
                                                               os.environ.get("PYTHONPATH"))))}
    run = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True,
                         timeout=EXAMPLE_TIMEOUT_S, check=False)
    assert run.returncode == 0, f"the example failed:\n{run.stdout[-3000:]}{run.stderr[-3000:]}"


def test_the_example_upserts_each_orders_latest_status_into_mysql(
    kafka_broker: KafkaBroker, orders_topic: tuple[str, list[dict[str, Any]]],
    mariadb: MariaDBServer, db: Db, tmp_path: Path
) -> None:
    topic, events = orders_topic
    table = db.new_table(LIVE_DDL, prefix="orders_live_")
    params = mariadb.params
    run_example(kafka_broker, topic, tmp_path, "--mysql-host", params.host,
                "--mysql-port", str(params.port), "--mysql-user", params.user,
                "--mysql-database", params.database, "--mysql-table", table,
                "--mysql-tls", params.tls,
                env={"MYSQL_PASSWORD": params.password})
    latest = {event["order_id"]: (event["status"], event["event_id"]) for event in events}
    rows = db.query(f"SELECT order_id, status, event_id FROM `{table}`")
    assert {order: (status, event) for order, status, event in rows} == latest
    assert db.xa_recover() == []


def test_the_example_copies_every_event_into_a_kafka_topic_once(
    kafka_broker: KafkaBroker, orders_topic: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    topic, events = orders_topic
    target = kafka_broker.new_topic("orders-copy")
    run_example(kafka_broker, topic, tmp_path, "--target-topic", target)
    assert kafka_broker.event_ids(target) == [event["event_id"] for event in events]
    namespace = KafkaSink(kafka_broker.bootstrap_servers, target).default_namespace()
    assert kafka_broker.open_transactions(f"twophase-{namespace}.") == {}
