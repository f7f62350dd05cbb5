"""The benchmarks' broker warm-up (``setups.servers.kafka.warm_up``, run by
``bench/latency.py`` before its first query): it warms a broker once, and leaves nothing a
reader or a sink would meet: every transaction it opened is committed."""

from __future__ import annotations

import uuid

from setups.servers.kafka import KafkaBroker, warm_up

#: Long enough for a few transactions, short enough for CI.
SECONDS = 0.5


def test_warm_up_runs_once_per_broker_and_commits_every_transaction(
        kafka_broker: KafkaBroker) -> None:
    topic = f"warm-up-{uuid.uuid4().hex}"  # the session's broker: a name of this test's own
    assert warm_up(kafka_broker.bootstrap_servers, SECONDS, topic)
    assert not warm_up(kafka_broker.bootstrap_servers, SECONDS, topic)  # warm already
    assert kafka_broker.open_transactions(topic) == {}
    committed = kafka_broker.read(topic, "read_committed")
    assert committed
    assert len(committed) == len(kafka_broker.read(topic, "read_uncommitted"))
