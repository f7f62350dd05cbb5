"""PostgresSink under the shared crash suite: a real Spark driver SIGKILLed at every named
crash point and restarted, on the data source path (COPY from Arrow) and on foreachBatch
(rows). The server itself killed with transactions prepared: tests/test_postgres_sink.py."""

from __future__ import annotations

import pytest

from tests.on_setup import PostgresTarget
from twophase.testing.crash import CrashSuite

pytestmark = [pytest.mark.spark, pytest.mark.crash]


class TestPostgresCrashes(PostgresTarget, CrashSuite):
    """The data source path: COPY of Arrow's CSV."""


@pytest.mark.long
class TestPostgresForeachBatchCrashes(PostgresTarget, CrashSuite):
    foreach_batch = True
