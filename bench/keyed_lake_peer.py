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
    Row,
    changes,
    check,
    load,
)
from bench.peer_delta import DELTA_CONF, jars
from bench.session import bench_session, provenance, provenance_of
from bench.spark_peers import cpu_snapshot, jvm_pid
from sinks.delta import DeltaSink
from twophase.spark import write_stream

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results" / "keyed_lake_peer.json"
PARTITIONS = 2
FEED_SCHEMA = "id BIGINT, status STRING, amount DOUBLE, version BIGINT, op STRING"
TWOPHASE, PEER = "twophase", "peer"
MERGE = """
MERGE INTO delta.`{uri}` AS t USING {source} AS s ON t.id = s.id
WHEN MATCHED AND s.op = 'd' AND t.version < s.version THEN DELETE
WHEN MATCHED AND s.op <> 'd' AND t.version < s.version THEN
  UPDATE SET t.status = s.status, t.amount = s.amount, t.version = s.version
WHEN NOT MATCHED AND s.op <> 'd' THEN
  INSERT (id, status, amount, version) VALUES (s.id, s.status, s.amount, s.version)
"""
Writer = Callable[[SparkSession, Path, str, str], list[float]]


def write_feed(folder: Path, batch: Sequence[Row]) -> None:
    folder.mkdir(parents=True)
    columns = list(zip(*batch, strict=True))
    pq.write_table(pa.table({
        "id": pa.array(columns[0], pa.int64()), "status": pa.array(columns[1], pa.string()),
        "amount": pa.array(columns[2], pa.float64()), "version": pa.array(columns[3], pa.int64()),
        "op": pa.array(columns[4], pa.string())}), folder / "changes.parquet")


def read_feed(spark: SparkSession, folder: Path) -> DataFrame:
    return spark.readStream.schema(FEED_SCHEMA).parquet(str(folder))


def twophase_writer(spark: SparkSession, feed: Path, uri: str, checkpoint: str) -> list[float]:
    sink = DeltaSink(uri, **KEYED_OPTIONS)
    write_stream(read_feed(spark, feed), sink, checkpoint_location=checkpoint,
                 route_by_key=PARTITIONS, trigger={"availableNow": True}).awaitTermination()
    return []


def peer_writer(spark: SparkSession, feed: Path, uri: str, checkpoint: str) -> list[float]:
    """foreachBatch: reduce, then one idempotent MERGE (module docstring); the MERGEs' times."""
    app_id, merges = str(uuid.uuid4()), []
    newest = Window.partitionBy("id").orderBy(F.col("version").desc())

    def merge(batch: DataFrame, batch_id: int) -> None:
        session = batch.sparkSession
        view = f"changes_{batch_id}"
        (batch.withColumn("_rank", F.row_number().over(newest)).where("_rank = 1")
         .drop("_rank").createOrReplaceTempView(view))
        session.conf.set("spark.databricks.delta.write.txnAppId", app_id)
        session.conf.set("spark.databricks.delta.write.txnVersion", str(batch_id))
        started = time.perf_counter()
        session.sql(MERGE.format(uri=uri, source=view))
        merges.append(time.perf_counter() - started)
        session.conf.unset("spark.databricks.delta.write.txnAppId")
        session.conf.unset("spark.databricks.delta.write.txnVersion")
        session.catalog.dropTempView(view)

    (read_feed(spark, feed).writeStream.foreachBatch(merge)
     .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
     .awaitTermination())
    return merges


WRITERS: dict[str, Writer] = {TWOPHASE: twophase_writer, PEER: peer_writer}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--changes", type=int, default=DEFAULT_CHANGES)
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = bench_session("twophase-bench-keyed-lake-peer", PARTITIONS,
                          {"spark.jars": ",".join(jars()), **DELTA_CONF})
    run = provenance_of(spark)
    print(provenance(spark), flush=True)
    jvm = jvm_pid(spark)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {
        shape: {TWOPHASE: [], PEER: []} for shape in (CLUSTERED, UNIFORM)}
    with tempfile.TemporaryDirectory(prefix="twophase-keyed-lake-peer-") as tmp:
        workdir = Path(tmp)
        lake = DeltaLake(workdir, args.rows)
        lake.build(DEFAULT_ROWS_PER_FILE)
        order = [TWOPHASE, PEER]
        for number in range(args.rounds + 1):
            for shape in (CLUSTERED, UNIFORM):
                batch = changes(args.rows, shape, args.changes, seed=7_000 + number)
                feed = workdir / f"feed-{shape}-{number}"
                write_feed(feed, batch)
                for name in order[number % 2:] + order[:number % 2]:
                    lake.reset()
                    before, load_before = cpu_snapshot(jvm, None), load()
                    started = time.perf_counter()
                    merges = WRITERS[name](spark, feed, lake.uri,
                                           str(workdir / f"ckpt-{name}-{shape}-{number}"))
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
        shutil.rmtree(lake.uri, ignore_errors=True)
    spark.stop()
    summary = {shape: {name: {"median_s": statistics.median(r["seconds"] for r in runs),
                              "rounds": runs} for name, runs in writers.items()}
               for shape, writers in results.items()}
    for shape, writers in summary.items():
        ours, theirs = writers[TWOPHASE]["median_s"], writers[PEER]["median_s"]
        ratios = [p["seconds"] / t["seconds"] for t, p in
                  zip(writers[TWOPHASE]["rounds"], writers[PEER]["rounds"], strict=True)]
        writers["ratio"] = {"peer_s_over_twophase_s": round(statistics.median(ratios), 3),
                            "rounds": [round(r, 3) for r in ratios]}
        print(f"{shape}: twophase {ours:.3f} s, peer {theirs:.3f} s, paired ratio "
              f"{statistics.median(ratios):.3f} ({', '.join(f'{r:.3f}' for r in ratios)})")
    args.json.write_text(json.dumps({
        "what": "keyed Delta table against delta-spark MERGE in foreachBatch (issue 49): "
                "python -m bench.keyed_lake_peer", "run": run, "rows": args.rows,
        "changes": args.changes, "results": summary}, indent=1) + "\n")
    sys.exit(0)


if __name__ == "__main__":
    main()
