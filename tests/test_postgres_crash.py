"""PostgresSink under the shared crash suite: a real Spark driver SIGKILLed at every named
crash point and restarted, on the data source path (COPY from Arrow) and on foreachBatch
(rows). The server itself killed with transactions prepared: tests/test_postgres_sink.py."""

from __future__ import annotations

import pytest

from twophase.testing.crash import DECISION_POINTS, CrashSuite

pytestmark = [pytest.mark.spark, pytest.mark.crash]


class TestPostgresCrashes(CrashSuite):
    """The data source path: COPY of Arrow's CSV; over the secured server (``hostssl`` only,
    verified TLS), as a role holding exactly the README's grants, its password a
    ``Secret(file=...)`` (:mod:`setups.least_privilege`)."""

    setup_fixture = "least_privileged_postgres_setup"
    #: CI time: every point under -m long (TestPostgresForeachBatchCrashes, the cluster's)
    crash_points = DECISION_POINTS


@pytest.mark.long
class TestPostgresForeachBatchCrashes(CrashSuite):
    setup_fixture = "postgres_setup"
    foreach_batch = True
