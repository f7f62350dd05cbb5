"""JetStreamSink under the shared crash suite: a real Spark driver SIGKILLed at named crash
points and restarted; every row in the subject once, nothing left staged (the setup's
``in_doubt``: the staging stream's subjects that still hold messages). A commit killed inside
its chain, and the server itself killed with transactions staged:
tests/sinks/nats/test_nats_sink.py."""

from __future__ import annotations

import pytest

from twophase._crash import CRASH_POINTS
from twophase.testing.crash import DECISION_POINTS, CrashSuite

pytestmark = [pytest.mark.spark, pytest.mark.crash]


@pytest.mark.long  # CI time: crashed in CI either side of the decision over the same secured
class TestNatsCrashes(CrashSuite):  # server in the MySQL + NATS group (test_group_crash.py)
    """Either side of the decision (every point: below), over verified TLS as a user holding
    exactly the sink's permissions (sinks.nats.access), its password read from a file by the
    driver and every executor."""

    setup_fixture = "nats_secured_setup"
    crash_points: tuple[str, ...] = DECISION_POINTS


@pytest.mark.long
class TestNatsCrashesAtEveryPoint(TestNatsCrashes):
    """Every named crash point, on foreachBatch (rows), over the plain server."""

    setup_fixture = "nats_setup"
    crash_points = CRASH_POINTS
    foreach_batch = True
