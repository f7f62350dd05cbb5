"""The keyed Delta table against delta-spark's MERGE (issue 49): the same batch of changes into
the same table, through a Spark stream each, side by side in one run.

Runs on PySpark 4.2 (delta-spark 4.4.0 has no build for 4.3), in the virtualenv
``scripts/bench-spark42`` makes (``--setup`` makes it and fetches delta-spark's jars)::

    scripts/bench-spark42 --setup
    PYSPARK_PYTHON=.venv-spark42/bin/python nice .venv-spark42/bin/python \\
        -m bench.keyed_lake_peer [--rows 1000000] [--rounds 3] [--json RESULTS]

The table and the batch are :mod:`bench.keyed_lake`'s (``--rows`` rows in files of 100,000, key
order; 10,000 changes, 10 % deletes, 50 % updates, 40 % inserts, keys ``clustered`` or
``uniform``), the batch one Parquet file read by a stream with ``availableNow`` (one
micro-batch). One ``local[2]`` session at full JIT (:func:`bench.session.bench_session`) with
Delta's extension and catalog (:data:`bench.peer_delta.DELTA_CONF`). Two writers, the order
turning every round, each on the table put back as built (:meth:`bench.keyed_lake.DeltaLake.reset`)
and a checkpoint of its own:

* **twophase**: ``write_stream(feed, DeltaSink(uri, mode="keyed", key=("id",),
  version="version", deleted="op"), route_by_key=2)``: the tasks stage the changes, the
  driver applies them in one MERGE carrying the proof, tombstones kept.
* **peer** (exactly once by Delta's idempotent DML): ``foreachBatch``: the batch reduced per key
  by a window (the newest version), then ``MERGE INTO delta.`<table>``` with the version guard
  on every clause (a delete, an update, an insert), ``spark.databricks.delta.write.txnAppId``
  (one per query) and ``txnVersion`` (the batch id) set on the session for the MERGE. No
  tombstones: a late change of a deleted key is inserted again.

Each run is checked (rows and versions, :func:`bench.keyed_lake.check`). Timed: the whole query
(start to termination) and, for the peer, the MERGE statement alone; CPU seconds of the JVM,
its Python workers and the driver. After one warm-up round of each; medians.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F  # noqa: N812 - Spark's own spelling

from bench.keyed_lake import (
    CLUSTERED,
    DEFAULT_CHANGES,
    DEFAULT_ROWS_PER_FILE,
    KEYED_OPTIONS,
    UNIFORM,
    DeltaLake,
    Lake,
    Row,
    changes,
    check,
    load,
)
from bench.peer_delta import DELTA_CONF, jars
from bench.session import bench_session, provenance, provenance_of
from bench.spark_peers import PARTITIONS, PEER, TWOPHASE, cpu_snapshot, jvm_pid
from sinks.delta import DeltaSink
from twophase import TwoPhaseCommitSink
from twophase.spark import write_stream

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results" / "keyed_lake_peer.json"
FEED_SCHEMA = "id BIGINT, status STRING, amount DOUBLE, version BIGINT, op STRING"
#: The peer's MERGE, shared with the Iceberg peer (:mod:`bench.keyed_lake_iceberg_peer`):
#: ``target`` is the table as Spark SQL names it, ``source`` the reduced batch's view.
MERGE = """
MERGE INTO {target} AS t USING {source} AS s ON t.id = s.id
WHEN MATCHED AND s.op = 'd' AND t.version < s.version THEN DELETE
WHEN MATCHED AND s.op <> 'd' AND t.version < s.version THEN
  UPDATE SET t.status = s.status, t.amount = s.amount, t.version = s.version
WHEN NOT MATCHED AND s.op <> 'd' THEN
  INSERT (id, status, amount, version) VALUES (s.id, s.status, s.amount, s.version)
"""
#: A writer of one run: (session, the feed's folder, a checkpoint) -> its MERGEs' seconds.
Writer = Callable[[SparkSession, Path, str], list[float]]


def write_feed(folder: Path, batch: Sequence[Row]) -> None:
    folder.mkdir(parents=True)
    columns = list(zip(*batch, strict=True))
    pq.write_table(pa.table({
        "id": pa.array(columns[0], pa.int64()), "status": pa.array(columns[1], pa.string()),
        "amount": pa.array(columns[2], pa.float64()), "version": pa.array(columns[3], pa.int64()),
        "op": pa.array(columns[4], pa.string())}), folder / "changes.parquet")


def read_feed(spark: SparkSession, folder: Path) -> DataFrame:
    return spark.readStream.schema(FEED_SCHEMA).parquet(str(folder))


def twophase_writer(sink: TwoPhaseCommitSink[Any]) -> Writer:
    """``write_stream`` of the feed into the keyed ``sink``, routed by key."""
    def write(spark: SparkSession, feed: Path, checkpoint: str) -> list[float]:
        write_stream(read_feed(spark, feed), sink, checkpoint_location=checkpoint,
                     route_by_key=PARTITIONS, trigger={"availableNow": True}).awaitTermination()
        return []
    return write


def merge_writer(target: str, conf: Callable[[int], dict[str, str]] | None = None) -> Writer:
    """foreachBatch: the batch reduced per key by a window (the newest version), then one
    :data:`MERGE` into ``target``, with ``conf(batch_id)`` set on the session for the MERGE
    alone; the MERGEs' times."""
    def write(spark: SparkSession, feed: Path, checkpoint: str) -> list[float]:
        merges: list[float] = []
        newest = Window.partitionBy("id").orderBy(F.col("version").desc())

        def merge(batch: DataFrame, batch_id: int) -> None:
            session = batch.sparkSession
            view = f"changes_{batch_id}"
            (batch.withColumn("_rank", F.row_number().over(newest)).where("_rank = 1")
             .drop("_rank").createOrReplaceTempView(view))
            settings = conf(batch_id) if conf else {}
            for key, value in settings.items():
                session.conf.set(key, value)
            started = time.perf_counter()
            session.sql(MERGE.format(target=target, source=view))
            merges.append(time.perf_counter() - started)
            for key in settings:
                session.conf.unset(key)
            session.catalog.dropTempView(view)

        (read_feed(spark, feed).writeStream.foreachBatch(merge)
         .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
         .awaitTermination())
        return merges
    return write


def delta_txn(app_id: str) -> Callable[[int], dict[str, str]]:
    """Delta's idempotent DML: one app id per query, the batch id as its version."""
    return lambda batch_id: {"spark.databricks.delta.write.txnAppId": app_id,
                             "spark.databricks.delta.write.txnVersion": str(batch_id)}


def arguments(description: str, results: Path) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--changes", type=int, default=DEFAULT_CHANGES)
    parser.add_argument("--json", type=Path, default=results)
    return parser.parse_args()


def contest(spark: SparkSession, lake: Lake, writers: Callable[[], dict[str, Writer]],
            workdir: Path, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """One warm-up and ``args.rounds`` rounds of each shape, the writers' order turning every
    round, each on the table put back as built (``lake.reset``), checked after each run; the
    medians and the paired ratios (peer seconds / twophase seconds)."""
    jvm = jvm_pid(spark)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {
        shape: {TWOPHASE: [], PEER: []} for shape in (CLUSTERED, UNIFORM)}
    order = [TWOPHASE, PEER]
    for number in range(args.rounds + 1):
        for shape in (CLUSTERED, UNIFORM):
            batch = changes(args.rows, shape, args.changes, seed=7_000 + number)
            feed = workdir / f"feed-{shape}-{number}"
            write_feed(feed, batch)
            for name in order[number % 2:] + order[:number % 2]:
                lake.reset()
                writer = writers()[name]
                before, load_before = cpu_snapshot(jvm, None), load()
                started = time.perf_counter()
                merges = writer(spark, feed, str(workdir / f"ckpt-{name}-{shape}-{number}"))
                seconds = time.perf_counter() - started
                after = cpu_snapshot(jvm, None)
                check(lake, args.rows, batch)
                cpu = {key: round(after[key] - before[key], 3) for key in after
                       if key != "server"}
                print(f"  {'warm-up' if not number else f'round {number}'} {shape} {name}: "
                      f"{seconds:.3f} s (MERGE {merges}), CPU {cpu}, "
                      f"load {load_before}", flush=True)
                if number:
                    results[shape][name].append({
                        "seconds": round(seconds, 4), "merge_s": [round(m, 4) for m in merges],
                        "cpu_s": cpu, "load_before": load_before, "load_after": load()})
    lake.reset()
    summary: dict[str, dict[str, Any]] = {
        shape: {name: {"median_s": statistics.median(r["seconds"] for r in runs),
                       "rounds": runs} for name, runs in by_writer.items()}
        for shape, by_writer in results.items()}
    for shape, by_writer in summary.items():
        ours, theirs = by_writer[TWOPHASE]["median_s"], by_writer[PEER]["median_s"]
        ratios = [p["seconds"] / t["seconds"] for t, p in
                  zip(by_writer[TWOPHASE]["rounds"], by_writer[PEER]["rounds"], strict=True)]
        by_writer["ratio"] = {"peer_s_over_twophase_s": round(statistics.median(ratios), 3),
                              "rounds": [round(r, 3) for r in ratios]}
        print(f"{shape}: twophase {ours:.3f} s, peer {theirs:.3f} s, paired ratio "
              f"{statistics.median(ratios):.3f} ({', '.join(f'{r:.3f}' for r in ratios)})")
    return summary


def save(path: Path, what: str, run: dict[str, Any], args: argparse.Namespace,
         summary: dict[str, Any], **extra: Any) -> None:
    path.write_text(json.dumps({
        "what": what, "run": run, **extra, "rows": args.rows, "changes": args.changes,
        "results": summary}, indent=1) + "\n")


def main() -> None:
    args = arguments(__doc__.splitlines()[0], RESULTS)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = bench_session("twophase-bench-keyed-lake-peer", PARTITIONS,
                          {"spark.jars": ",".join(jars()), **DELTA_CONF})
    run = provenance_of(spark)
    print(provenance(spark), flush=True)
    with tempfile.TemporaryDirectory(prefix="twophase-keyed-lake-peer-") as tmp:
        workdir = Path(tmp)
        lake = DeltaLake(workdir, args.rows)
        lake.build(DEFAULT_ROWS_PER_FILE)

        def writers() -> dict[str, Writer]:
            return {TWOPHASE: twophase_writer(DeltaSink(lake.uri, **KEYED_OPTIONS)),
                    PEER: merge_writer(f"delta.`{lake.uri}`", delta_txn(str(uuid.uuid4())))}

        summary = contest(spark, lake, writers, workdir, args)
        shutil.rmtree(lake.uri, ignore_errors=True)
    spark.stop()
    save(args.json, "keyed Delta table against delta-spark MERGE in foreachBatch (issue 49): "
         "python -m bench.keyed_lake_peer", run, args, summary)
    sys.exit(0)


if __name__ == "__main__":
    main()
