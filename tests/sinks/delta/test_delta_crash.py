"""DeltaSink under the shared crash suite: a real Spark driver SIGKILLed at crash points and
restarted, into a Delta table (local, and on S3) read back by DuckDB (every row exactly once,
nothing unreferenced and no intent left: the setup's ``in_doubt``), each batch one commit.
In CI the local table either side of the decision; on S3 and every point under ``-m long``."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from twophase._crash import AFTER_DECISION
from twophase.testing import Target
from twophase.testing.crash import CrashSuite

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
