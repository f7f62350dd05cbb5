"""Driver failover: every restart on a fresh "host" with nothing of the crashed driver's disk.

The checkpoint sits on shared storage (a directory outside every driver's working directory,
as a shared file system would be), the state and the objects on S3 (a moto_server process
over HTTPS, its certificate verified against the run's CA).
The driver is SIGKILLed at every crash point in turn, each time restarted from a new working
directory (its temporary files and Spark's local directory inside) while the crashed one's is
deleted: every row exactly once, nothing in doubt.
"""

from __future__ import annotations

from typing import Any

import pytest

from setups.servers.moto import MotoServer
from twophase._crash import AFTER_DECISION
from twophase.testing.crash import DECISION_POINTS, CrashSuite

pytestmark = [pytest.mark.spark, pytest.mark.crash]


def s3_state(server: MotoServer) -> tuple[str, dict[str, Any]]:
    """A state location in a fresh bucket, and the options to reach it."""
    options = server.options()
    return (f"s3://{server.new_bucket('state')}/checkpoints/orders/twophase",
            {key: options[key] for key in ("endpoint_url", "region", "path_style",
                                           "access_key_id", "secret_access_key", "ca_bundle")
             if key in options})


class TestS3DriverFailover(CrashSuite):
    setup_fixture = "s3_secured_setup"
    fresh_host_per_run = True
    #: CI time: after the decision (the new host reads the decided batch from the state on S3);
    #: before it in CI by tests/spark/test_rescale.py (every sink, killed before two
    #: decisions); either side under -m long (below), every point by TestS3Crashes and
    #: TestS3OnCluster
    crash_points: tuple[str, ...] = (AFTER_DECISION,)

    @pytest.fixture
    def state(self, moto_secured: MotoServer) -> tuple[str | None, dict[str, Any]]:
        return s3_state(moto_secured)


@pytest.mark.long
class TestS3DriverFailoverEitherSide(TestS3DriverFailover):
    crash_points = DECISION_POINTS
