"""DeltaSink under the shared crash suite: a real Spark driver SIGKILLed at crash points and
restarted, into a local Delta table read back by DuckDB (every row exactly once, nothing
unreferenced left in the data area: the setup's ``in_doubt``), each batch one commit."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from twophase.testing import Target
from twophase.testing.crash import DECISION_POINTS, CrashSuite

pytestmark = [pytest.mark.spark, pytest.mark.crash]


class TestDeltaCrashes(CrashSuite):
    """The data source path (Arrow batches into Parquet files)."""

    setup_fixture = "delta_setup"
    #: CI time: every point under -m long (TestDeltaEveryPointCrashes)
    crash_points: tuple[str, ...] = DECISION_POINTS

    def check_finished(self, target: Target) -> None:
        """Each batch is one commit: no two commits carry one batch of the query."""
        history = DeltaTable(target.options["table_uri"]).history()
        batches = [(commit["twophase.appId"], commit["twophase.batch"]) for commit in history
                   if "twophase.batch" in commit]
        assert len(batches) == len(set(batches)), f"a batch committed twice: {batches}"
        assert Path(target.options["table_uri"], "_delta_log").is_dir()


@pytest.mark.long
class TestDeltaEveryPointCrashes(TestDeltaCrashes):
    crash_points = CrashSuite.crash_points
