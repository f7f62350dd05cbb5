"""KafkaSink against a raw librdkafka (confluent-kafka) transactional producer and a raw
non-transactional one, the same records, the same private broker, one run.

Run from the repository root (a few minutes on 2 cores)::

    .venv/bin/python -m bench.kafka_txn [--records 100000] [--rounds 3]

A private single-node Apache Kafka 4.1 broker (``setups.servers.kafka``; jars from
``scripts/kafka-broker-jars``), one topic of 3 partitions. The input: Arrow record batches of
``--records`` order rows, made before the clock starts. Each round, after one warm-up round,
the three take turns going first:

* ``KafkaSink``: ``begin_transaction`` (pool slot, registry record), ``write_arrow``,
  ``pre_commit`` (flush), ``commit`` (EndTxn from a committer): one partition's batch as one
  task and the driver make it.
* ``raw transactional``: ``confluent_kafka.Producer({"transactional.id": ...})``:
  ``init_transactions``, ``begin_transaction``, one ``produce`` per row (key ``order_id``,
  value the row as JSON, both made from the same Arrow batches by the sink's own column-wise
  encoder, so the ratio is the protocol's cost alone), ``commit_transaction``.
* ``raw at-least-once``: the same produces through a plain producer, then ``flush``.

All three use the same producer settings (:data:`PRODUCER_CONFIGS`). Ratio: median over
rounds of records/s (goal: the sink >= 0.9 of the raw transactional producer).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka import Producer

from setups.servers.kafka import KafkaBroker, private_broker
from sinks.kafka import KafkaSink
from sinks.kafka.arrow import columns_of
from sinks.kafka.producer import PARTITIONER, librdkafka_names
from sinks.kafka.records import RecordShape
from twophase import Column
from twophase.testing.contract import commit, context

ROWS_PER_BATCH = 10_000
PRODUCER_CONFIGS: dict[str, Any] = {"linger.ms": 5, "batch.size": 256 * 1024}
COLUMNS = (Column("event_id", "bigint", False), Column("order_id", "bigint", False),
           Column("status", "string", False), Column("ts", "timestamp", True))
SCHEMA = pa.schema([("event_id", pa.int64()), ("order_id", pa.int64()),
                    ("status", pa.string()), ("ts", pa.timestamp("us", tz="UTC"))])
START = datetime(2026, 11, 1, tzinfo=UTC)


def make_batches(records: int) -> list[pa.RecordBatch]:
    batches = []
    for first in range(0, records, ROWS_PER_BATCH):
        ids = list(range(first, min(first + ROWS_PER_BATCH, records)))
        batches.append(pa.record_batch([
            pa.array(ids, pa.int64()), pa.array([1000 + i % 5000 for i in ids], pa.int64()),
            pa.array(["paid"] * len(ids)),
            pa.array([START + timedelta(seconds=i) for i in ids], SCHEMA.field("ts").type),
        ], schema=SCHEMA))
    return batches


def raw(broker: KafkaBroker, topic: str, batches: list[pa.RecordBatch], *,
        transactional_id: str | None) -> None:
    configs = {"transactional.id": transactional_id} if transactional_id else {}
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers,
                         "partitioner": PARTITIONER, **librdkafka_names(PRODUCER_CONFIGS),
                         **configs})
    if transactional_id:
        producer.init_transactions()
        producer.begin_transaction()
    shape = RecordShape(topic=topic, key="order_id")
    for batch in batches:
        for _, key, value, _ in columns_of(shape, batch).records():
            while True:
                try:
                    producer.produce(topic, value, key)
                    break
                except BufferError:
                    producer.poll(0.05)
    if transactional_id:
        producer.commit_transaction()
    else:
        producer.flush()


def through_sink(sink: KafkaSink, batches: list[pa.RecordBatch], batch: int) -> None:
    txn = sink.begin_transaction(context(batch=batch, columns=COLUMNS))
    sink.write_arrow(txn, batches)
    commit(sink, sink.pre_commit(txn))


def run(records: int, rounds: int) -> dict[str, list[float]]:
    batches = make_batches(records)
    with tempfile.TemporaryDirectory() as home, private_broker(Path(home) / "kafka") as broker:
        topic = broker.new_topic("bench")
        sink = KafkaSink(broker.bootstrap_servers, topic, key="order_id",
                         transactional_id_prefix="bench-", min_commit_window_ms=0,
                         producer_configs=PRODUCER_CONFIGS)
        sink.check_schema(COLUMNS)
        methods: dict[str, Callable[[int], None]] = {
            "KafkaSink": lambda n: through_sink(sink, batches, n),
            "raw transactional": lambda n: raw(broker, topic, batches,
                                               transactional_id=f"bench-raw-{n % 2}"),
            "raw at-least-once": lambda n: raw(broker, topic, batches, transactional_id=None),
        }
        rates: dict[str, list[float]] = {name: [] for name in methods}
        names = list(methods)
        for number in range(rounds + 1):
            order = names[number % 3:] + names[:number % 3]
            for name in order:
                started = time.perf_counter()
                methods[name](number)
                elapsed = time.perf_counter() - started
                if number:  # round 0 warms up
                    rates[name].append(records / elapsed)
        print(f"broker: start {broker.start_s:.1f} s, RSS {broker.rss_mib():.0f} MiB")
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rates = run(args.records, args.rounds)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    print(f"{args.records} records per round, {args.rounds} rounds (median records/s)")
    for name, value in medians.items():
        print(f"| {name} | {value:,.0f} | {', '.join(f'{v:,.0f}' for v in rates[name])} |")
    sink, txn, plain = (medians[name] for name in rates)
    print(f"| ratio sink / raw transactional | {sink / txn:.3f} |")
    print(f"| ratio sink / raw at-least-once | {sink / plain:.3f} |")
    print(f"| ratio raw transactional / raw at-least-once | {txn / plain:.3f} |")


if __name__ == "__main__":
    main()
