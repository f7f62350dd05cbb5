"""SQLiteSink (exactly once, Arrow path) against the plain at-least-once Python data source of
``bench/sqlite_stream.py`` (each task appends its rows in one SQLite transaction), each run into
a fresh database file. SQLite has no Spark-native writer (Spark's JDBC writer would need a
SQLite JDBC driver no user of this sink runs), and no server process: the server CPU column is 0,
the database's work is in the Python workers' column.

    nice .venv/bin/python -m bench.spark_peers sqlite [--files 4] [--rows-per-file 100000]
"""

from __future__ import annotations

import contextlib
import itertools
import sqlite3
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from bench.spark_peers import Contest, Peer, twophase_writer
from bench.sqlite_stream import TABLE_DDL, PlainAppend
from sinks.sqlite import SQLiteSink


def start(spark: SparkSession, workdir: Path, _stack: contextlib.ExitStack) -> Contest:
    spark.dataSource.register(PlainAppend)
    workdir.mkdir(parents=True)
    numbers = itertools.count()

    def new_database() -> str:
        path = workdir / f"orders-{next(numbers)}.db"
        with contextlib.closing(sqlite3.connect(path)) as connection:
            connection.execute(TABLE_DDL)
        return str(path)

    twophase = twophase_writer(lambda database: SQLiteSink(database, "orders"))

    def plain(feed: DataFrame, database: str, checkpoint: str) -> None:
        (feed.writeStream.format(PlainAppend.name()).option("path", database)
         .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
         .awaitTermination())

    def rows_at(database: str) -> int:
        with contextlib.closing(sqlite3.connect(database)) as connection:
            (count,) = connection.execute("SELECT COUNT(DISTINCT event_id) FROM orders").fetchone()
        Path(database).unlink()
        return int(count)

    return Contest(sink="SQLiteSink", peer_name="plain append (Python data source)",
                   twophase=twophase, peer=plain, new_destination=new_database, rows_at=rows_at)


PEER = Peer(jars=list, start=start)
