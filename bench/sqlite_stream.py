"""Benchmark: the same Spark stream into the SQLite sink (exactly once) by its Arrow path and
by the Row path, and into a plain at-least-once SQLite append, side by side in one run.

All go through Spark's Python Data Source API with executemany inserts; the plain writer
appends straight into the target inside ``write()`` and has nothing to commit. The Row path is
the same sink with ``write_arrow`` left at the contract's default (record batches converted to
rows, then ``write``), as a sink that only implements ``write`` runs. Each is run ``--rounds``
times alternately on a warm session; the best round of each counts.

    .venv/bin/python bench/sqlite_stream.py [--batches 20] [--rows-per-batch 10000]
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, WriterCommitMessage

from sinks.sqlite import SQLiteSink
from twophase import TwoPhaseCommitSink
from twophase._state import StateStore
from twophase.spark import write_stream
from twophase.testing.driver import generate_feed, local_session, read_feed

TABLE_DDL = ("CREATE TABLE orders (event_id INTEGER NOT NULL, order_id INTEGER NOT NULL, "
             "status TEXT NOT NULL, ts TEXT)")


class RowPathSQLiteSink(SQLiteSink):
    """The same sink through the Row path: batches become rows, then ``write``."""

    write_arrow = TwoPhaseCommitSink.write_arrow


SINKS = {"arrow": SQLiteSink, "rows": RowPathSQLiteSink}
MODES = ("plain", "rows", "arrow")
LABELS = {"plain": "plain append (at-least-once)", "rows": "SQLiteSink, Row path",
          "arrow": "SQLiteSink, Arrow path"}


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
    if mode in SINKS:
        query = write_stream(feed, SINKS[mode](database, "orders"),
                             checkpoint_location=str(checkpoint), trigger={"availableNow": True})
    else:
        query = (feed.writeStream.format(PlainAppend.name()).option("path", str(database))
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
                 .start())
    query.awaitTermination()
    elapsed = time.monotonic() - started
    with sqlite3.connect(database) as connection:
        (rows,) = connection.execute("SELECT count(*) FROM orders").fetchone()
    return elapsed, rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--rows-per-batch", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    spark = local_session("twophase-bench")
    spark.dataSource.register(PlainAppend)
    with tempfile.TemporaryDirectory(prefix="twophase-bench-") as tmp:
        workdir = Path(tmp)
        expected = generate_feed(workdir / "feed", files=args.batches,
                                 rows_per_file=args.rows_per_batch)
        feed = read_feed(spark, workdir / "feed")
        for mode in MODES:
            run(spark, feed, mode, workdir)  # warm the JVM and the Python workers
        best: dict[str, float] = {}
        for _ in range(args.rounds):
            for mode in MODES:
                elapsed, rows = run(spark, feed, mode, workdir)
                if rows != expected:
                    raise SystemExit(f"{mode}: {rows} rows written, {expected} expected")
                best[mode] = min(best.get(mode, elapsed), elapsed)
        state = StateStore(workdir / "arrow-ckpt" / "twophase").read()
    spark.stop()
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


if __name__ == "__main__":
    sys.exit(main())
