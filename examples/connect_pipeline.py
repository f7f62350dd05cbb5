"""The order-status feed, exactly once into SQLite or MySQL, from a Spark Connect client.

The demo's pipeline (``scripts/demo``: order events as JSON files with ``event_id``,
``order_id``, ``status``, ``ts``, one file per micro-batch) driven from a thin client that
talks gRPC to a Spark Connect server, as on Databricks serverless or shared-access compute.
The server is the Spark driver: the takeover (the checks against the checkpoint and the
state, the fencing, the recovery of earlier runs) and every decision run there, and its Python
workers build the sink. So the server's Python must have ``twophase`` and the sink's extras
installed, and the checkpoint and the state are paths (or ``s3://`` prefixes) *of the server*
(see the README's "On Spark Connect")::

    # the server (pyspark 4 ships it):
    $SPARK_HOME/sbin/start-connect-server.sh --conf spark.connect.grpc.binding.port=15002
    # the client (pip install 'pyspark[connect]' twophase):
    python examples/connect_pipeline.py --remote sc://spark-host:15002 \\
        --input /data/orders-feed --checkpoint /data/checkpoints/orders_live \\
        --sqlite /data/orders.db

``--mysql-host`` writes into MySQL / MariaDB by XA transactions instead (the password from
``MYSQL_PASSWORD``, never the command line); ``--foreach-batch`` drives the sink through
``foreachBatch`` (it runs in a Python process of the server). Stop the client and start it
again with the same ``--checkpoint``: it goes on where it stopped. A killed client leaves its
query running on the server; starting it again takes the query over (the old run is fenced and
Spark stops it): nothing is written twice.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from sinks.mysql import MySQLXASink
from sinks.sqlite import SQLiteSink
from twophase.sink import TwoPhaseCommitSink
from twophase.spark import write_stream

EVENT_SCHEMA = "event_id BIGINT, order_id BIGINT, status STRING, ts TIMESTAMP"
PASSWORD_ENV = "MYSQL_PASSWORD"  # noqa: S105 - the variable's name, not a password
TABLE = "orders_live"
TRIGGER_INTERVAL = "10 seconds"
FILES_PER_BATCH = 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--remote", required=True, help="the Connect server, sc://host:port")
    parser.add_argument("--input", required=True, help="the feed's directory (the server's)")
    parser.add_argument("--checkpoint", required=True,
                        help="Spark's checkpoint directory (the server's path, or s3a://...)")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--sqlite", help="a SQLite database file (on the server's host)")
    target.add_argument("--mysql-host", help="write into MySQL / MariaDB on this host")
    parser.add_argument("--mysql-port", type=int, default=3306)
    parser.add_argument("--mysql-user", default="etl")
    parser.add_argument("--mysql-database", default="shop")
    parser.add_argument("--mysql-tls", choices=("verify", "require", "off"), default="verify",
                        help="verify (the default): the server's certificate and host name")
    parser.add_argument("--mysql-ca-bundle", default=None,
                        help="the CA of the server's certificate (PEM); default: the system's")
    parser.add_argument("--table", default=TABLE)
    parser.add_argument("--foreach-batch", action="store_true",
                        help="drive the sink through foreachBatch (by default the data "
                             "source, as for any Spark Connect client)")
    parser.add_argument("--available-now", action="store_true",
                        help="stop once every file is consumed (else run on, every "
                             f"{TRIGGER_INTERVAL})")
    return parser.parse_args(argv)


def read_orders(spark: SparkSession, input_dir: str) -> DataFrame:
    return (spark.readStream.schema(EVENT_SCHEMA).option("maxFilesPerTrigger", FILES_PER_BATCH)
            .json(input_dir))


def build_sink(args: argparse.Namespace) -> TwoPhaseCommitSink[Any]:
    if args.sqlite:
        return SQLiteSink(args.sqlite, args.table)
    return MySQLXASink(host=args.mysql_host, port=args.mysql_port, user=args.mysql_user,
                       password=os.environ.get(PASSWORD_ENV, ""),
                       database=args.mysql_database, tls=args.mysql_tls,
                       ca_bundle=args.mysql_ca_bundle, table=args.table)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spark = SparkSession.builder.remote(args.remote).getOrCreate()
    trigger = {"availableNow": True} if args.available_now else {"processingTime": TRIGGER_INTERVAL}
    query = write_stream(read_orders(spark, args.input), build_sink(args),
                         checkpoint_location=args.checkpoint, trigger=trigger,
                         foreach_batch=True if args.foreach_batch else None)
    try:
        query.awaitTermination()
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
