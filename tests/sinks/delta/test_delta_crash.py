"""DeltaSink under the shared crash suite: a real Spark driver SIGKILLed at crash points and
restarted, into a Delta table (local, and on S3) read back by DuckDB (every row exactly once,
nothing unreferenced and no intent left: the setup's ``in_doubt``), each batch one commit.
In CI the local table after the decision; on S3 and every point under ``-m long``. The keyed
mode's change stream either side of the decision in CI, every point under ``-m long``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from setups.delta import DeltaSetup, data_files, delta_scan, intents_left
from sinks.delta.snapshot import Snapshot
from twophase._crash import AFTER_DECISION
from twophase.testing import Target
from twophase.testing.crash import CrashSuite, KeyedCrashSuite, KeyedFeedTarget

pytestmark = [pytest.mark.spark, pytest.mark.crash]


class TestDeltaCrashes(CrashSuite):
    """The data source path (Arrow batches into Parquet files)."""

    setup_fixture = "delta_setup"
    #: CI time: after the decision; before it in CI by tests/spark/test_rescale.py (every sink,
    #: killed before two decisions); every point under -m long (TestDeltaEveryPointCrashes)
    crash_points: tuple[str, ...] = (AFTER_DECISION,)

    def check_finished(self, target: Target) -> None:
        """Each batch is one commit: no two commits carry one batch of the query."""
        history = DeltaTable(target.options["table_uri"],
                             storage_options=target.options.get("storage_options")).history()
        batches = [(commit["twophase.appId"], commit["twophase.batch"]) for commit in history
                   if "twophase.batch" in commit]
        assert len(batches) == len(set(batches)), f"a batch committed twice: {batches}"
        assert batches, "no commit carried a batch"


@pytest.mark.long
class TestDeltaEveryPointCrashes(TestDeltaCrashes):
    crash_points = CrashSuite.crash_points


@pytest.mark.long  # CI time: Delta crashed in CI by TestDeltaCrashes, on S3 by its contract
class TestDeltaOnS3Crashes(TestDeltaCrashes):
    """The table under an S3 prefix (moto): data files and intents by conditional put."""

    setup_fixture = "delta_s3_setup"


@pytest.mark.long
class TestDeltaOnS3EveryPointCrashes(TestDeltaOnS3Crashes):
    crash_points = CrashSuite.crash_points


@dataclass(eq=False)
class DeltaKeyedFeedTarget(KeyedFeedTarget):
    """A keyed Delta table read by DuckDB; in doubt: data files the log references neither
    live nor removed (a MERGE's rewritten files stay referenced until VACUUM), intents and
    staged changes left."""

    setup: DeltaSetup | None = None

    @property
    def root(self) -> Path:
        return Path(self.options["table_uri"])

    def state(self) -> dict[int, int]:
        assert self.setup is not None
        if not (self.root / "_delta_log").is_dir():
            return {}
        rows = self.setup.query(f"SELECT order_id, event_id FROM {delta_scan(self.root)}")
        assert len(rows) == len(dict(rows)), "a key is there twice"
        return dict(rows)

    def in_doubt(self) -> list[Any]:
        if not (self.root / "_delta_log").is_dir():
            return sorted(intents_left(self.root)) if self.root.is_dir() else []
        referenced = Snapshot.load(str(self.root), None).referenced()
        return sorted((data_files(self.root) - referenced) | intents_left(self.root))


class TestDeltaKeyedCrashes(KeyedCrashSuite):
    """A change stream (late, repeated, deleting changes) in the keyed mode, the driver killed
    either side of the decision (every point under ``-m long``): the table equals the feed's
    newest changes, nothing staged left."""

    @pytest.fixture
    def target(self, delta_setup: DeltaSetup) -> DeltaKeyedFeedTarget:
        return DeltaKeyedFeedTarget("sinks.delta:DeltaSink", delta_setup.target_options(
            mode="keyed", key=["order_id"], version="event_id", deleted="status"),
            setup=delta_setup)


@pytest.mark.long
class TestDeltaKeyedEveryPointCrashes(TestDeltaKeyedCrashes):
    crash_points = CrashSuite.crash_points
