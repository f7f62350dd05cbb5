"""The keyed Iceberg table against Spark's own Iceberg MERGE (issue 49): the same batch of
changes into the same table, through a Spark stream each, side by side in one run; the Iceberg
twin of :mod:`bench.keyed_lake_peer` (Delta), whose contest it runs.

Runs on PySpark 4.1 (``iceberg-spark-runtime`` has no build for the project's 4.3), in the
virtualenv ``scripts/bench-spark41`` makes (``--setup`` makes it and fetches the Iceberg runtime
and the SQLite JDBC driver; :func:`bench.peer_iceberg.jars` reads them, downloading nothing)::

    scripts/bench-spark41 --setup
    PYSPARK_PYTHON=.venv-spark41/bin/python nice .venv-spark41/bin/python \\
        -m bench.keyed_lake_iceberg_peer [--rows 1000000] [--rounds 3] [--json RESULTS]

The table and the batch are :mod:`bench.keyed_lake`'s (``--rows`` rows in files of 100,000, key
order, version 1, built by pyiceberg; 10,000 changes, 10 % deletes, 50 % updates, 40 % inserts,
keys ``clustered`` or ``uniform``), the batch one Parquet file read by a stream with
``availableNow`` (one micro-batch). One ``local[2]`` session at full JIT
(:func:`bench.session.bench_session`) with Iceberg's SQL extensions (``MERGE INTO`` needs them).

One catalog for both writers, as :mod:`bench.peer_iceberg`'s contest has it: a JDBC (SQL)
catalog in a SQLite file, Spark's ``SparkCatalog`` (``type=jdbc`` through the SQLite JDBC
driver) and pyiceberg's ``SqlCatalog`` over the same ``iceberg_tables`` rows (compare-and-swap
on ``metadata_location``), catalog name ``lake`` on both sides. Not a Hadoop catalog: pyiceberg
has none (it would not find the tables Spark commits, nor Spark pyiceberg's). Spark's side
creates the catalog's tables and the namespace first, then pyiceberg builds the table.

Two writers, the order turning every round, each on the table put back as built (a rollback to
the built snapshot, :meth:`bench.keyed_lake.IcebergLake.reset`, then ``REFRESH TABLE`` for
Spark's table cache, untimed) and a checkpoint of its own:

* **twophase**: ``write_stream(feed, IcebergSink(table, catalog=..., catalog_name="lake",
  mode="keyed", key=("id",), version="version", deleted="op"), route_by_key=2)``: the tasks
  stage the changes, the driver applies them in one Iceberg commit, tombstones kept.
* **peer**: ``foreachBatch``: the batch reduced per key by a window (the newest version), then
  ``MERGE INTO lake.bench.orders_<rows>`` with the version guard on every clause (a delete, an
  update, an insert): Iceberg's defaults (copy-on-write). Exactly once by the guard alone: a
  replayed batch matches nothing newer (Iceberg has no ``txnAppId``). No tombstones: a late
  change of a deleted key is inserted again.

Each run is checked (rows and versions, :func:`bench.keyed_lake.check`, read by pyiceberg).
Timed: the whole query (start to termination) and, for the peer, the MERGE statement alone; CPU
seconds of the JVM, its Python workers and the driver. After one warm-up round of each;
medians and paired ratios.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from bench.keyed_lake import (
    CHANGE_COLUMNS,
    DEFAULT_ROWS_PER_FILE,
    KEYED,
    KEYED_OPTIONS,
    IcebergLake,
)
from bench.keyed_lake_peer import Writer, arguments, contest, merge_writer, save, twophase_writer
from bench.peer_iceberg import CATALOG, iceberg_version, jars
from bench.session import bench_session, provenance, provenance_of
from bench.spark_peers import PARTITIONS, PEER, TWOPHASE
from sinks.iceberg import IcebergSink
from sinks.iceberg.keyed import IcebergTombstones
from twophase import TwoPhaseCommitSink

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results" / "keyed_lake_iceberg_peer.json"
EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"


class SharedIcebergLake(IcebergLake):
    """:class:`bench.keyed_lake.IcebergLake` in the catalog Spark's session has too (module
    docstring): the same SQLite file and warehouse, the catalog name :data:`CATALOG`."""

    def __init__(self, spark: SparkSession, workdir: Path, rows: int) -> None:
        super().__init__(workdir, rows)
        self.spark = spark
        catalog_db = (workdir / "catalog.db").absolute()
        prefix = f"spark.sql.catalog.{CATALOG}"
        for key, value in {"": "org.apache.iceberg.spark.SparkCatalog", ".type": "jdbc",
                           ".uri": f"jdbc:sqlite:{catalog_db}",
                           ".warehouse": self.catalog_properties["warehouse"]}.items():
            spark.conf.set(prefix + key, value)
        namespace = self.identifier.split(".")[0]
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CATALOG}.{namespace}")
        #: The table as Spark SQL names it.
        self.spark_name = f"{CATALOG}.{self.identifier}"

    def keyed_sink(self) -> IcebergSink:
        return IcebergSink(self.identifier, catalog=self.catalog_properties,
                           catalog_name=CATALOG, **KEYED_OPTIONS)

    def sink(self, *, keyed: bool) -> TwoPhaseCommitSink[Any]:
        assert keyed, "the contest is keyed only"
        sink = IcebergSink(self.identifier, catalog=self.catalog_properties,
                           catalog_name=CATALOG, create=True, **KEYED_OPTIONS)
        sink.check_schema(CHANGE_COLUMNS)
        return sink

    def table(self) -> Any:
        return self.keyed_sink().catalog().load_table(self.identifier)

    def tombstone_table(self) -> Any:
        catalog = self.keyed_sink().catalog()
        return catalog.load_table(IcebergTombstones(catalog, self.identifier, KEYED).identifier)

    def reset(self) -> None:
        super().reset()
        self.spark.sql(f"REFRESH TABLE {self.spark_name}")


def main() -> None:
    args = arguments(__doc__.splitlines()[0], RESULTS)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = bench_session("twophase-bench-keyed-lake-iceberg-peer", PARTITIONS,
                          {"spark.jars": ",".join(jars()), "spark.sql.extensions": EXTENSIONS})
    run = provenance_of(spark)
    print(provenance(spark), flush=True)
    with tempfile.TemporaryDirectory(prefix="twophase-keyed-lake-iceberg-peer-") as tmp:
        workdir = Path(tmp)
        lake = SharedIcebergLake(spark, workdir, args.rows)
        lake.build(DEFAULT_ROWS_PER_FILE)

        def writers() -> dict[str, Writer]:
            return {TWOPHASE: twophase_writer(lake.keyed_sink()),
                    PEER: merge_writer(lake.spark_name)}

        summary = contest(spark, lake, writers, workdir, args)
    spark.stop()
    save(args.json, "keyed Iceberg table against Spark's Iceberg MERGE in foreachBatch "
         "(issue 49): python -m bench.keyed_lake_iceberg_peer", run, args, summary,
         iceberg=iceberg_version(), catalog="JDBC (SQL) catalog in SQLite, shared by Spark's "
         "SparkCatalog (type=jdbc) and pyiceberg's SqlCatalog")
    sys.exit(0)


if __name__ == "__main__":
    main()
