"""The at-least-once writers ``bench/latency.py`` measures the sinks against: what a user would
pick instead, run as a streaming query by ``bench/latency_runner.py``.

* kafka: Spark's own Kafka sink (``to_json(struct(*))`` as the value, key ``order_id``), as
  ``bench/peer_kafka.py``;
* mysql, postgres: Spark's JDBC writer in ``foreachBatch``, configured as
  :func:`bench.spark_peers.jdbc_writer` (``batchsize``, READ_COMMITTED, append);
* sqlite: ``executemany`` of the batch's rows and one commit, in ``foreachBatch``;
* s3: one Parquet object per batch (``toArrow``), put with boto3 under the target's prefix;
* http: :class:`bench.peer_http.PlainPost` (each task POSTs its rows, a fresh key a request);
* delta: ``deltalake.write_deltalake(..., mode="append")`` of the batch (``toArrow``);
* iceberg: pyiceberg's ``table.append`` of the batch, the table created by the first.

``options`` come from ``bench/latency.py`` (its target's ``peer_options``).

And, for Kafka, the floor of every Python sink on Spark's data source path
(``bench/latency.py --python-floor``): :class:`PlainProduce`, at least once, no transaction.
"""

from __future__ import annotations

import contextlib
import io
import json
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import Producer
from deltalake import write_deltalake
from pyiceberg.catalog import load_catalog
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    WriterCommitMessage,
)
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.readwriter import DataStreamWriter

from bench.peer_http import PlainPost
from bench.spark_peers import JDBC_BATCH_SIZE

#: ``(batch, batch_id)`` of ``foreachBatch``.
BatchWriter = Callable[[DataFrame, int], None]
#: How long a plain producer's flush may take before the task fails.
FLUSH_TIMEOUT_S = 60.0


def with_trigger(writer: DataStreamWriter, trigger: str | None, checkpoint: str
                 ) -> DataStreamWriter:
    """``writer`` checkpointed at ``checkpoint``, on a ``processingTime`` trigger if given."""
    writer = writer.option("checkpointLocation", checkpoint)
    return writer.trigger(processingTime=trigger) if trigger else writer


def kafka_writer(feed: DataFrame, options: dict[str, Any]) -> DataStreamWriter:
    return (feed.selectExpr("CAST(order_id AS STRING) AS key", "to_json(struct(*)) AS value")
            .writeStream.format("kafka")
            .option("kafka.bootstrap.servers", options["bootstrap_servers"])
            .option("topic", options["topic"]))


def jdbc_batch(options: dict[str, Any]) -> BatchWriter:
    def write(batch: DataFrame, _batch_id: int) -> None:
        (batch.write.format("jdbc").option("url", options["url"])
         .option("dbtable", options["table"]).option("user", options["user"])
         .option("password", options["password"]).option("driver", options["driver"])
         .option("batchsize", JDBC_BATCH_SIZE).option("isolationLevel", "READ_COMMITTED")
         .mode("append").save())
    return write


def sqlite_batch(options: dict[str, Any]) -> BatchWriter:
    def write(batch: DataFrame, _batch_id: int) -> None:
        rows = [(row.event_id, row.order_id, row.status, row.ts.isoformat())
                for row in batch.collect()]
        with contextlib.closing(sqlite3.connect(options["path"])) as db, db:
            db.executemany("INSERT INTO orders (event_id, order_id, status, ts) "
                           "VALUES (?, ?, ?, ?)", rows)
    return write


def s3_batch(options: dict[str, Any]) -> BatchWriter:
    client = boto3.client("s3", endpoint_url=options["endpoint_url"],
                          region_name=options["region"],
                          aws_access_key_id=options["access_key_id"],
                          aws_secret_access_key=options["secret_access_key"])

    def write(batch: DataFrame, batch_id: int) -> None:
        body = io.BytesIO()
        pq.write_table(batch.toArrow(), body)
        client.put_object(Bucket=options["bucket"], Body=body.getvalue(),
                          Key=f"{options['prefix']}/batch-{batch_id:06d}.parquet")
    return write


def delta_batch(options: dict[str, Any]) -> BatchWriter:
    def write(batch: DataFrame, _batch_id: int) -> None:
        write_deltalake(options["table_uri"], batch.toArrow(), mode="append")
    return write


def iceberg_batch(options: dict[str, Any]) -> BatchWriter:
    catalog = load_catalog(options["catalog_name"], **options["catalog"])

    def write(batch: DataFrame, _batch_id: int) -> None:
        rows = batch.toArrow()
        catalog.create_namespace_if_not_exists(options["table"].rsplit(".", 1)[0])
        catalog.create_table_if_not_exists(options["table"], schema=rows.schema).append(rows)
    return write


BATCH_WRITERS: dict[str, Callable[[dict[str, Any]], BatchWriter]] = {
    "mysql": jdbc_batch, "postgres": jdbc_batch, "sqlite": sqlite_batch, "s3": s3_batch,
    "delta": delta_batch, "iceberg": iceberg_batch}


class PlainProduce(DataSource):
    """At least once through Spark's Python data source: each task produces its rows (from
    Arrow, as twophase's writer gets them) as JSON (key ``order_id``) with a plain producer
    kept by its Python worker, and flushes; the commit does nothing. What it costs over
    Spark's Kafka sink is the data source path's own (Python workers, Arrow, the writer made
    again and the commit run each batch): no Python sink on that path can be faster."""

    @classmethod
    def name(cls) -> str:
        return "plain_kafka_produce"

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        return PlainProduceWriter(dict(self.options))


_producers: dict[str, Producer] = {}


class PlainProduceWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        servers, topic = self.options["bootstrap_servers"], self.options["topic"]
        producer = _producers.get(servers)
        if producer is None:
            producer = _producers[servers] = Producer({"bootstrap.servers": servers,
                                                       "linger.ms": 0})
        for batch in iterator:
            for record in batch.to_pylist():
                producer.produce(topic, json.dumps(record, default=str).encode(),
                                 str(record["order_id"]).encode())
        if producer.flush(FLUSH_TIMEOUT_S):
            raise RuntimeError(f"records to {topic} not delivered in {FLUSH_TIMEOUT_S:g} s")
        return WriterCommitMessage()

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
        pass


def data_source_writer(spark: SparkSession, source: type[DataSource], feed: DataFrame,
                       options: dict[str, Any]) -> DataStreamWriter:
    """``feed`` written by the Python data source ``source`` (registered now) with
    ``options``."""
    spark.dataSource.register(source)
    return feed.writeStream.format(source.name()).options(**options)


def start_python_floor(spark: SparkSession, feed: DataFrame, options: dict[str, Any],
                       checkpoint: str, trigger: str | None) -> StreamingQuery:
    """:class:`PlainProduce` writing ``feed`` into the Kafka target, started."""
    writer = data_source_writer(spark, PlainProduce, feed, options)
    return with_trigger(writer, trigger, checkpoint).start()


def start(spark: SparkSession, target: str, feed: DataFrame, options: dict[str, Any],
          checkpoint: str, trigger: str | None) -> StreamingQuery:
    """The peer of ``target`` writing ``feed``, started."""
    if target == "kafka":
        writer = kafka_writer(feed, options)
    elif target == "http":
        writer = data_source_writer(spark, PlainPost, feed, options)
    else:
        writer = feed.writeStream.foreachBatch(BATCH_WRITERS[target](options))
    return with_trigger(writer, trigger, checkpoint).start()
