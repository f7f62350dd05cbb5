"""One writer's streaming query for ``bench/latency.py``, in a process of its own.

    PYTHONPATH=<tree> python -P bench/latency_runner.py SPEC.json

Run by ``bench/latency.py`` (never by hand): ``-P`` keeps this script's folder off
``sys.path``, so ``twophase`` and ``sinks`` (here and in Spark's Python workers, which inherit
``PYTHONPATH``) come from ``<tree>``: the checkout under test, or ``--baseline``'s. The spec
(JSON, :func:`main`) names the writer (``twophase``: ``write_stream`` into the sink the spec's
``factory`` builds from its ``options``; ``peer``: the target's at-least-once writer of
``bench/latency_peers.py``, from this checkout; ``python_floor``: its plain Python data source
into Kafka), the Kafka source topic, the trigger and the
checkpoint.

The query reads the topic from its earliest offset (JSON events, repartitioned to 2
partitions) in one ``local[2]`` session. Once it runs, the file ``ready`` is created; the query
runs until stdin closes, then it is stopped and ``result`` (JSON) holds every batch's progress
(Spark's ``durationMs``, rows), the twophase state's batch history (read every
:data:`HISTORY_INTERVAL_S`: the file keeps only the last 100 batches) and the files of
``twophase`` and ``sinks`` a Python worker imported.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.functions import col, from_json
from pyspark.sql.streaming.query import StreamingQuery

from bench.session import bench_session
from twophase.spark import write_stream
from twophase.testing.protocol import StateStore, build_sink

FEED_SCHEMA = "event_id BIGINT, order_id BIGINT, status STRING, ts TIMESTAMP"
PARTITIONS = 2
#: How often the query is checked for failure, and how often the twophase state's history
#: is read (it keeps only the last 100 batches; Spark's progress, the last 1,000).
CHECK_INTERVAL_S = 0.5
HISTORY_INTERVAL_S = 5.0
#: How long the last batch's progress may take to appear after its commit.
LAST_PROGRESS_TIMEOUT_S = 30.0


def session(jars: list[str]) -> SparkSession:
    """``local[2]`` at full JIT, its workers on this Python, keeping Spark's last 1,000
    progress reports."""
    return bench_session("twophase-latency", PARTITIONS, {
        "spark.jars": ",".join(jars), "spark.sql.streaming.numRecentProgressUpdates": "1000"})


def module_files(_: object) -> list[str]:
    """Where a Python worker imports ``twophase`` and ``sinks`` from."""
    return [importlib.import_module(name).__file__ or "" for name in ("twophase", "sinks")]


def read_events(spark: SparkSession, bootstrap_servers: str, topic: str) -> DataFrame:
    records = (spark.readStream.format("kafka")
               .option("kafka.bootstrap.servers", bootstrap_servers).option("subscribe", topic)
               .option("startingOffsets", "earliest").load())
    events = records.select(from_json(col("value").cast("string"), FEED_SCHEMA).alias("e"))
    return events.select("e.*").repartition(PARTITIONS)


def start_twophase(feed: DataFrame, spec: dict[str, Any]) -> StreamingQuery:
    trigger = {"processingTime": spec["trigger"]} if spec["trigger"] else None
    return write_stream(feed, build_sink(spec["factory"], spec["options"]),
                        checkpoint_location=spec["checkpoint"], trigger=trigger,
                        foreach_batch=spec["foreach_batch"])


def start_peer(spark: SparkSession, feed: DataFrame, spec: dict[str, Any]) -> StreamingQuery:
    """The target's at-least-once writer (``peer``), or the Python floor (``python_floor``)."""
    peers = importlib.import_module("bench.latency_peers")
    if spec["writer"] == "python_floor":
        floor: StreamingQuery = peers.start_python_floor(
            spark, feed, spec["peer_options"], spec["checkpoint"], spec["trigger"])
        return floor
    query: StreamingQuery = peers.start(spark, spec["target"], feed, spec["peer_options"],
                                        spec["checkpoint"], spec["trigger"])
    return query


def batch_history(checkpoint: str) -> list[dict[str, Any]]:
    """The twophase state's history of completed batches (empty before the first)."""
    state = StateStore.for_checkpoint(checkpoint).read()
    return [] if state is None else [vars(record) for record in state.history]


class Collector:
    """Every batch's progress and history record, kept as they pass."""

    def __init__(self, query: StreamingQuery, spec: dict[str, Any]) -> None:
        self.query, self.spec = query, spec
        self.progress: dict[int, dict[str, Any]] = {}
        self.history: dict[int, dict[str, Any]] = {}

    def collect_to_last_batch(self) -> None:
        """Collect until the progress of the last committed batch is in (Spark reports a
        batch's progress after its commit: a reader may see its rows before)."""
        commits = Path(self.spec["checkpoint"]) / "commits"
        last = max((int(name) for name in os.listdir(commits) if name.isdigit()), default=-1)
        deadline = time.monotonic() + LAST_PROGRESS_TIMEOUT_S
        self.collect_progress()
        while last not in self.progress and time.monotonic() < deadline:
            time.sleep(CHECK_INTERVAL_S)
            self.collect_progress()
        self.collect_history()

    def collect_progress(self) -> None:
        for update in self.query.recentProgress:
            progress = json.loads(update.json)
            self.progress[progress["batchId"]] = {
                key: progress[key] for key in ("batchId", "timestamp", "numInputRows",
                                                "durationMs")}

    def collect_history(self) -> None:
        if self.spec["writer"] == "twophase":
            for record in batch_history(self.spec["checkpoint"]):
                self.history[record["batch"]] = record


def wait_for_eof(closed: threading.Event) -> None:
    """Set ``closed`` once stdin closes (the orchestrator's signal to stop)."""
    sys.stdin.read()
    closed.set()


def run(spec: dict[str, Any]) -> dict[str, Any]:
    spark = session(spec["jars"])
    modules = spark.sparkContext.parallelize([0], 1).map(module_files).first()
    feed = read_events(spark, spec["bootstrap_servers"], spec["source_topic"])
    query = (start_twophase(feed, spec) if spec["writer"] == "twophase"
             else start_peer(spark, feed, spec))
    collector = Collector(query, spec)
    closed = threading.Event()
    threading.Thread(target=wait_for_eof, args=(closed,), daemon=True).start()
    Path(spec["ready"]).touch()
    error, history_read = None, time.monotonic()
    while not closed.wait(CHECK_INTERVAL_S):
        if not query.isActive:
            failure = query.exception()
            error = str(failure) if failure is not None else "the query stopped"
            break
        if time.monotonic() - history_read > HISTORY_INTERVAL_S:
            collector.collect_history()
            history_read = time.monotonic()
    if error is None:
        query.processAllAvailable()
        collector.collect_to_last_batch()
    query.stop()
    spark.stop()
    return {"modules": modules, "error": error,
            "progress": sorted(collector.progress.values(), key=lambda p: p["batchId"]),
            "history": sorted(collector.history.values(), key=lambda r: r["batch"])}


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    Path(spec["result"]).write_text(json.dumps(run(spec)))


if __name__ == "__main__":
    main()
