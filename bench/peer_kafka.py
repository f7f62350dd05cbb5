"""KafkaSink (exactly once) against Spark's own Kafka sink (at least once), both into fresh
3-partition topics of one private Apache Kafka 4.1 broker (KRaft, ``setups.kafka`` over
``setups.servers.kafka``).

    nice .venv/bin/python -m bench.spark_peers kafka [--files 4] [--rows-per-file 100000]

* twophase: ``twophase.spark.write_stream(feed, KafkaSink(..., key="order_id"))``: key
  ``order_id``, value the row as JSON (encoded column-wise from Arrow), produced by librdkafka,
  ``min_commit_window_ms=0`` and the default transaction timeout;
* peer: ``feed.selectExpr("CAST(order_id AS STRING) AS key", "to_json(struct(*)) AS value")
  .writeStream.format("kafka")`` into the target's topic with Spark's Kafka jars
  (``scripts/kafka-broker-jars spark``, cached as the pipeline tests use them).

A topic's rows are read back by the setup's ``read_committed`` consumer (``event_id`` of the
JSON values). The broker's JVM is the "server" CPU column.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from bench.spark_peers import Contest, Peer
from setups import KafkaSetup
from setups.servers.kafka import spark_kafka_jars
from sinks.kafka.sink import DEFAULT_TRANSACTION_TIMEOUT_MS
from twophase.testing import Target


def spark_sink(feed: DataFrame, target: Target, checkpoint: str) -> None:
    (feed.selectExpr("CAST(order_id AS STRING) AS key", "to_json(struct(*)) AS value")
     .writeStream.format("kafka")
     .option("kafka.bootstrap.servers", target.options["bootstrap_servers"])
     .option("topic", target.options["topic"]).option("checkpointLocation", checkpoint)
     .trigger(availableNow=True).start().awaitTermination())


def start(_spark: SparkSession, workdir: Path, stack: contextlib.ExitStack) -> Contest:
    setup = stack.enter_context(KafkaSetup.started(workdir))
    assert setup.broker.process is not None
    return Contest(sink="KafkaSink", peer_name="Spark's Kafka sink (to_json(struct(*)))",
                   setup=setup, peer=spark_sink, server_pid=setup.broker.process.pid,
                   overrides={"min_commit_window_ms": 0,
                              "transaction_timeout_ms": DEFAULT_TRANSACTION_TIMEOUT_MS})


PEER = Peer(jars=spark_kafka_jars, start=start)
