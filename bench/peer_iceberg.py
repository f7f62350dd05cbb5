"""IcebergSink (exactly once: one Iceberg commit per batch, through pyiceberg) against Spark's
own Iceberg streaming sink (``iceberg-spark-runtime`` 1.12.0 for Spark 4.1: exactly once by the
query id and epoch it records in each snapshot's summary), both on PySpark 4.1 in one run, both
into fresh tables of one Iceberg catalog: a JDBC (SQL) catalog in a SQLite file, which Spark's
``SparkCatalog`` (``type=jdbc``, through the SQLite JDBC driver) and pyiceberg's ``SqlCatalog``
share (the same ``iceberg_tables`` table, compare-and-swap on ``metadata_location``; catalog name
``lake`` on both sides). No server process: the server CPU column is 0.

Iceberg has no Spark runtime for the PySpark of the project's ``.venv`` (4.3), so this contest
runs in its own virtualenv, made (once) and run by one command::

    scripts/bench-spark41 iceberg [--files 4] [--rows-per-file 100000] [--rounds 3]

which makes ``.venv-spark41`` (twophase with its ``[dev]`` extras on ``pyspark==4.1.4``, plus
``pyiceberg[sql-sqlite]``), fetches the Iceberg runtime and the SQLite JDBC driver from Maven
Central into the jar cache (``scripts/bench/iceberg/pom.xml``) and runs ``nice
.venv-spark41/bin/python -m bench.spark_peers iceberg ...``. Nothing is downloaded here:
:func:`jars` reads the folder the script wrote into the venv.

* twophase: ``write_stream(feed, IcebergSink(table, catalog=..., catalog_name="lake",
  create=True))`` (the table, and its namespace, created from the query's columns at the
  start);
* peer: ``feed.writeStream.format("iceberg").outputMode("append").toTable("lake.db.t_<n>")``,
  the table created just before by Spark SQL (``CREATE TABLE ... USING iceberg``, in the timed
  run, as the sink's ``create`` is); Iceberg's defaults otherwise (format version, zstd
  Parquet, the catalog's table cache);
* Spark ``noop``: the floor.

The catalog is set on the session at :func:`start` (``spark.sql.catalog.lake.*``: a catalog is
loaded at its first use, so they need not be static), over files of the run's work directory.
Each table is read back by two other readers, and a run counts only if both see exactly the
stream's rows, each event id once: DuckDB's Iceberg extension (``iceberg_scan`` of the metadata
file the catalog points at, loaded from the ``duckdb-extension-iceberg`` and ``-avro`` packages,
never downloaded) gives the event ids the harness checks, and Spark's Iceberg reader through the
JDBC catalog (``spark.table("lake.db.t_<n>")``: count, distinct ids, their sum) must agree with
them, so tables pyiceberg committed are read by Spark and Spark's by DuckDB. Each table is dropped
and its files deleted once checked.
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import duckdb
import duckdb_extension_avro
import duckdb_extension_iceberg
import pyspark
from pyspark.sql import DataFrame, SparkSession, functions

from bench.spark_peers import Contest, Peer
from twophase.testing import Target

#: The PySpark series iceberg-spark-runtime-4.1 is built for.
PYSPARK_SERIES = "4.1."
#: Written by ``scripts/bench-spark41`` into its venv: the folder of the Iceberg runtime's jars.
JARS_MARKER = Path(sys.prefix) / "iceberg-jars"
COMMAND = "scripts/bench-spark41 iceberg"
RUNTIME_JAR = "iceberg-spark-runtime-4.1_2.13-"
#: The catalog's name: Spark's (``spark.sql.catalog.<name>``) and the ``catalog_name`` column of
#: the rows pyiceberg writes (``SqlCatalog(name)``) must be the same.
CATALOG = "lake"
NAMESPACE = "db"
SINK = "sinks.iceberg:IcebergSink"
#: No extension comes from the network: a missing one fails instead.
OFFLINE: dict[str, str | bool | int | float | list[str]] = {
    "autoinstall_known_extensions": False, "autoload_known_extensions": False}


def jars() -> list[str]:
    """The Iceberg runtime's and SQLite JDBC driver's jars, from the folder
    ``scripts/bench-spark41`` fetched them into."""
    if not pyspark.__version__.startswith(PYSPARK_SERIES) or not JARS_MARKER.is_file():
        raise SystemExit(f"the Iceberg peer (iceberg-spark-runtime-4.1) runs on PySpark "
                         f"{PYSPARK_SERIES}x, in the venv of scripts/bench-spark41 (this is "
                         f"PySpark {pyspark.__version__} in {sys.prefix}): run `{COMMAND}`")
    folder = Path(JARS_MARKER.read_text().strip())
    found = sorted(str(jar) for jar in folder.glob("*.jar"))
    names = [Path(jar).name for jar in found]
    if not any(name.startswith(RUNTIME_JAR) for name in names) or not any(
            name.startswith("sqlite-jdbc-") for name in names):
        raise SystemExit(f"{folder} lacks the Iceberg runtime or the SQLite JDBC driver: rerun "
                         f"`{COMMAND}`")
    return found


def iceberg_version() -> str:
    """The Iceberg runtime's version, from its jar's name."""
    (name,) = (Path(jar).name for jar in jars() if Path(jar).name.startswith(RUNTIME_JAR))
    return name.removesuffix(".jar").rsplit("-", 1)[1]


def extension(package: Any, name: str) -> Path:
    """``extensions/v<duckdb>/<name>.duckdb_extension`` of a DuckDB extension package."""
    return (Path(package.__file__).parent / "extensions" / f"v{duckdb.__version__}"
            / f"{name}.duckdb_extension")


def reader() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the Avro and Iceberg extensions loaded from their packages."""
    connection = duckdb.connect(config=OFFLINE)
    for package, name in ((duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")):
        connection.execute(f"LOAD '{extension(package, name)}'")
    return connection


def local_path(location: str) -> Path:
    """A ``file:`` location (Spark writes ``file:/p``, pyiceberg ``file:///p``) as a path."""
    return Path(urlparse(location).path) if location.startswith("file:") else Path(location)


@dataclass(eq=False)
class IcebergTarget(Target):
    """One fresh table of the lake (``options["table"]``: ``db.t_<n>``)."""

    lake: Lake = field(repr=False)

    def visible(self) -> list[int]:
        return sorted(self.lake.visible(self.options["table"]))


class Lake:
    """The run's catalog (a SQLite file) and warehouse (a directory), on the session and for
    pyiceberg; fresh tables in it, read back by DuckDB and by Spark."""

    def __init__(self, spark: SparkSession, scratch: Path) -> None:
        self.spark = spark
        scratch.mkdir(parents=True, exist_ok=True)
        self.catalog_db = scratch / "catalog.db"
        self.warehouse = scratch / "warehouse"
        self.warehouse.mkdir(exist_ok=True)
        self.tables = 0
        #: One DuckDB for the run (loading the extensions takes a while): a cursor per read.
        self._reader = reader()
        prefix = f"spark.sql.catalog.{CATALOG}"
        for key, value in {"": "org.apache.iceberg.spark.SparkCatalog", ".type": "jdbc",
                           ".uri": f"jdbc:sqlite:{self.catalog_db}",
                           ".warehouse": f"file:{self.warehouse}"}.items():
            spark.conf.set(prefix + key, value)
        spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CATALOG}.{NAMESPACE}")

    def sink_catalog(self) -> dict[str, str]:
        """pyiceberg's properties of the same catalog (``SqlCatalog``)."""
        return {"type": "sql", "uri": f"sqlite:///{self.catalog_db}",
                "warehouse": f"file://{self.warehouse}"}

    def new_target(self, **overrides: Any) -> IcebergTarget:
        """A table name not used before; created by its writer."""
        self.tables += 1
        return IcebergTarget(SINK, {"table": f"{NAMESPACE}.t_{self.tables}",
                                    "catalog": self.sink_catalog(), "catalog_name": CATALOG,
                                    "create": True, **overrides}, lake=self)

    def metadata_location(self, table: str) -> str | None:
        """What the catalog points the table at (None: no such table)."""
        namespace, name = table.rsplit(".", 1)
        if not self.catalog_db.exists():
            return None
        with contextlib.closing(sqlite3.connect(self.catalog_db)) as catalog:
            row = catalog.execute(
                "SELECT metadata_location FROM iceberg_tables WHERE catalog_name = ? AND "
                "table_namespace = ? AND table_name = ?", (CATALOG, namespace, name)).fetchone()
        return None if row is None else str(row[0])

    def visible(self, table: str) -> list[int]:
        """The event ids DuckDB reads in the table's current snapshot, once Spark's Iceberg
        reader (through the JDBC catalog) was found to read the same."""
        location = self.metadata_location(table)
        if location is None:
            return []
        quoted = str(local_path(location)).replace("'", "''")
        with contextlib.closing(self._reader.cursor()) as cursor:
            seen = [int(row[0]) for row in
                    cursor.execute(f"SELECT event_id FROM iceberg_scan('{quoted}')").fetchall()]
        self.spark.sql(f"REFRESH TABLE {CATALOG}.{table}")
        (row,) = self.spark.table(f"{CATALOG}.{table}").agg(
            functions.count(functions.lit(1)), functions.count_distinct("event_id"),
            functions.sum("event_id")).collect()
        duckdb_says = (len(seen), len(set(seen)), sum(seen) if seen else None)
        if tuple(row) != duckdb_says:
            raise SystemExit(f"{table}: Spark's Iceberg reader sees (rows, distinct ids, sum) "
                             f"{tuple(row)}, DuckDB's {duckdb_says}")
        return seen

    def discard(self, target: Target) -> None:
        """Drops the table from the catalog and deletes its files."""
        table = target.options["table"]
        location = self.metadata_location(table)
        self.spark.sql(f"DROP TABLE IF EXISTS {CATALOG}.{table}")
        if location is not None:
            shutil.rmtree(local_path(location).parent.parent, ignore_errors=True)


def columns(feed: DataFrame) -> str:
    """The feed's columns as Spark SQL's column list."""
    return ", ".join(f"`{column.name}` {column.dataType.simpleString()}"
                     for column in feed.schema.fields)


def iceberg_spark(feed: DataFrame, target: Target, checkpoint: str) -> None:
    """Spark's Iceberg streaming sink into the target's table, created first by Spark SQL."""
    name = f"{CATALOG}.{target.options['table']}"
    feed.sparkSession.sql(f"CREATE TABLE {name} ({columns(feed)}) USING iceberg")
    (feed.writeStream.format("iceberg").outputMode("append")
     .option("checkpointLocation", checkpoint).trigger(availableNow=True)
     .toTable(name).awaitTermination())


def start(spark: SparkSession, workdir: Path, _stack: contextlib.ExitStack) -> Contest:
    lake = Lake(spark, workdir)
    return Contest(sink="IcebergSink", peer_name=f"Iceberg {iceberg_version()} (Spark's "
                   "Iceberg sink)", setup=lake, peer=iceberg_spark, discard=lake.discard)


PEER = Peer(jars=jars, start=start)
