"""The shared crash suite for sinks.http: a real Spark driver SIGKILLed at every crash point,
delivering to the reference receiver (a separate process); judged by the receiver's store."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from setups.http import s3_staging
from setups.servers.moto import MotoServer
from twophase._crash import AFTER_DECISION
from twophase.testing.crash import DECISION_POINTS, CrashSuite

pytestmark = [pytest.mark.spark, pytest.mark.crash]


class TestHttpCrashes(CrashSuite):
    """Requests staged, then sent with idempotency keys: a crash leaves staged requests or
    requests the receiver replays, never a record delivered twice. Over HTTPS (the receiver's
    certificate verified against the run's CA), with the bearer token and the signature."""

    setup_fixture = "http_secured_setup"
    #: CI time: after the decision; before it in CI by tests/spark/test_rescale.py (every sink,
    #: killed before two decisions); either side under -m long (below), every point by
    #: TestHttpS3StagingCrashes and the cluster's
    crash_points: tuple[str, ...] = (AFTER_DECISION,)


@pytest.mark.long
class TestHttpCrashesEitherSide(TestHttpCrashes):
    crash_points = DECISION_POINTS


@pytest.mark.long
class TestHttpS3StagingCrashes(CrashSuite):
    """The same, staging on S3 (the executors and the driver share no disk): the manifest
    written last seals a pre-commit."""

    setup_fixture = "http_setup"

    @pytest.fixture
    def target_overrides(self, moto_server: MotoServer, s3_bucket: str) -> Mapping[str, Any]:
        return s3_staging(moto_server, s3_bucket)
