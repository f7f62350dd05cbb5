"""Order events from Kafka, exactly once into MySQL, into another Kafka topic, or both.

The job of the README's "A job": Spark's Kafka source reads order events (JSON records with
``event_id``, ``order_id``, ``status``, ``ts``) from ``--source-topic`` and writes them exactly
once, whatever crashes,

* into MySQL / MariaDB by XA transactions: the latest status of each order, upserted into a
  table (``orders_live`` by default) keyed by ``order_id``. The source topic is keyed by
  ``order_id`` too, so each order's events are in one partition, in order, and one task of a
  batch writes them in that order: the last upsert is the latest event::

      CREATE TABLE orders_live (order_id BIGINT PRIMARY KEY, status VARCHAR(16) NOT NULL,
                                ts DATETIME(6) NOT NULL, event_id BIGINT NOT NULL)

* or, with ``--target-topic``, into a Kafka topic by Kafka transactions, every event keyed by
  ``order_id`` (read it with ``isolation.level=read_committed``);

* or, with ``--changes-topic``, into the table AND a Kafka topic of its changes, as one sink
  group (the README's "Several systems, one decision"): member ``orders`` (the table, as
  above) and member ``changes`` (one record per event upserted, keyed by ``order_id``, its
  value the JSON of ``CHANGE_COLUMNS``: ``{"order_id":7,"status":"shipped","ts":"..."}``).
  Every batch is decided once for both and committed table first, then topic: a consumer of
  the topic (``read_committed``) always finds the order in the table, at that status or a
  later one. The transactional outbox without an outbox table or CDC. A value needing more
  than the event's columns (say, the table's name) would be a column added to the DataFrame
  (``withColumn``) and named in ``columns``. The topic's transactions must live until their
  commit: a batch that may outlast ``transaction_timeout_ms`` is not decided (the query
  stops, and writes it again when started again), and one lost after its decision (a driver
  down for longer) is reported as split.

Spark's Kafka source must be on the classpath (``spark-submit --packages
org.apache.spark:spark-sql-kafka-0-10_2.13:<spark version>``, or ``--jars`` here: what
``scripts/kafka-broker-jars spark`` fetches). The MySQL password is read from the environment
(``MYSQL_PASSWORD``), never from the command line::

    MYSQL_PASSWORD=... python examples/orders_pipeline.py --bootstrap kafka:9092 \\
        --source-topic orders --checkpoint /data/checkpoints/orders_live \\
        --mysql-host db --mysql-user etl --mysql-database shop

With ``--kafka-user`` it reads and writes Kafka over SASL_SSL (SCRAM-SHA-512), the broker's
certificate and host name verified (against ``--kafka-ca-file``, else the system's CAs), the
password from ``KAFKA_PASSWORD``. The user needs READ on the source topic (Spark's source
assigns partitions itself: no consumer group) and, for a Kafka target, the sink's ACLs
(``python -m sinks.kafka.access``, see :mod:`sinks.kafka.access`)::

    KAFKA_PASSWORD=... python examples/orders_pipeline.py --bootstrap kafka:9093 \\
        --kafka-user etl --kafka-ca-file /etc/kafka/ca.pem --source-topic orders \\
        --target-topic orders_copy --checkpoint /data/checkpoints/orders_copy

Stop it and start it again with the same ``--checkpoint``: it goes on where it stopped. Keep
a checkpoint's targets: the group's member names and their transactions' namespaces
(``orders_live-orders``, ``orders_live-changes``) are how recovery finds what a crash left, so
adding or dropping ``--changes-topic`` takes a new ``--checkpoint``.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.functions import col, from_json

from sinks.kafka import KafkaSink
from sinks.mysql import MySQLXASink
from twophase import SinkGroup
from twophase.sink import TwoPhaseCommitSink
from twophase.spark import write_stream

EVENT_SCHEMA = "event_id BIGINT, order_id BIGINT, status STRING, ts TIMESTAMP"
PASSWORD_ENV = "MYSQL_PASSWORD"  # noqa: S105 - the variable's name, not a password
KAFKA_PASSWORD_ENV = "KAFKA_PASSWORD"  # noqa: S105 - the variable's name, not a password
KAFKA_PROTOCOL = "SASL_SSL"
KAFKA_MECHANISM = "SCRAM-SHA-512"
SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule"
TRIGGER_INTERVAL = "10 seconds"
#: The group's members, in the order they commit: the table before the topic of its changes.
COMMIT_ORDER = ["orders", "changes"]
#: The columns of a change record's value (its key is ``order_id``).
CHANGE_COLUMNS = ["order_id", "status", "ts"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    parser.add_argument("--source-topic", required=True, help="the topic of order events")
    parser.add_argument("--checkpoint", required=True, help="Spark's checkpoint directory")
    parser.add_argument("--kafka-user",
                        help=f"read and write Kafka over {KAFKA_PROTOCOL} as this "
                             f"{KAFKA_MECHANISM} user (password: ${KAFKA_PASSWORD_ENV})")
    parser.add_argument("--kafka-ca-file",
                        help="the CA of the brokers' certificates (PEM); default: the system's")
    targets = parser.add_mutually_exclusive_group()
    targets.add_argument("--target-topic", help="write to this Kafka topic instead of MySQL")
    targets.add_argument("--changes-topic",
                         help="write to MySQL and, as one group committed after the table, a "
                              "record of each change to this Kafka topic")
    parser.add_argument("--mysql-host", default="localhost")
    parser.add_argument("--mysql-port", type=int, default=3306)
    parser.add_argument("--mysql-user", default="etl")
    parser.add_argument("--mysql-database", default="shop")
    parser.add_argument("--mysql-tls", choices=("verify", "require", "off"), default="verify",
                        help="verify (the default): the server's certificate and host name")
    parser.add_argument("--mysql-ca-bundle", default=None,
                        help="the CA of the server's certificate (PEM); default: the system's")
    parser.add_argument("--mysql-table", default="orders_live")
    parser.add_argument("--jars", help="comma-separated jars for spark.jars (the Kafka source)")
    parser.add_argument("--available-now", action="store_true",
                        help="stop once the source topic is drained (else run on, every "
                             f"{TRIGGER_INTERVAL})")
    return parser.parse_args(argv)


def kafka_security(args: argparse.Namespace) -> dict[str, Any]:
    """The KafkaSink's security options (TLS verified, SASL); none without ``--kafka-user``."""
    if not args.kafka_user:
        return {}
    return {"tls": "verify", "ca_bundle": args.kafka_ca_file, "sasl_mechanism": KAFKA_MECHANISM,
            "sasl_plain_username": args.kafka_user,
            "sasl_plain_password": os.environ.get(KAFKA_PASSWORD_ENV, "")}


def source_security(args: argparse.Namespace) -> dict[str, str]:
    """The same for Spark's Kafka source (the Java client's names, prefixed ``kafka.``)."""
    security = kafka_security(args)
    if not security:
        return {}
    login = (f"{SCRAM_LOGIN} required username={jaas_quoted(security['sasl_plain_username'])}"
             f" password={jaas_quoted(security['sasl_plain_password'])};")
    options = {"kafka.security.protocol": KAFKA_PROTOCOL, "kafka.sasl.mechanism": KAFKA_MECHANISM,
               "kafka.sasl.jaas.config": login}
    if args.kafka_ca_file:
        options |= {"kafka.ssl.truststore.type": "PEM",
                    "kafka.ssl.truststore.location": args.kafka_ca_file}
    return options


def jaas_quoted(text: str) -> str:
    """``text`` as a JAAS option's value: quoted, its backslashes and quotes escaped."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def read_orders(spark: SparkSession, args: argparse.Namespace) -> DataFrame:
    """The order events as a stream, in each partition's order (no shuffle: see above)."""
    records = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", args.bootstrap)
               .options(**source_security(args)).option("subscribe", args.source_topic)
               .option("startingOffsets", "earliest").load())
    return records.select(from_json(col("value").cast("string"), EVENT_SCHEMA).alias("event")) \
        .select("event.*")


def build_sink(args: argparse.Namespace) -> TwoPhaseCommitSink[Any]:
    if args.target_topic:
        return KafkaSink(args.bootstrap, args.target_topic, key="order_id",
                         **kafka_security(args))
    return MySQLXASink(host=args.mysql_host, port=args.mysql_port, user=args.mysql_user,
                       password=os.environ.get(PASSWORD_ENV, ""),
                       database=args.mysql_database, tls=args.mysql_tls,
                       ca_bundle=args.mysql_ca_bundle, table=args.mysql_table, mode="upsert")


def build_changes_sink(args: argparse.Namespace) -> KafkaSink:
    """The topic of the table's changes: key ``order_id``, value the JSON of its columns (the
    group hands it only ``CHANGE_COLUMNS``)."""
    return KafkaSink(args.bootstrap, args.changes_topic, key="order_id", **kafka_security(args))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    builder = SparkSession.builder.appName("orders-pipeline")
    if args.jars:
        builder = builder.config("spark.jars", args.jars)
    spark = builder.getOrCreate()
    orders = read_orders(spark, args)
    trigger = {"availableNow": True} if args.available_now else {"processingTime": TRIGGER_INTERVAL}
    if args.changes_topic:
        group = SinkGroup({"orders": build_sink(args), "changes": build_changes_sink(args)},
                          commit_order=COMMIT_ORDER, columns={"changes": CHANGE_COLUMNS})
        query = write_stream(orders, group, checkpoint_location=args.checkpoint,
                             trigger=trigger)
    else:
        query = write_stream(orders, build_sink(args), checkpoint_location=args.checkpoint,
                             trigger=trigger)
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
