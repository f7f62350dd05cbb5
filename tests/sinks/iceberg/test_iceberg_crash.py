"""IcebergSink under the shared crash suite: a real Spark driver SIGKILLed at crash points and
restarted, into an Iceberg table of the embedded SQL catalog (SQLite), of PostgreSQL's, of
Iceberg's REST catalog server, and with its files on S3, read back by DuckDB's Iceberg reader
(every row exactly once, no file no snapshot added and no intent left: the setup's
``in_doubt``), each batch one snapshot, no file added twice.

CI: none here (CI time): the embedded catalog is crashed in CI as a member of the PostgreSQL
-> Iceberg -> Kafka group (``tests/spark/test_group_crash.py``: either side of the decision and
between members), and the PostgreSQL catalog's commits race in CI
(``tests/sinks/iceberg/test_iceberg_sink.py``); ``-m long``: the PostgreSQL catalog either side
of the decision, and every point on every catalog and on S3. The keyed mode's change stream:
either side of the decision in CI, every point under ``-m long``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from pyiceberg.catalog import load_catalog

from setups.base import Target as SetupTarget
from setups.iceberg import IcebergSetup, iceberg_scan
from sinks.iceberg.snapshots import SUMMARY_APP, SUMMARY_BATCH
from twophase.testing import Target
from twophase.testing.crash import DECISION_POINTS, CrashSuite, KeyedCrashSuite, KeyedFeedTarget

pytestmark = [pytest.mark.spark, pytest.mark.crash]


class IcebergCrashes(CrashSuite):
    """The data source path (Arrow batches into Parquet files)."""

    def check_finished(self, target: Target) -> None:
        """Each batch is one snapshot; no data file is added twice."""
        options = target.options
        table = load_catalog(options["catalog_name"], **options["catalog"]).load_table(
            options["table"])
        batches = [(snapshot.summary[SUMMARY_APP], snapshot.summary[SUMMARY_BATCH])
                   for snapshot in table.metadata.snapshots
                   if snapshot.summary and snapshot.summary[SUMMARY_BATCH] is not None]
        assert len(batches) == len(set(batches)), f"a batch committed twice: {batches}"
        assert batches, "no snapshot carried a batch"
        files = [task.file.file_path for task in table.scan().plan_files()]
        assert len(files) == len(set(files)), "a data file referenced twice"


@pytest.mark.long  # CI time: Iceberg crashed in CI in the PostgreSQL + Iceberg + Kafka group
class TestIcebergOnPostgresCatalogCrashes(IcebergCrashes):
    """The SQL catalog in the private PostgreSQL server's database (the catalog a team runs)."""

    setup_fixture = "iceberg_pg_setup"
    crash_points: tuple[str, ...] = DECISION_POINTS


@pytest.mark.long
class TestIcebergOnPostgresCatalogEveryPointCrashes(TestIcebergOnPostgresCatalogCrashes):
    crash_points = CrashSuite.crash_points


@pytest.mark.long
class TestIcebergCrashes(IcebergCrashes):
    """The embedded SQL catalog (SQLite), every point."""

    setup_fixture = "iceberg_setup"


@pytest.mark.long
class TestIcebergOnRestCatalogCrashes(IcebergCrashes):
    """Iceberg's own REST catalog server (a JVM: its JDBC catalog behind HTTP), every point;
    CI runs its racing committers."""

    setup_fixture = "iceberg_rest_setup"


@pytest.mark.long
class TestIcebergOnS3EveryPointCrashes(IcebergCrashes):
    """The table's files on the S3 lab's bucket (moto), the embedded catalog, every point."""

    setup_fixture = "iceberg_s3_setup"


@dataclass(eq=False)
class IcebergKeyedFeedTarget(KeyedFeedTarget):
    """A keyed Iceberg table read by DuckDB; in doubt: the setup's (data files no snapshot
    added, intents and staged changes left)."""

    setup: IcebergSetup | None = None

    def read_by_setup(self) -> SetupTarget:
        assert self.setup is not None
        return SetupTarget(self.factory, self.options, setup=self.setup)

    def state(self) -> dict[int, int]:
        assert self.setup is not None
        table = self.setup.table(self.read_by_setup())
        if table is None or table.current_snapshot() is None:
            return {}
        rows = self.setup.query(f"SELECT order_id, event_id FROM {iceberg_scan(table)}")
        assert len(rows) == len(dict(rows)), "a key is there twice"
        return dict(rows)

    def in_doubt(self) -> list[Any]:
        assert self.setup is not None
        return self.setup.in_doubt(self.read_by_setup())


class TestIcebergKeyedCrashes(KeyedCrashSuite):
    """A change stream (late, repeated, deleting changes) in the keyed mode, the embedded
    catalog, the driver killed either side of the decision (every point under ``-m long``):
    the table equals the feed's newest changes, nothing staged left."""

    @pytest.fixture
    def target(self, iceberg_setup: IcebergSetup) -> IcebergKeyedFeedTarget:
        return IcebergKeyedFeedTarget("sinks.iceberg:IcebergSink", iceberg_setup.target_options(
            mode="keyed", key=["order_id"], version="event_id", deleted="status"),
            setup=iceberg_setup)


@pytest.mark.long
class TestIcebergKeyedEveryPointCrashes(TestIcebergKeyedCrashes):
    crash_points = CrashSuite.crash_points
