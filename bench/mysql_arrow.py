"""MySQLXASink through real Spark: its Arrow path against its Row path, same data, one run.

Run from the repository root (about two minutes on 2 cores)::

    .venv/bin/python -m bench.mysql_arrow [--batches 4] [--rows-per-batch 100000] [--rounds 3]

A private MariaDB (``setups.servers.mariadb``, binary log on, durable settings) and a local
Spark session (``bench.session.bench_session``, 2 cores, full JIT) in one process. The input is
a directory of Parquet files, two per micro-batch (so two partitions write each batch, no
shuffle), read with ``maxFilesPerTrigger=2`` and ``trigger(availableNow=True)``: ``--batches``
micro-batches of ``--rows-per-batch`` rows (id, name, amount, ts TIMESTAMP, flag), written into
an empty InnoDB table by each variant in turn, ``--rounds`` times, after one warm-up round:

* ``Arrow``: ``MySQLXASink`` as shipped; Spark's data source hands ``write_arrow`` record
  batches, which it encodes for ``LOAD DATA`` with Arrow kernels.
* ``Row``: the same sink with ``write_arrow`` reverted to the base class's
  (``TwoPhaseCommitSink.write_arrow``): the batches become Python rows, then ``write``.
* ``at-least-once``: a plain Python data source whose tasks load their batches in one plain
  transaction each, with the same Arrow encoder and chunk size: what a non-2PC sink would do.
* ``Spark noop``: Spark's ``noop`` sink on the same stream, the floor any sink starts from.

Every run is checked for exactly the expected distinct rows. Ratios are medians over rounds of
same-round pairs. CPU per row, from ``/proc``: the MariaDB server, Spark's Python workers (where
the sink's tasks run) and the JVM.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    WriterCommitMessage,
)
from pyspark.sql.streaming.query import StreamingQuery

from bench.mysql_xa import COLUMNS, TABLE, TABLE_DDL, count_rows, paired_ratio, server_cpu_s
from bench.session import bench_session, provenance
from setups.servers.mariadb import MariaDBServer, private_server
from sinks.mysql import MySQLXASink
from sinks.mysql.arrow import ArrowChunk
from sinks.mysql.bulk import load_tsv
from sinks.mysql.connection import open_connection
from sinks.mysql.sink import MySQLBranch
from twophase import TwoPhaseCommitSink
from twophase.kit import DEFAULT_CHUNK_SIZE, Tls, batch_chunks
from twophase.spark import write_stream

DEFAULT_BATCHES = 4
DEFAULT_ROWS_PER_BATCH = 100_000
DEFAULT_ROUNDS = 3
PARTITIONS = 2
GOAL_ARROW_VS_ROW = 3.0
FIRST_TS = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
NAMES = tuple(column.name for column in COLUMNS)
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64()),
                    ("ts", pa.timestamp("us", tz="UTC")), ("flag", pa.bool_())])


class RowPathSink(MySQLXASink):
    """The same sink fed through rows: the framework's default ``write_arrow``."""

    def write_arrow(self, txn: MySQLBranch, batches: Iterable[pa.RecordBatch]) -> None:
        TwoPhaseCommitSink.write_arrow(self, txn, batches)


class PlainLoad(DataSource):
    """At-least-once: each task loads its batches in one plain transaction; no 2PC."""

    @classmethod
    def name(cls) -> str:
        return "plain_mysql_load"

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        return PlainWriter(dict(self.options))


class PlainWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        options = self.options
        conn = open_connection(Tls(options["tls"]),  # type: ignore[arg-type]
                               host=options["host"], port=int(options["port"]),
                               user=options["user"], password=options["password"],
                               database=options["database"], local_infile=True,
                               autocommit=True, init_command="SET time_zone = '+00:00'")
        try:
            conn.begin()
            for batches in batch_chunks(iterator, DEFAULT_CHUNK_SIZE):
                chunk = ArrowChunk(batches)
                load_tsv(conn, f"`{TABLE}`", NAMES, chunk.tsv(), rows=len(chunk),
                         what="plain load")
            conn.commit()
        finally:
            conn.close()
        return WriterCommitMessage()

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
        pass


def generate_feed(directory: Path, batches: int, rows_per_batch: int) -> int:
    """``batches`` x ``PARTITIONS`` Parquet files, in the order Spark will read them."""
    directory.mkdir(parents=True)
    per_file = rows_per_batch // PARTITIONS
    for number in range(batches * PARTITIONS):
        ids = range(number * per_file, (number + 1) * per_file)
        table = pa.table({
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"customer-{i:08d}" for i in ids]),
            "amount": pa.array([i * 0.25 for i in ids], pa.float64()),
            "ts": pa.array([FIRST_TS + dt.timedelta(seconds=i) for i in ids], SCHEMA.field(3).type),
            "flag": pa.array([i % 3 == 0 for i in ids]),
        }, schema=SCHEMA)
        pq.write_table(table, directory / f"part-{number:05d}.parquet")
        time.sleep(0.01)  # distinct modification times: the file source orders by them
    return batches * PARTITIONS * per_file


def read_feed(spark: SparkSession, directory: Path) -> DataFrame:
    return (spark.readStream.schema("id BIGINT, name STRING, amount DOUBLE, ts TIMESTAMP, "
                                    "flag BOOLEAN")
            .option("maxFilesPerTrigger", PARTITIONS).parquet(str(directory)))


def sink_of(server: MariaDBServer, kind: type[MySQLXASink]) -> MySQLXASink:
    return kind(**server.params.kwargs(), table=TABLE)


def spark_cpu_s() -> tuple[float, float]:
    """CPU seconds so far of Spark's Python workers (live ones and those they reaped), and of
    its JVM."""
    workers = jvm = 0
    for proc in Path("/proc").iterdir():
        try:
            command = (proc / "cmdline").read_bytes() if proc.name.isdigit() else b""
            if b"pyspark" not in command:
                continue
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # a process that ended meanwhile
            continue
        ticks = sum(int(field) for field in fields[11:15])  # utime stime cutime cstime
        if b"java" in command:
            jvm += ticks
        else:
            workers += ticks
    clock = os.sysconf("SC_CLK_TCK")
    return workers / clock, jvm / clock


def start(variant: str, server: MariaDBServer, df: DataFrame, checkpoint: Path
          ) -> StreamingQuery:
    if variant in ("Arrow", "Row"):
        sink = sink_of(server, MySQLXASink if variant == "Arrow" else RowPathSink)
        return write_stream(df, sink, checkpoint_location=str(checkpoint),
                            trigger={"availableNow": True})
    writer = df.writeStream.option("checkpointLocation", str(checkpoint))
    if variant == "at-least-once":
        params = server.params
        writer = writer.format(PlainLoad.name()).options(
            host=params.host, port=str(params.port), user=params.user,
            password=params.password, database=params.database, tls=params.tls)
    else:
        writer = writer.format("noop")
    return writer.trigger(availableNow=True).start()


def run(server: MariaDBServer, spark: SparkSession, feed: Path, variant: str,
        workdir: Path) -> tuple[float, tuple[float, float, float]]:
    """One run of ``variant`` into an empty table: wall seconds, and CPU seconds of the
    server, the Python workers and the JVM."""
    server.connect().query(f"TRUNCATE TABLE {TABLE}")
    checkpoint = workdir / f"ckpt-{variant}"
    shutil.rmtree(checkpoint, ignore_errors=True)
    df = read_feed(spark, feed)
    before = (server_cpu_s(server), *spark_cpu_s())
    started = time.perf_counter()
    start(variant, server, df, checkpoint).awaitTermination()
    wall = time.perf_counter() - started
    after = (server_cpu_s(server), *spark_cpu_s())
    server_cpu, workers_cpu, jvm_cpu = (a - b for a, b in zip(after, before, strict=True))
    return wall, (server_cpu, workers_cpu, jvm_cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=DEFAULT_BATCHES)
    parser.add_argument("--rows-per-batch", type=int, default=DEFAULT_ROWS_PER_BATCH)
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    args = parser.parse_args()
    variants = ("Arrow", "Row", "at-least-once", "Spark noop")
    walls: dict[str, list[float]] = {name: [] for name in variants}
    cpus: dict[str, list[tuple[float, float, float]]] = {name: [] for name in variants}
    with private_server() as server, tempfile.TemporaryDirectory(prefix="twophase-") as tmp:
        workdir = Path(tmp)
        expected = generate_feed(workdir / "feed", args.batches, args.rows_per_batch)
        server.connect().query(TABLE_DDL)
        sink_of(server, MySQLXASink).check_schema(COLUMNS)
        spark = bench_session("twophase-bench-mysql", PARTITIONS)
        print(provenance(spark), "\n", flush=True)
        spark.dataSource.register(PlainLoad)
        for round_number in range(args.rounds + 1):  # round 0 warms up the JVM and the workers
            for variant in variants:
                wall, cpu = run(server, spark, workdir / "feed", variant, workdir)
                if variant != "Spark noop" and count_rows(server) != (expected, expected):
                    raise SystemExit(f"{variant}: {count_rows(server)} rows, {expected} expected")
                if round_number:
                    walls[variant].append(wall)
                    cpus[variant].append(cpu)
        version = server.connect().get_server_info()
        spark.stop()
    report(walls, cpus, expected, f"MariaDB {version}, Spark local[{PARTITIONS}], "
           f"{args.batches} micro-batches x {args.rows_per_batch:,} rows x {len(COLUMNS)} "
           f"columns, {PARTITIONS} partitions, chunk {DEFAULT_CHUNK_SIZE:,}, {args.rounds} rounds")


def report(walls: dict[str, list[float]], cpus: dict[str, list[tuple[float, float, float]]],
           rows: int, settings: str) -> None:
    print(settings, "\n")
    print(f"{'path':<14}  {'median rows/s':>13}  {'best rows/s':>11}  "
          "CPU us/row: server  Python workers   JVM")
    for name, results in walls.items():
        server, workers, jvm = (statistics.median(cpu[i] for cpu in cpus[name]) * 1e6 / rows
                                for i in range(3))
        print(f"{name:<14}  {rows / statistics.median(results):>13,.0f}  "
              f"{rows / min(results):>11,.0f}  {server:>18.2f}  {workers:>14.2f}  {jvm:>5.2f}")
    print("\nratios: median over rounds of the paired rows/s ratio")
    pairs: list[tuple[str, str, float | None]] = [
        ("Arrow", "Row", GOAL_ARROW_VS_ROW), ("Arrow", "at-least-once", None)]
    for name, base, goal in pairs:
        target = f"   goal >= {goal:.2f}" if goal is not None else ""
        print(f"  {name} / {base}: {paired_ratio(walls, name, base):.2f}{target}")


if __name__ == "__main__":
    main()
