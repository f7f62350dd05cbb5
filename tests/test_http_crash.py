"""The shared crash suite for sinks.http: a real Spark driver SIGKILLed at every crash point,
delivering to the reference receiver (a separate process); judged by the receiver's store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.servers.http_receiver import ReceiverProcess
from tests.servers.moto import MotoServer
from twophase._storage import S3_OPTIONS
from twophase.testing.crash import CrashSuite, SinkTarget

pytestmark = [pytest.mark.spark, pytest.mark.crash]

#: Small requests, so that a partition's slice is several requests with a key each.
RECORDS_PER_REQUEST = 30


def s3_staging(moto: MotoServer, bucket: str, prefix: str = "staging") -> dict[str, Any]:
    """The sink options of a staging under ``s3a://bucket/prefix`` on ``moto``."""
    return {"staging": f"s3a://{bucket}/{prefix}",
            "staging_options": {k: v for k, v in moto.options().items() if k in S3_OPTIONS}}


class HttpTarget:
    """The reference receiver (a path of its own) through the sink, staging in a directory
    that the driver and the executors share; judged by the receiver's store."""

    @pytest.fixture
    def http_staging(self, tmp_path: Path) -> dict[str, Any]:
        """The sink's staging options."""
        return {"staging": str(tmp_path / "staging")}

    @pytest.fixture
    def target(self, http_receiver: ReceiverProcess, receiver_path: str,
               http_staging: dict[str, Any]) -> SinkTarget:
        self.receiver, self.path = http_receiver, receiver_path
        return SinkTarget("sinks.http:HttpSink", {
            **http_receiver.sink_options(receiver_path), **http_staging,
            "encoding": "jsonl", "compression": "gzip",
            "max_records_per_request": RECORDS_PER_REQUEST})

    def visible(self, target: SinkTarget) -> list[int]:
        return self.receiver.event_ids(self.path)


class TestHttpCrashes(HttpTarget, CrashSuite):
    """Requests staged, then sent with idempotency keys: a crash leaves staged requests or
    requests the receiver replays, never a record delivered twice."""


@pytest.mark.long
class TestHttpS3StagingCrashes(HttpTarget, CrashSuite):
    """The same, staging on S3 (the executors and the driver share no disk): the manifest
    written last seals a pre-commit."""

    @pytest.fixture
    def http_staging(self, moto_server: MotoServer, s3_bucket: str) -> dict[str, Any]:
        return s3_staging(moto_server, s3_bucket)
