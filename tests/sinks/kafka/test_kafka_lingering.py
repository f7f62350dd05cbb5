"""A lingering transaction (the most reported Kafka failure of two-phase sinks): a driver
SIGKILLed with a transaction open holds back the partition's last stable offset, so every
``read_committed`` consumer stops at it, until something aborts it.

Measured here on the real broker, the transaction left by a SIGKILLed process (one batch
committed, the next pre-committed and never decided): how long ``read_committed`` readers stay
blocked after the query's restart (its start sweeps the earlier run's orphans: goal, less than
the time of one batch), and, with no restart, after ``python -m twophase.cleanup`` runs. The
cleanup cannot tell a dead driver from a slow one: it aborts a transaction of the query's
current run only once it is older than ``older_than`` (default: twice the trigger interval, at
least 10 minutes), so without a restart readers stay blocked for up to ``older_than`` plus the
cron interval; the test sets ``older_than`` to a few seconds. Without either, only the
broker's ``transaction.timeout.ms`` would end it.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from setups.servers.kafka import KafkaBroker
from sinks.kafka import KafkaSink
from twophase.testing.contract import NAMESPACE, ORDER_COLUMNS, orders, prepare
from twophase.testing.protocol import Coordinator, StateStore

pytestmark = pytest.mark.crash

log = logging.getLogger(__name__)

QUERY_ID = "1a2b3c4d-0000-4000-8000-00000000cafe"
ROWS = 20
BLOCKED_TIMEOUT_S = 60.0
CLEANUP_OLDER_THAN_S = 2
AFTER_THE_CRASH = 10_000
#: The crashed driver: batch 2's transaction pre-committed, undecided; then SIGKILL.
CRASHED_DRIVER = """
import json, os, signal, sys
from sinks.kafka import KafkaSink
from twophase.testing.contract import ORDER_COLUMNS, orders, prepare
sink = KafkaSink(**json.loads(sys.argv[1]))
sink.check_schema(ORDER_COLUMNS)
prepare(sink, orders(1000, 20), batch=2, partition=0, epoch=1, query_id=sys.argv[2])
os.kill(os.getpid(), signal.SIGKILL)
"""


def sink_options(broker: KafkaBroker, topic: str) -> dict[str, Any]:
    return {**broker.options(), "topic": topic, "key": "order_id",
            "transactional_id_prefix": f"{topic}-", "transaction_timeout_ms": 600_000,
            "min_commit_window_ms": 0}


def crash_with_a_transaction_open(options: dict[str, Any]) -> None:
    driver = subprocess.run([sys.executable, "-c", CRASHED_DRIVER, json.dumps(options),
                             QUERY_ID], check=False, capture_output=True, text=True)
    assert driver.returncode == -9, driver.stderr[-2000:]


def stable_offset(broker: KafkaBroker, topic: str) -> tuple[int, int]:
    """(last stable offset, high watermark) of the topic's partition 0."""
    partition = TopicPartition(topic, 0)
    ends = []
    for isolation in ("read_committed", "read_uncommitted"):
        consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers,
                                 isolation_level=isolation)
        try:
            ends.append(consumer.end_offsets([partition])[partition])
        finally:
            consumer.close()
    return ends[0], ends[1]


def seconds_until_unblocked(broker: KafkaBroker, topic: str,
                            unblock: Callable[[], None]) -> float:
    """Runs ``unblock`` and returns how long until read_committed readers reach the end."""
    started = time.monotonic()
    unblock()
    while (offsets := stable_offset(broker, topic))[0] < offsets[1]:
        assert time.monotonic() - started < BLOCKED_TIMEOUT_S, f"still blocked: {offsets}"
        time.sleep(0.05)
    return time.monotonic() - started


def committed_batches(sink: KafkaSink, store: StateStore) -> float:
    """Batches 0 and 1 of the first run, decided and committed; returns how long batch 1 took
    (a warm batch: its pre-commit, decision and commit)."""
    epoch = store.start_run(NAMESPACE, {}).epoch
    with Coordinator(sink, store, namespace=NAMESPACE, epoch=epoch) as coordinator:
        coordinator.start(QUERY_ID)
        for batch in range(2):
            started = time.monotonic()
            handle = prepare(sink, orders(batch * ROWS, ROWS), batch=batch, epoch=epoch,
                             query_id=QUERY_ID)
            coordinator.commit_batch(batch, QUERY_ID, [handle])
    return time.monotonic() - started


def restart(sink: KafkaSink, store: StateStore) -> Callable[[], None]:
    def start() -> None:
        epoch = store.start_run(NAMESPACE, {}).epoch
        with Coordinator(sink, store, namespace=NAMESPACE, epoch=epoch) as coordinator:
            coordinator.start(QUERY_ID)
    return start


def cleanup(options: dict[str, Any], state: Path) -> Callable[[], None]:
    """Cleanup's next run, once the orphan is older than its ``older_than``."""
    time.sleep(CLEANUP_OLDER_THAN_S)

    def run() -> None:
        subprocess.run([sys.executable, "-m", "twophase.cleanup", "--sink",
                        "sinks.kafka:KafkaSink", "--options", json.dumps(options),
                        "--state", str(state), "--older-than", f"{CLEANUP_OLDER_THAN_S}s"],
                       check=True, capture_output=True)
    return run


@pytest.mark.parametrize("unblocked_by", ["restart", "cleanup"])
def test_a_lingering_transaction_blocks_readers_until_the_restart_or_cleanup_aborts_it(
        kafka_broker: KafkaBroker, tmp_path: Path, unblocked_by: str) -> None:
    topic = kafka_broker.new_topic(partitions=1)
    options = sink_options(kafka_broker, topic)
    sink = KafkaSink(**options)
    sink.check_schema(ORDER_COLUMNS)
    state = tmp_path / "state"
    store = StateStore(state)
    batch_s = committed_batches(sink, store)
    crash_with_a_transaction_open(options)
    with KafkaProducer(bootstrap_servers=kafka_broker.bootstrap_servers) as producer:
        producer.send(topic, json.dumps({"event_id": AFTER_THE_CRASH}).encode(),
                      partition=0).get(timeout=30)
    lso, end = stable_offset(kafka_broker, topic)
    # batches 0 and 1 and their commit markers are readable; the orphan holds back the rest
    assert lso == 2 * (ROWS + 1) < end, "the crashed driver's transaction holds nothing back"
    unblock = restart(sink, store) if unblocked_by == "restart" else cleanup(options, state)
    blocked_s = seconds_until_unblocked(kafka_broker, topic, unblock)
    log.warning("read_committed readers blocked %.2fs after the %s began (one batch: %.2fs)",
                blocked_s, unblocked_by, batch_s)
    assert kafka_broker.event_ids(topic) == [*range(2 * ROWS), AFTER_THE_CRASH]
