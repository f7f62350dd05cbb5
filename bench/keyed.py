"""The keyed mode's apply rate into MySQL and PostgreSQL against what users write instead,
through the same Spark stream, in one run.

Run from the repository root (never in CI; the JDBC drivers come from Maven Central, cached by
``scripts/bench-jars``)::

    nice .venv/bin/python -m bench.keyed mysql postgres [--files 4] [--rows-per-file 100000]
        [--keys 20000] [--rounds 3] [--json RESULTS]

(``python -m bench.publish --only keyed`` runs it and publishes it in ``docs/benchmarks.md``.)

The stream: ``--files`` Parquet files of changes (``order_id`` one of ``--keys``, ``event_id``
its version, increasing over the feed, ``status``; ``op`` ``'d'`` for one change in ten, else
``'u'``), generated once before any clock starts, read with ``maxFilesPerTrigger=1`` and
``availableNow`` (one micro-batch per file) and handed over round-robin in 2 partitions, as a
source does: one key's changes reach both tasks of a batch. One ``local[2]`` SparkSession at
full JIT (the JVM's defaults, never the tests' C1-only ``SPARK_CONF``). Per database, after one
warm-up round, ``--rounds`` rounds of five writers, the order turning every round, each into a
fresh table ``(order_id PRIMARY KEY, status, event_id)`` of the same private server:

* **keyed**: ``write_stream`` into the sink with ``mode="keyed"``, ``key=("order_id",)``,
  ``version="event_id"``, ``deleted="op"``: rows routed by key into 2 partitions (one
  shuffle), reduced per key in each task, exactly once, newest version wins, deletes kept as
  tombstones.
* **insert**: the same rows with ``mode="insert"`` into a table keyed by ``event_id``: delivery
  alone, what keyed state costs over it.
* **peer** (at least once), the hand-written upsert users write in ``foreachBatch`` (no JDBC
  upsert exists in Spark): the batch reduced per key by a window (newest ``event_id``),
  appended by Spark's JDBC writer to a staging table, then applied from the driver by one
  upsert with the version guard and one delete, and the staging table emptied.
* **noop**, and **noop routed** (the same after ``repartition(2, "order_id")``): the floor,
  and the routing shuffle's share of it.

Every keyed and peer run counts only if the table then equals the reference computed from the
feed (each key's newest change; deleted keys absent). Printed per database (markdown): median
rows/s and every round's, CPU seconds per million rows of the JVM, its Python workers, the
driver and the server, the paired ratios keyed / peer and keyed / insert, and the shuffle's
share; first the run's provenance (commit, machine, load, versions). ``--json``: the same runs
and the session's provenance as a results file, a record per database
(``bench.spark_peers.contest_record``, its writers those above, ``keys`` beside its rows).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F  # noqa: N812 - Spark's own spelling

from bench.session import bench_session, provenance, provenance_of
from bench.spark_peers import (
    JDBC_BATCH_SIZE,
    NOOP,
    PARTITIONS,
    PEER,
    Measured,
    Run,
    bench_jars,
    contest_record,
    jvm_pid,
    measured,
    ratio_row,
    rounds_of,
    run_writer,
    writer_rows,
)
from setups import MySQLSetup, PostgresSetup
from sinks.mysql import MySQLXASink
from sinks.postgres import PostgresSink
from twophase.sink import TwoPhaseCommitSink
from twophase.spark import write_stream

DEFAULT_FILES = 4
DEFAULT_ROWS_PER_FILE = 100_000
DEFAULT_KEYS = 20_000
DEFAULT_ROUNDS = 3
DELETE_SHARE = 10  # one change in ten deletes its key
FEED_SCHEMA = "order_id BIGINT, status STRING, event_id BIGINT, op STRING"
KEYED, INSERT, ROUTED = "keyed", "insert", "noop routed"
#: How the reports and the results file name the peer.
PEER_LABEL = "foreachBatch: window reduce + Spark JDBC + upsert (at least once)"
#: The reference a keyed or peer run must leave: order_id -> (status, event_id).
State = dict[int, tuple[str, int]]
Writer = Callable[[DataFrame, "Table", str], None]


@dataclass
class Table:
    """A fresh table of one database and the sink options over it."""

    name: str
    options: dict[str, Any]


@dataclass
class Database:
    """One contest's server: fresh tables, its sink, its peer's SQL, its reader."""

    name: str
    sink: Callable[..., TwoPhaseCommitSink[Any]]
    options: dict[str, Any]
    jdbc_url: str
    jdbc_driver: str
    user: str
    password: str
    query: Callable[[str], list[tuple[Any, ...]]]
    quote: Callable[[str], str]
    #: The peer's apply: (table, staging) -> statements, after the batch is staged.
    apply: Callable[[str, str], list[str]]
    server_pid: int
    keyed_ddl: str
    insert_ddl: str

    def new(self, ddl: str, number: int, writer: str) -> Table:
        name = f"bench_{writer.replace(' ', '_')}_{number}"
        self.query(ddl.format(table=self.quote(name)))
        return Table(name, {**self.options, "table": name})

    def state(self, table: str) -> State:
        return {key: (status, version) for key, status, version in self.query(
            f"SELECT order_id, status, event_id FROM {self.quote(table)}")}

    def drop(self, table: str) -> None:
        self.query(f"DROP TABLE IF EXISTS {self.quote(table)}")


def mysql_apply(table: str, staging: str) -> list[str]:
    return [
        f"INSERT INTO `{table}` (order_id, status, event_id) SELECT s.order_id, s.status, "
        f"s.event_id FROM `{staging}` s WHERE s.op <> 'd' ON DUPLICATE KEY UPDATE "
        f"status = IF(VALUES(event_id) > `{table}`.event_id, VALUES(status), `{table}`.status), "
        f"event_id = IF(VALUES(event_id) > `{table}`.event_id, VALUES(event_id), "
        f"`{table}`.event_id)",
        f"DELETE t FROM `{table}` t JOIN `{staging}` s ON t.order_id = s.order_id "
        "WHERE s.op = 'd' AND t.event_id < s.event_id",
    ]


def postgres_apply(table: str, staging: str) -> list[str]:
    return [
        f'INSERT INTO "{table}" AS t (order_id, status, event_id) SELECT order_id, status, '
        f'event_id FROM "{staging}" WHERE op <> \'d\' ON CONFLICT (order_id) DO UPDATE SET '
        "status = EXCLUDED.status, event_id = EXCLUDED.event_id "
        "WHERE t.event_id < EXCLUDED.event_id",
        f'DELETE FROM "{table}" t USING "{staging}" s WHERE t.order_id = s.order_id '
        "AND s.op = 'd' AND t.event_id < s.event_id",
    ]


@contextlib.contextmanager
def mysql(workdir: Path) -> Iterator[Database]:
    with MySQLSetup.started(workdir) as setup:
        params = setup.server.params
        yield Database(
            "MySQLXASink", MySQLXASink, {**params.kwargs()},
            f"jdbc:mysql://{params.host}:{params.port}/{params.database}"
            "?permitMysqlScheme&rewriteBatchedStatements=true", "org.mariadb.jdbc.Driver",
            params.user, params.password, setup.db.query, lambda name: f"`{name}`",
            mysql_apply, setup.server.pid,
            "CREATE TABLE {table} (order_id BIGINT PRIMARY KEY, status VARCHAR(32), "
            "event_id BIGINT NOT NULL) ENGINE=InnoDB",
            "CREATE TABLE {table} (event_id BIGINT PRIMARY KEY, order_id BIGINT NOT NULL, "
            "status VARCHAR(32), op VARCHAR(1)) ENGINE=InnoDB")


@contextlib.contextmanager
def postgres(workdir: Path) -> Iterator[Database]:
    with PostgresSetup.started(workdir, settings={"fsync": "on",
                                                  "full_page_writes": "on"}) as setup:
        params = setup.server.params
        yield Database(
            "PostgresSink", PostgresSink, params.sink_options(),
            f"jdbc:postgresql://{params.host}:{params.port}/{params.database}"
            "?reWriteBatchedInserts=true", "org.postgresql.Driver",
            params.user, params.password, setup.view.query, lambda name: f'"{name}"',
            postgres_apply, setup.server.pid,
            "CREATE TABLE {table} (order_id BIGINT PRIMARY KEY, status TEXT, "
            "event_id BIGINT NOT NULL)",
            "CREATE TABLE {table} (event_id BIGINT PRIMARY KEY, order_id BIGINT NOT NULL, "
            "status TEXT, op TEXT)")


DATABASES: dict[str, Callable[[Path], contextlib.AbstractContextManager[Database]]] = {
    "mysql": mysql, "postgres": postgres}
JARS = {"mysql": "mariadb-java-client-*.jar", "postgres": "postgresql-*.jar"}


# --- the stream -------------------------------------------------------------------------------

def make_feed(workdir: Path, files: int, rows_per_file: int, keys: int) -> State:
    """The Parquet feed in ``workdir/feed`` (modification times in order); the reference."""
    feed = workdir / "feed"
    feed.mkdir(parents=True)
    newest: dict[int, tuple[str, int, str]] = {}
    for number in range(files):
        first = number * rows_per_file
        versions = list(range(first, first + rows_per_file))
        order = [(v * 7_919) % keys for v in versions]  # every key, scattered
        ops = ["d" if v % DELETE_SHARE == 0 else "u" for v in versions]
        statuses = [f"status {v % 5}" for v in versions]
        for key, version, op, status in zip(order, versions, ops, statuses, strict=True):
            newest[key] = (status, version, op)
        path = feed / f"changes-{number:05d}.parquet"
        pq.write_table(pa.table({"order_id": order, "status": statuses, "event_id": versions,
                                 "op": ops}), path)
        stamp = time.time() - files + number
        os.utime(path, (stamp, stamp))
    return {key: (status, version) for key, (status, version, op) in newest.items()
            if op != "d"}


def read_feed(spark: SparkSession, workdir: Path) -> DataFrame:
    return (spark.readStream.schema(FEED_SCHEMA).option("maxFilesPerTrigger", 1)
            .parquet(str(workdir / "feed")).repartition(PARTITIONS))


# --- the writers ------------------------------------------------------------------------------

def twophase_writer(database: Database, **sink_options: Any) -> Writer:
    def write(feed: DataFrame, table: Table, checkpoint: str) -> None:
        sink = database.sink(**{**table.options, **sink_options})
        write_stream(feed, sink, checkpoint_location=checkpoint, route_by_key=PARTITIONS,
                     trigger={"availableNow": True}).awaitTermination()
    return write


def peer_writer(database: Database) -> Writer:
    """The hand-written upsert: reduce, stage by Spark's JDBC writer, apply from the driver."""
    newest = Window.partitionBy("order_id").orderBy(F.col("event_id").desc())

    def write(feed: DataFrame, table: Table, checkpoint: str) -> None:
        staging = f"{table.name}_staging"

        def write_batch(batch: DataFrame, _batch_id: int) -> None:
            reduced = (batch.withColumn("rank", F.row_number().over(newest))
                       .where("rank = 1").drop("rank"))
            (reduced.write.format("jdbc").option("url", database.jdbc_url)
             .option("dbtable", staging).option("user", database.user)
             .option("password", database.password).option("driver", database.jdbc_driver)
             .option("batchsize", JDBC_BATCH_SIZE).option("isolationLevel", "READ_COMMITTED")
             .option("truncate", "true").mode("overwrite").save())
            for statement in database.apply(table.name, staging):
                database.query(statement)

        (feed.writeStream.foreachBatch(write_batch).option("checkpointLocation", checkpoint)
         .trigger(availableNow=True).start().awaitTermination())
        database.drop(staging)
    return write


def noop_writer(routed: bool) -> Writer:
    def write(feed: DataFrame, _table: Table, checkpoint: str) -> None:
        stream = feed.repartition(PARTITIONS, "order_id") if routed else feed
        (stream.writeStream.format("noop").option("checkpointLocation", checkpoint)
         .trigger(availableNow=True).start().awaitTermination())
    return write


# --- rounds -----------------------------------------------------------------------------------

def rounds(spark: SparkSession, database: Database, feed: DataFrame, workdir: Path, *,
           reference: State, count: int) -> list[Run]:
    writers: dict[str, tuple[Writer, str | None]] = {
        KEYED: (twophase_writer(database, mode="keyed", key=("order_id",),
                                version="event_id", deleted="op"), database.keyed_ddl),
        INSERT: (twophase_writer(database, mode="insert"), database.insert_ddl),
        PEER: (peer_writer(database), database.keyed_ddl),
        NOOP: (noop_writer(routed=False), None),
        ROUTED: (noop_writer(routed=True), None),
    }
    order, jvm, runs = list(writers), jvm_pid(spark), []
    for number in range(count + 1):
        turn = number % len(order)
        for name in order[turn:] + order[:turn]:
            writer, ddl = writers[name]
            table = database.new(ddl, number, name) if ddl else Table("", {})
            checkpoint = str(workdir / f"ckpt-{database.name}-{name}-{number}")
            run = run_writer(writer, feed, table, checkpoint,  # type: ignore[arg-type]
                             jvm=jvm, server_pid=database.server_pid)
            if name in (KEYED, PEER) and (state := database.state(table.name)) != reference:
                differing = {k for k in reference.keys() | state.keys()
                             if reference.get(k) != state.get(k)}
                raise SystemExit(f"{database.name}, {name}: {len(differing)} keys differ "
                                 f"from the feed's newest changes, e.g. {sorted(differing)[:5]}")
            if table.name:
                database.drop(table.name)
            if number:
                run.writer, run.round = name, number
                runs.append(run)
    return runs


def labels(sink: str) -> dict[str, str]:
    """How the reports name each writer of ``sink``'s contest, in their order."""
    return {KEYED: f"{sink} mode='keyed' (routed by key)",
            INSERT: f"{sink} mode='insert' (delivery only)", PEER: PEER_LABEL,
            NOOP: "Spark noop", ROUTED: "Spark noop after the routing shuffle"}


def shuffle_shares(found: dict[str, Measured]) -> list[float]:
    """Each round's routing shuffle (noop routed - noop) over the keyed run's time."""
    return [(routed - plain) / keyed for routed, plain, keyed in
            zip(found[ROUTED].seconds, found[NOOP].seconds, found[KEYED].seconds, strict=True)]


def table(record: dict[str, Any], floor: float | None = None) -> list[str]:
    """One database's table, from its record (``contest_record``): a row per writer, the paired
    ratios keyed / peer (marked if its median is under ``floor``) and keyed / insert, and the
    routing shuffle's share."""
    found = measured(record)
    lines = ["| writer | changes/s | rounds | CPU s per 1M changes: JVM / Python workers / "
             "driver / server |", "|---|---|---|---|"]
    lines += writer_rows(labels(record["sink"]), found)
    lines += [ratio_row("ratio keyed / peer", found[KEYED].rates, found[PEER].rates, floor),
              ratio_row("ratio keyed / insert", found[KEYED].rates, found[INSERT].rates)]
    shuffle = shuffle_shares(found)
    lines.append(f"| routing shuffle's share of the keyed run's time | "
                 f"{statistics.median(shuffle):.1%} | "
                 f"{', '.join(f'{v:.1%}' for v in shuffle)} | |")
    return lines


def report(record: dict[str, Any]) -> str:
    """The markdown table of one database under what it measured."""
    return "\n".join([f"{record['sink']}: {record['rows']:,} changes to {record['keys']:,} "
                      f"keys, {record['partitions']} partitions, {rounds_of(record)} rounds "
                      "(median; every round)", "", *table(record)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("databases", nargs="*", default=list(DATABASES), choices=list(DATABASES))
    parser.add_argument("--files", type=int, default=DEFAULT_FILES)
    parser.add_argument("--rows-per-file", type=int, default=DEFAULT_ROWS_PER_FILE)
    parser.add_argument("--keys", type=int, default=DEFAULT_KEYS)
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    parser.add_argument("--json", type=Path,
                        help="also write the run's provenance and every database's runs here "
                             "(the results file of bench/publish.py)")
    args = parser.parse_args()
    jars = [jar for name in args.databases for jar in bench_jars(JARS[name])]
    spark = bench_session("twophase-bench-keyed", PARTITIONS, {"spark.jars": ",".join(jars)})
    print(provenance(spark), "\n", flush=True)
    results: dict[str, Any] = {"provenance": provenance_of(spark), "contests": []}
    with tempfile.TemporaryDirectory(prefix="twophase-keyed-") as tmp:
        workdir = Path(tmp)
        reference = make_feed(workdir, args.files, args.rows_per_file, args.keys)
        feed = read_feed(spark, workdir)
        rows = args.files * args.rows_per_file
        for name in args.databases:
            with DATABASES[name](workdir / name) as database:
                runs = rounds(spark, database, feed, workdir, reference=reference,
                              count=args.rounds)
            record = contest_record(name, database.name, PEER_LABEL, runs, rows, keys=args.keys)
            results["contests"].append(record)
            print(report(record), "\n", flush=True)
            if args.json:
                args.json.write_text(json.dumps(results, indent=1))
    spark.stop()
    sys.exit(0)


if __name__ == "__main__":
    main()
