"""S3Sink under the shared crash suite: a real Spark driver SIGKILLed at every named crash
point and restarted (in CI: tests/spark/test_failover.py, the state on S3 and a fresh host per
run)."""

from __future__ import annotations

import pytest

from twophase.testing.crash import CrashSuite

pytestmark = [pytest.mark.spark, pytest.mark.crash]


@pytest.mark.long  # CI time: the same sink and setup run in CI under TestS3DriverFailover
class TestS3Crashes(CrashSuite):
    """A crash leaves open uploads, never a visible duplicate; over HTTPS (the certificate
    verified against the run's CA), the sink running as a user holding exactly the README's
    least-privilege policy of its prefix."""

    setup_fixture = "s3_secured_setup"
