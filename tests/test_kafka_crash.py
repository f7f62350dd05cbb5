"""The crash suite against a real Kafka broker: a Spark driver SIGKILLed at every crash point,
judged by a read_committed consumer; at the end no open transaction of the query is left."""

from __future__ import annotations

import pytest

from tests.servers.kafka import KafkaBroker
from twophase.testing.crash import CrashSuite, SinkTarget

pytestmark = [pytest.mark.spark, pytest.mark.crash]


class KafkaTarget:
    """A fresh topic through the transactional sink, read by a read_committed consumer."""

    @pytest.fixture
    def target(self, kafka_broker: KafkaBroker, kafka_topic: str) -> SinkTarget:
        self.broker = kafka_broker
        return SinkTarget("sinks.kafka:KafkaSink", {
            **kafka_broker.options(), "topic": kafka_topic, "key": "order_id",
            "transactional_id_prefix": f"{kafka_topic}-", "transaction_timeout_ms": 300_000})

    def visible(self, target: SinkTarget) -> list[int]:
        return self.broker.event_ids(target.options["topic"])


class TestKafkaCrashes(KafkaTarget, CrashSuite):
    """A crash leaves open transactions (invisible to read_committed), never a duplicate."""
