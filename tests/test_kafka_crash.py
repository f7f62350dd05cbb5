"""The crash suite against a real Kafka broker: a Spark driver SIGKILLed at every crash point,
judged by a read_committed consumer; at the end no open transaction of the query is left."""

from __future__ import annotations

import pytest

from twophase.testing.crash import CrashSuite

pytestmark = [pytest.mark.spark, pytest.mark.crash]


class TestKafkaCrashes(CrashSuite):
    """A crash leaves open transactions (invisible to read_committed), never a duplicate."""

    setup_fixture = "kafka_setup"
