"""SQLiteSink (exactly once, Arrow path) against the plain at-least-once Python data source of
``bench/sqlite_stream.py`` (each task appends its rows in one SQLite transaction), each run into
a fresh database file (a target of ``setups.sqlite``, deleted once checked). SQLite has no
Spark-native writer (Spark's JDBC writer would need a SQLite JDBC driver no user of this sink
runs), and no server process: the server CPU column is 0, the database's work is in the Python
workers' column.

    nice .venv/bin/python -m bench.spark_peers sqlite [--files 4] [--rows-per-file 100000]
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from bench.spark_peers import Contest, Peer
from bench.sqlite_stream import PlainAppend
from setups import SQLiteSetup
from twophase.testing import Target


def plain(feed: DataFrame, target: Target, checkpoint: str) -> None:
    (feed.writeStream.format(PlainAppend.name()).option("path", target.options["path"])
     .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
     .awaitTermination())


def start(spark: SparkSession, workdir: Path, stack: contextlib.ExitStack) -> Contest:
    spark.dataSource.register(PlainAppend)
    setup = stack.enter_context(SQLiteSetup.started(workdir))
    return Contest(sink="SQLiteSink", peer_name="plain append (Python data source)",
                   setup=setup, peer=plain,
                   discard=lambda target: Path(target.options["path"]).unlink())


PEER = Peer(jars=list, start=start)
