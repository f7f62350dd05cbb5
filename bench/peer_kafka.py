"""KafkaSink (exactly once) against Spark's own Kafka sink (at least once), both into fresh
3-partition topics of one private Apache Kafka 4.1 broker (KRaft, ``setups.servers.kafka``).

    nice .venv/bin/python -m bench.spark_peers kafka [--files 4] [--rows-per-file 100000]

* twophase: ``twophase.spark.write_stream(feed, KafkaSink(..., key="order_id"))``: key
  ``order_id``, value the row as JSON (encoded column-wise from Arrow), produced by librdkafka;
* peer: ``feed.selectExpr("CAST(order_id AS STRING) AS key", "to_json(struct(*)) AS value")
  .writeStream.format("kafka")`` with Spark's Kafka jars (``scripts/kafka-broker-jars spark``,
  cached as the pipeline tests use them).

A topic's rows are counted by a ``read_committed`` consumer (distinct ``event_id`` of the JSON
values). The broker's JVM is the "server" CPU column.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from pyspark.sql import DataFrame, SparkSession

from bench.spark_peers import Contest, Peer, twophase_writer
from setups.servers.kafka import KafkaBroker, private_broker, spark_kafka_jars
from sinks.kafka import KafkaSink

TOPIC_PARTITIONS = 3
#: The read-back is done when the consumer got nothing for this long.
IDLE_S = 5.0
CONSUME_CHUNK = 10_000


def event_ids(broker: KafkaBroker, topic: str) -> set[int]:
    """The distinct ``event_id`` values a read_committed consumer reads from ``topic``."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": topic,
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    seen: set[int] = set()
    try:
        consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)
                         for partition in range(TOPIC_PARTITIONS)])
        while messages := consumer.consume(CONSUME_CHUNK, timeout=IDLE_S):
            for message in messages:
                value = message.value()
                if message.error() is None and value is not None:
                    seen.add(json.loads(value)["event_id"])
        return seen
    finally:
        consumer.close()


def start(_spark: SparkSession, workdir: Path, stack: contextlib.ExitStack) -> Contest:
    broker = stack.enter_context(private_broker(workdir / "kafka"))
    assert broker.process is not None

    twophase = twophase_writer(lambda topic: KafkaSink(
        broker.bootstrap_servers, topic, key="order_id", transactional_id_prefix=f"{topic}-",
        min_commit_window_ms=0))

    def spark_sink(feed: DataFrame, topic: str, checkpoint: str) -> None:
        (feed.selectExpr("CAST(order_id AS STRING) AS key", "to_json(struct(*)) AS value")
         .writeStream.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap_servers)
         .option("topic", topic).option("checkpointLocation", checkpoint)
         .trigger(availableNow=True).start().awaitTermination())

    return Contest(sink="KafkaSink", peer_name="Spark's Kafka sink (to_json(struct(*)))",
                   twophase=twophase, peer=spark_sink,
                   new_destination=lambda: broker.new_topic("peer", TOPIC_PARTITIONS),
                   rows_at=lambda topic: len(event_ids(broker, topic)),
                   server_pid=broker.process.pid)


PEER = Peer(jars=spark_kafka_jars, start=start)
