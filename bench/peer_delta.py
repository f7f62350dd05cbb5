"""DeltaSink (exactly once: one Delta commit per batch, through deltalake) against a
PLACEHOLDER peer: Spark's own Parquet file sink (exactly once by its ``_spark_metadata`` log)
into the same fresh table directory, each run a target of ``setups.delta`` (deleted once
checked). No server process: the server CPU column is 0.

The real peer is Spark's own Delta streaming sink (``delta-spark`` 4.4 on PySpark 4.2, in its
own virtualenv made by a bench script; issue 35, a later milestone): it cannot run on the
PySpark twophase's venv has (4.3). Until then this placeholder measures the floor a Spark-native
file writer sets, not Delta's; ratios against it are NOT the issue's ratio.

    nice .venv/bin/python -m bench.spark_peers delta [--files 4] [--rows-per-file 100000]
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from bench.spark_peers import Contest, Peer
from setups import DeltaSetup
from twophase.testing import Target


def parquet_file_sink(feed: DataFrame, target: Target, checkpoint: str) -> None:
    (feed.writeStream.format("parquet").option("path", target.options["table_uri"])
     .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
     .awaitTermination())


def start(spark: SparkSession, workdir: Path, stack: contextlib.ExitStack) -> Contest:
    setup = stack.enter_context(DeltaSetup.started(workdir))

    def peer_visible(target: Target) -> list[int]:
        rows = spark.read.parquet(target.options["table_uri"]).select("event_id").collect()
        return sorted(int(row.event_id) for row in rows)

    return Contest(sink="DeltaSink", peer_name="Spark Parquet file sink (placeholder)",
                   setup=setup, peer=parquet_file_sink, peer_visible=peer_visible,
                   discard=lambda target: shutil.rmtree(target.options["table_uri"],
                                                        ignore_errors=True))


PEER = Peer(jars=list, start=start)
