"""Benchmark: the same Spark stream into the SQLite sink (exactly once) by its Arrow path and
by the Row path, and into a plain at-least-once SQLite append, side by side in one run.

All go through Spark's Python Data Source API with executemany inserts; the plain writer
appends straight into the target inside ``write()`` and has nothing to commit. The Row path is
the same sink with ``write_arrow`` left at the contract's default (record batches converted to
rows, then ``write``), as a sink that only implements ``write`` runs. Each is run ``--rounds``
times alternately on a warm session; the best round of each counts.

``--metrics`` instead compares the Arrow path with ``metrics_port`` on (its endpoint scraped
every ``SCRAPE_INTERVAL_S``, more often than Prometheus would) against off, alternating, and
prints the best and the median round of each.

    .venv/bin/python bench/sqlite_stream.py [--batches 20] [--rows-per-batch 10000] [--metrics]
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, WriterCommitMessage

from bench.session import bench_session, provenance
from sinks.sqlite import SQLiteSink
from twophase import TwoPhaseCommitSink
from twophase.spark import write_stream
from twophase.status import store_for
from twophase.testing.driver import generate_feed, read_feed

TABLE_DDL = ("CREATE TABLE orders (event_id INTEGER NOT NULL, order_id INTEGER NOT NULL, "
             "status TEXT NOT NULL, ts TEXT)")


class RowPathSQLiteSink(SQLiteSink):
    """The same sink through the Row path: batches become rows, then ``write``."""

    write_arrow = TwoPhaseCommitSink.write_arrow


SINKS = {"arrow": SQLiteSink, "rows": RowPathSQLiteSink, "metrics": SQLiteSink}
MODES = ("plain", "rows", "arrow")
METRICS_MODES = ("arrow", "metrics")
LABELS = {"plain": "plain append (at-least-once)", "rows": "SQLiteSink, Row path",
          "arrow": "SQLiteSink, Arrow path", "metrics": "Arrow path, metrics_port scraped"}
METRICS_PORT = 19464
SCRAPE_INTERVAL_S = 1.0


class PlainAppend(DataSource):
    """At-least-once: each task appends its rows in one SQLite transaction; no 2PC.

    Rows are converted before the write lock is taken, so that partitions only serialize on
    the insert itself, as the sink's chunked staging does: the strongest plain baseline.
    """

    @classmethod
    def name(cls) -> str:
        return "plain_sqlite_append"

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        return PlainWriter(self.options["path"])


class PlainWriter(DataSourceStreamWriter):
    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        rows = [(r[0], r[1], r[2], r[3].isoformat()) for r in iterator]  # before the lock
        connection = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=FULL")
        connection.execute("BEGIN IMMEDIATE")
        connection.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)", rows)
        connection.execute("COMMIT")
        connection.close()
        return WriterCommitMessage()

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
        pass


def fresh_database(path: Path) -> None:
    for leftover in path.parent.glob(path.name + "*"):
        leftover.unlink()
    with sqlite3.connect(path) as connection:
        connection.execute(TABLE_DDL)


def run(spark: SparkSession, feed: DataFrame, mode: str, workdir: Path) -> tuple[float, int]:
    database, checkpoint = workdir / f"{mode}.db", workdir / f"{mode}-ckpt"
    fresh_database(database)
    shutil.rmtree(checkpoint, ignore_errors=True)
    started = time.monotonic()
    scraping = threading.Event()
    if mode in SINKS:
        port = METRICS_PORT if mode == "metrics" else None
        query = write_stream(feed, SINKS[mode](database, "orders"),
                             checkpoint_location=str(checkpoint), trigger={"availableNow": True},
                             metrics_port=port and f"127.0.0.1:{port}")
        if port:
            threading.Thread(target=scrape, args=(port, scraping), daemon=True).start()
    else:
        query = (feed.writeStream.format(PlainAppend.name()).option("path", str(database))
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
                 .start())
    query.awaitTermination()
    elapsed = time.monotonic() - started
    scraping.set()
    with sqlite3.connect(database) as connection:
        (rows,) = connection.execute("SELECT count(*) FROM orders").fetchone()
    return elapsed, rows


def scrape(port: int, done: threading.Event) -> None:
    """Read the metrics endpoint every SCRAPE_INTERVAL_S until ``done``."""
    while not done.wait(SCRAPE_INTERVAL_S):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            reply.read()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--rows-per-batch", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--metrics", action="store_true",
                        help="compare metrics_port on against off instead")
    args = parser.parse_args()
    modes = METRICS_MODES if args.metrics else MODES
    spark = bench_session("twophase-bench")
    print(provenance(spark), "\n", flush=True)
    spark.dataSource.register(PlainAppend)
    with tempfile.TemporaryDirectory(prefix="twophase-bench-") as tmp:
        workdir = Path(tmp)
        expected = generate_feed(workdir / "feed", files=args.batches,
                                 rows_per_file=args.rows_per_batch)
        feed = read_feed(spark, workdir / "feed")
        for mode in modes:
            run(spark, feed, mode, workdir)  # warm the JVM and the Python workers
        rounds: dict[str, list[float]] = {mode: [] for mode in modes}
        for number in range(args.rounds):
            for mode in modes if number % 2 == 0 else modes[::-1]:
                elapsed, rows = run(spark, feed, mode, workdir)
                if rows != expected:
                    raise SystemExit(f"{mode}: {rows} rows written, {expected} expected")
                rounds[mode].append(elapsed)
        state = store_for(str(workdir / "arrow-ckpt")).read()
    spark.stop()
    if args.metrics:
        print_metrics_cost(args, expected, rounds)
        return 0
    best = {mode: min(times) for mode, times in rounds.items()}
    assert state is not None
    decision = statistics.median(r.decision_ms for r in state.history)
    commit = statistics.median(r.commit_ms for r in state.history)
    rate = {mode: expected / best[mode] for mode in MODES}
    print(f"SQLite, {args.batches} batches x {args.rows_per_batch} rows, 2 partitions, "
          f"best of {args.rounds} rounds")
    print(f"{'path':<34}{'rows/s':>10}")
    for mode in MODES:
        print(f"{LABELS[mode]:<34}{rate[mode]:>10.0f}")
    print(f"ratio Arrow path / Row path: {rate['arrow'] / rate['rows']:.3f}")
    print(f"ratio exactly-once (Arrow) / at-least-once: {rate['arrow'] / rate['plain']:.3f}")
    print(f"per-batch framework overhead (median): decision write {decision:.1f} ms, "
          f"commit fan-out {commit:.1f} ms, total {decision + commit:.1f} ms")
    return 0


def print_metrics_cost(args: argparse.Namespace, rows: int,
                       rounds: dict[str, list[float]]) -> None:
    print(f"SQLite, {args.batches} batches x {args.rows_per_batch} rows, 2 partitions, "
          f"{args.rounds} alternating rounds")
    print(f"{'path':<34}{'best rows/s':>12}{'median rows/s':>15}")
    for mode in METRICS_MODES:
        print(f"{LABELS[mode]:<34}{rows / min(rounds[mode]):>12.0f}"
              f"{rows / statistics.median(rounds[mode]):>15.0f}")
    best = min(rounds["arrow"]) / min(rounds["metrics"])
    median = statistics.median(rounds["arrow"]) / statistics.median(rounds["metrics"])
    print(f"ratio metrics on / off: best {best:.3f}, median {median:.3f}")


if __name__ == "__main__":
    sys.exit(main())
