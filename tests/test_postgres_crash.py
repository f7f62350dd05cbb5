"""PostgresSink under the shared crash suite: a real Spark driver SIGKILLed at every named
crash point and restarted, on the data source path (COPY from Arrow) and on foreachBatch
(rows). The server itself killed with transactions prepared: tests/test_postgres_sink.py."""

from __future__ import annotations

import pytest

from twophase.testing.crash import CrashSuite

pytestmark = [pytest.mark.spark, pytest.mark.crash]


class TestPostgresCrashes(CrashSuite):
    """The data source path: COPY of Arrow's CSV."""

    setup_fixture = "postgres_setup"


@pytest.mark.long
class TestPostgresForeachBatchCrashes(CrashSuite):
    setup_fixture = "postgres_setup"
    foreach_batch = True
