"""S3Sink (exactly once: one multipart upload per partition, completed at commit) against Spark's
own Parquet file sink through ``s3a://`` (Hadoop's S3A connector; at least once, the
``_spark_metadata`` log says which files count), into the same private ``moto_server``.

    nice .venv/bin/python -m bench.spark_peers s3 [--files 4] [--rows-per-file 100000]

The peer's jars: ``hadoop-aws`` at the version of the Hadoop client pyspark ships (3.5.0) and
the AWS SDK v2 ``bundle`` it names, from Maven Central (``scripts/bench-jars``). S3A is pointed
at moto with path-style access, plain HTTP and the server's static keys. Both write Parquet,
Spark's default compression for the peer (snappy) and the sink's default (snappy too) as a user
would leave them; every run writes into a fresh bucket, counted by reading back every Parquet
object the run's writer made visible (the sink's objects; the files the peer's metadata log
lists).
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from bench.spark_peers import Contest, Peer, bench_jars, twophase_writer
from setups.servers.moto import MotoServer, private_server
from sinks.s3 import S3Sink

PREFIX = "orders"
METADATA_LOG = f"{PREFIX}/_spark_metadata/"


def jars() -> list[str]:
    return bench_jars("hadoop-aws-*.jar", "bundle-*.jar", "analyticsaccelerator-s3-*.jar")


def point_s3a_at(spark: SparkSession, server: MotoServer) -> None:
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in {
        "fs.s3a.endpoint": server.endpoint_url, "fs.s3a.path.style.access": "true",
        "fs.s3a.connection.ssl.enabled": "false", "fs.s3a.endpoint.region": "us-east-1",
        "fs.s3a.access.key": server.access_key_id, "fs.s3a.secret.key": server.secret_access_key,
        "fs.s3a.aws.credentials.provider":
            "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
    }.items():
        conf.set(key, value)


def start(spark: SparkSession, workdir: Path, stack: contextlib.ExitStack) -> Contest:
    server = stack.enter_context(private_server(workdir / "moto"))
    point_s3a_at(spark, server)
    client = server.client()

    twophase = twophase_writer(lambda bucket: S3Sink(bucket, PREFIX, **server.options()))

    def spark_parquet(feed: DataFrame, bucket: str, checkpoint: str) -> None:
        (feed.writeStream.format("parquet").option("path", f"s3a://{bucket}/{PREFIX}")
         .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
         .awaitTermination())

    def rows_at(bucket: str) -> int:
        keys = _visible_keys(client, bucket)
        ids: set[int] = set()
        for key in keys:
            body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
            ids.update(pq.read_table(io.BytesIO(body), columns=["event_id"])
                       .column("event_id").to_pylist())
        return len(ids)

    return Contest(sink="S3Sink", peer_name="Spark Parquet sink (s3a)", twophase=twophase,
                   peer=spark_parquet, new_destination=lambda: server.new_bucket("peer"),
                   rows_at=rows_at, server_pid=server.process.pid)


def _visible_keys(client: Any, bucket: str) -> list[str]:
    """The objects a reader counts: the sink's; or, with a Spark metadata log, the files it
    lists (compaction aside, this bench's few batches never compact)."""
    keys = [item["Key"] for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket) for item in page.get("Contents", [])]
    logs = [key for key in keys if key.startswith(METADATA_LOG)]
    if not logs:
        return [key for key in keys if key.endswith(".parquet")]
    listed = []
    for key in logs:
        lines = client.get_object(Bucket=bucket, Key=key)["Body"].read().decode().splitlines()
        listed += [json.loads(line)["path"] for line in lines[1:]]  # line 0: the version
    return [path.split(f"{bucket}/", 1)[1] for path in listed]


PEER = Peer(jars=jars, start=start)
