"""DeltaSink (exactly once: one Delta commit per batch, through deltalake) against Spark's own
Delta streaming sink (``delta-spark`` 4.4.0 for Spark 4.2: exactly once by the query id and
batch id it records in each commit, ``SetTransaction``), both on PySpark 4.2.0 in one run, each
run into a fresh table directory of ``setups.delta`` (deleted once checked). No server process:
the server CPU column is 0.

delta-spark has no build for the PySpark of the project's ``.venv`` (4.3), so this contest runs
in its own virtualenv, made (once) and run by one command::

    scripts/bench-spark42 delta [--files 4] [--rows-per-file 100000] [--rounds 3]

which makes ``.venv-spark42`` (twophase with its ``[dev]`` extras on ``pyspark==4.2.0``),
fetches delta-spark's jars from Maven Central into the jar cache (``scripts/bench/delta/pom.xml``)
and runs ``nice .venv-spark42/bin/python -m bench.spark_peers delta ...``. Nothing is downloaded
here: :func:`jars` reads the folder the script wrote into the venv.

* twophase: ``write_stream(feed, DeltaSink(table_uri, create=True))`` (the table created from
  the query's columns at the start; snappy Parquet written by pyarrow, exact statistics);
* peer: ``feed.writeStream.format("delta").start(table_uri)`` with the session extension and
  catalog Delta's docs ask for (``spark.sql.extensions``, ``spark.sql.catalog.spark_catalog``)
  and ``spark.databricks.delta.snapshotPartitions=2`` (:data:`DELTA_CONF`, set for every writer
  of the session alike; nothing else of twophase's or noop's path reads them); the table created
  by its first commit; snappy Parquet with statistics of the first 32 columns (Delta's
  defaults);
* Spark ``noop``: the floor.

Both tables are read back by the setup's reader (DuckDB's Delta extension), so a run counts only
if another engine sees exactly the stream's rows in what each writer committed.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
from pathlib import Path

import pyspark
from pyspark.sql import DataFrame, SparkSession

from bench.spark_peers import Contest, Peer
from setups import DeltaSetup
from twophase.testing import Target

#: The PySpark delta-spark 4.4.0's jars are built for (``delta-spark_4.2_2.13``).
PYSPARK_VERSION = "4.2.0"
#: Written by ``scripts/bench-spark42`` into its venv: the folder of delta-spark's jars.
JARS_MARKER = Path(sys.prefix) / "delta-jars"
COMMAND = "scripts/bench-spark42 delta"
#: What Delta's docs ask of a session that writes Delta tables, and the one tuning a user of a
#: small table on a small machine gives it: Delta rebuilds the table's state (the log replayed
#: into the files that are live) for every batch's commit, as a cached Spark job of
#: ``snapshotPartitions`` tasks, 50 by default; on 2 cores that job, not the writing, was ~3/4
#: of the peer's time (profiled: 17-35 s per 100,000-row batch at 50, 4-5 s at 2, machine
#: loaded). 2 = the session's shuffle partitions.
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.databricks.delta.snapshotPartitions": "2",
}


def jars() -> list[str]:
    """delta-spark's jars, from the folder ``scripts/bench-spark42`` fetched them into."""
    if pyspark.__version__ != PYSPARK_VERSION or not JARS_MARKER.is_file():
        raise SystemExit(f"the Delta peer (delta-spark) runs on PySpark {PYSPARK_VERSION}, in the "
                         f"venv of scripts/bench-spark42 (this is PySpark {pyspark.__version__} "
                         f"in {sys.prefix}): run `{COMMAND}`")
    folder = Path(JARS_MARKER.read_text().strip())
    found = sorted(str(jar) for jar in folder.glob("*.jar"))
    if not any(Path(jar).name.startswith("delta-spark_4.2_2.13-") for jar in found):
        raise SystemExit(f"{folder} lacks delta-spark's jar: rerun `{COMMAND}`")
    return found


def delta_spark(feed: DataFrame, target: Target, checkpoint: str) -> None:
    """Spark's Delta streaming sink into the target's table (created by its first commit)."""
    (feed.writeStream.format("delta").outputMode("append")
     .option("checkpointLocation", checkpoint).trigger(availableNow=True)
     .start(target.options["table_uri"]).awaitTermination())


def start(_spark: SparkSession, workdir: Path, stack: contextlib.ExitStack) -> Contest:
    setup = stack.enter_context(DeltaSetup.started(workdir))
    return Contest(sink="DeltaSink", peer_name=f"delta-spark {delta_version()} (Spark's Delta "
                   "sink)", setup=setup, peer=delta_spark,
                   discard=lambda target: shutil.rmtree(target.options["table_uri"],
                                                        ignore_errors=True))


def delta_version() -> str:
    """delta-spark's version, from its jar's name."""
    names = [Path(jar).name for jar in jars()]
    (name,) = (name for name in names if name.startswith("delta-spark_"))
    return name.removesuffix(".jar").rsplit("-", 1)[1]


PEER = Peer(jars=jars, start=start, conf=lambda: dict(DELTA_CONF))
