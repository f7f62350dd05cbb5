"""A PostgreSQL table mirrored exactly once into MySQL, PostgreSQL and the lake, from Debezium's
changes.

Debezium's PostgreSQL connector (on a Kafka Connect worker) turns every insert, update and
delete of a source table into a change event on a Kafka topic, at least once: after a crash of
the worker it sends again what it sent since its last offset commit. This job reads that topic
with Spark's Kafka source, turns the events into changes
(:func:`twophase.debezium.debezium_changes`: a row per change, its version the event's log
sequence number, deletes marked) and keeps the latest state of each key in its targets,
exactly once, whatever crashes: into MySQL / MariaDB by XA transactions
(:class:`sinks.mysql.MySQLXASink`), into PostgreSQL by prepared transactions
(:class:`sinks.postgres.PostgresSink`), into a Delta table (:class:`sinks.delta.DeltaSink`)
and an Iceberg table (:class:`sinks.iceberg.IcebergSink`), each batch one MERGE or one
snapshot, and into a compacted Kafka topic (:class:`sinks.kafka.KafkaSink`: a record per key
and batch, a delete as a tombstone), all in the keyed mode (``mode="keyed"``: a change applies
only if its version is newer than the target's for its key, a delete keeps a tombstone).
Several targets form one sink group: each batch is decided once for all and committed in
:data:`COMMIT_ORDER` (the databases first, then the lake, then the topic). A change delivered
twice, late, or again after a restart of the worker or of this job is a no-op.

The connector settings this job expects (the Connect worker's JSON converters may differ: the
connector's own win)::

    "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
    "plugin.name": "pgoutput",
    "topic.prefix": "shop",                      # the topic: shop.public.orders
    "table.include.list": "public.orders",       # one table per topic
    "slot.name": "shop", "publication.autocreate.mode": "filtered",
    "key.converter": "org.apache.kafka.connect.json.JsonConverter",
    "key.converter.schemas.enable": "false",
    "value.converter": "org.apache.kafka.connect.json.JsonConverter",
    "value.converter.schemas.enable": "false",   # the envelope: before, after, source, op
    "decimal.handling.mode": "string",           # exact: read as DECIMAL (or "double")
    "time.precision.mode": "connect",
    "tombstones.on.delete": "true"                # (a delete's tombstone is skipped here)

``--columns`` are the source table's columns as Spark reads them from an event's ``after``
(default: ``id BIGINT, status STRING, amount DECIMAL(12,2)``), ``--key`` its primary key.
Each target table has those columns and a ``BIGINT`` column ``version`` (the version the
row's state was written at); the sinks keep their tombstones in tables of their own::

    CREATE TABLE orders_mirror (id BIGINT PRIMARY KEY, status VARCHAR(32) NOT NULL,
                                amount DECIMAL(12,2), version BIGINT NOT NULL)

Passwords come from the environment, never the command line: ``MYSQL_PASSWORD`` and
``PGPASSWORD``. Spark's Kafka source must be on the classpath (``--jars``: what
``scripts/kafka-broker-jars spark`` fetches, or ``spark-submit --packages``)::

    MYSQL_PASSWORD=... PGPASSWORD=... python examples/debezium_pipeline.py \\
        --bootstrap kafka:9092 --topic shop.public.orders \\
        --checkpoint /data/checkpoints/orders_mirror \\
        --mysql-host mysql --mysql-user etl --mysql-database shop --mysql-table orders_mirror \\
        --pg-host pg --pg-user etl --pg-database shop --pg-table orders_mirror

The lake targets are created from the changes' columns at the first start: ``--delta-table``
a Delta table's URI (a path, ``s3://...``), ``--iceberg-table`` ``namespace.table`` of the
catalog ``--iceberg-catalog`` (pyiceberg's properties as JSON, say ``{"type": "sql", "uri":
"postgresql+psycopg://...", "warehouse": "s3://lake/wh"}``; a password in it is better in
``PYICEBERG_CATALOG__<NAME>__URI``) named ``--iceberg-catalog-name``. ``--changelog-topic``
names a topic of the same brokers, created with ``cleanup.policy=compact``: the changelog of
each key's state (its key the table's one key column, its value the row as JSON, the version
in the header ``twophase.version``).

Stop it and start it again with the same ``--checkpoint``: it goes on where it stopped. Keep a
checkpoint's targets: adding or dropping one takes a new ``--checkpoint``.
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any, Final

from pyspark.sql import DataFrame, SparkSession

from sinks.delta import DeltaSink
from sinks.iceberg import IcebergSink
from sinks.kafka import KafkaSink
from sinks.mysql import MySQLXASink
from sinks.postgres import PostgresSink
from twophase import Secret, SinkGroup
from twophase.debezium import debezium_changes
from twophase.sink import TwoPhaseCommitSink
from twophase.spark import write_stream

MYSQL_PASSWORD_ENV = "MYSQL_PASSWORD"  # noqa: S105 - the variable's name, not a password
PG_PASSWORD_ENV = "PGPASSWORD"  # noqa: S105 - the variable's name, not a password
DEFAULT_COLUMNS = "id BIGINT, status STRING, amount DECIMAL(12,2)"
#: The event's field that versions a change: its log sequence number (``source.lsn``).
VERSION_FIELD: Final = "lsn"
#: The connector's ``time.precision.mode`` (how its numbers for timestamps are read).
TIME_PRECISION_MODE: Final = "connect"
#: The target's columns that the change's version and delete mark go into (read by the sinks).
VERSION_COLUMN = "version"
DELETED_COLUMN = "deleted"
TRIGGER_INTERVAL = "10 seconds"
#: The group's members, in the order they commit.
COMMIT_ORDER = ["mysql", "postgres", "delta", "iceberg", "changelog"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    parser.add_argument("--topic", required=True,
                        help="Debezium's topic of the table (<topic.prefix>.<schema>.<table>)")
    parser.add_argument("--checkpoint", required=True, help="Spark's checkpoint directory")
    parser.add_argument("--columns", default=DEFAULT_COLUMNS,
                        help=f"the table's columns, Spark DDL (default: {DEFAULT_COLUMNS})")
    parser.add_argument("--key", default="id", help="the primary key's columns, comma-separated")
    parser.add_argument("--mysql-table", help="the MySQL target table (none: no MySQL target)")
    parser.add_argument("--mysql-host", default="localhost")
    parser.add_argument("--mysql-port", type=int, default=3306)
    parser.add_argument("--mysql-user", default="etl")
    parser.add_argument("--mysql-database", default="shop")
    parser.add_argument("--mysql-tls", choices=("verify", "require", "off"), default="verify",
                        help="verify (the default): the server's certificate and host name")
    parser.add_argument("--mysql-ca-bundle", help="the CA of the MySQL server's certificate")
    parser.add_argument("--pg-table", help="the PostgreSQL target table (none: no PostgreSQL "
                                           "target)")
    parser.add_argument("--pg-host", default="localhost")
    parser.add_argument("--pg-port", type=int, default=5432)
    parser.add_argument("--pg-user", default="etl")
    parser.add_argument("--pg-database", default="shop")
    parser.add_argument("--pg-tls", choices=("verify", "require", "off"), default="verify",
                        help="verify (the default): the server's certificate and host name")
    parser.add_argument("--pg-ca-bundle", help="the CA of the PostgreSQL server's certificate")
    parser.add_argument("--delta-table", help="the Delta table's URI (none: no Delta target)")
    parser.add_argument("--iceberg-table", help="the Iceberg table, namespace.table (none: no "
                                                "Iceberg target)")
    parser.add_argument("--iceberg-catalog", default="{}",
                        help="pyiceberg's catalog properties, as JSON")
    parser.add_argument("--iceberg-catalog-name", default="default",
                        help="the catalog's name (as its readers load it)")
    parser.add_argument("--changelog-topic", help="a compacted topic of the same brokers (none: "
                                                  "no changelog target)")
    parser.add_argument("--jars", help="comma-separated jars for spark.jars (the Kafka source)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting (repeatable)")
    parser.add_argument("--max-offsets-per-trigger", type=int,
                        help="at most this many events per micro-batch")
    parser.add_argument("--trigger-interval", default=TRIGGER_INTERVAL,
                        help=f"a micro-batch this often (default: {TRIGGER_INTERVAL})")
    parser.add_argument("--available-now", action="store_true",
                        help="stop once the topic is drained (else run on)")
    args = parser.parse_args(argv)
    if not (args.mysql_table or args.pg_table or args.delta_table or args.iceberg_table
            or args.changelog_topic):
        parser.error("name a target: --mysql-table, --pg-table, --delta-table, "
                     "--iceberg-table, --changelog-topic, or several")
    if args.changelog_topic and len(key_of(args)) != 1:
        parser.error("--changelog-topic takes a table of one key column (the record key)")
    return args


def read_changes(spark: SparkSession, args: argparse.Namespace) -> DataFrame:
    """The topic's events as changes of the table: its columns, ``version``, ``deleted``."""
    reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", args.bootstrap)
              .option("subscribe", args.topic).option("startingOffsets", "earliest"))
    if args.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", args.max_offsets_per_trigger)
    return debezium_changes(reader.load(), args.columns, key=tuple(key_of(args)),
                            version=VERSION_FIELD, time_precision_mode=TIME_PRECISION_MODE)


def key_of(args: argparse.Namespace) -> list[str]:
    return [name.strip() for name in args.key.split(",") if name.strip()]


def keyed(args: argparse.Namespace) -> dict[str, Any]:
    """The keyed mode's options, the same for every target."""
    return {"mode": "keyed", "key": tuple(key_of(args)), "version": VERSION_COLUMN,
            "deleted": DELETED_COLUMN}


def build_sinks(args: argparse.Namespace) -> dict[str, TwoPhaseCommitSink[Any]]:
    """The targets by member name, in :data:`COMMIT_ORDER`; passwords read where the sinks
    connect, from the environment."""
    sinks: dict[str, TwoPhaseCommitSink[Any]] = {}
    if args.mysql_table:
        sinks["mysql"] = MySQLXASink(
            host=args.mysql_host, port=args.mysql_port, user=args.mysql_user,
            password=Secret(env=MYSQL_PASSWORD_ENV), database=args.mysql_database,
            table=args.mysql_table, tls=args.mysql_tls, ca_bundle=args.mysql_ca_bundle,
            **keyed(args))
    if args.pg_table:
        sinks["postgres"] = PostgresSink(
            host=args.pg_host, port=args.pg_port, user=args.pg_user,
            password=Secret(env=PG_PASSWORD_ENV), database=args.pg_database,
            table=args.pg_table, tls=args.pg_tls, ca_bundle=args.pg_ca_bundle,
            **keyed(args))
    if args.delta_table:
        sinks["delta"] = DeltaSink(args.delta_table, create=True, **keyed(args))
    if args.iceberg_table:
        sinks["iceberg"] = IcebergSink(args.iceberg_table,
                                       catalog=json.loads(args.iceberg_catalog),
                                       catalog_name=args.iceberg_catalog_name, create=True,
                                       **keyed(args))
    if args.changelog_topic:
        options = keyed(args)
        sinks["changelog"] = KafkaSink(args.bootstrap, args.changelog_topic,
                                       key=options.pop("key")[0], **options)
    return sinks


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    builder = SparkSession.builder.appName("debezium-pipeline")
    if args.jars:
        builder = builder.config("spark.jars", args.jars)
    for setting in args.conf:
        key, _, value = setting.partition("=")
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    changes = read_changes(spark, args)
    trigger = ({"availableNow": True} if args.available_now
               else {"processingTime": args.trigger_interval})
    sinks = build_sinks(args)
    if len(sinks) == 1:
        query = write_stream(changes, next(iter(sinks.values())),
                             checkpoint_location=args.checkpoint, trigger=trigger)
    else:
        order = [name for name in COMMIT_ORDER if name in sinks]
        query = write_stream(changes, SinkGroup(sinks, commit_order=order),
                             checkpoint_location=args.checkpoint, trigger=trigger)
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
