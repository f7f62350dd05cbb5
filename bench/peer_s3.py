"""S3Sink (exactly once: one multipart upload per partition, completed at commit) against Spark's
own Parquet file sink through ``s3a://`` (Hadoop's S3A connector; at least once, the
``_spark_metadata`` log says which files count), into the same private ``moto_server``
(``setups.s3`` over ``setups.servers.moto``).

    nice .venv/bin/python -m bench.spark_peers s3 [--files 4] [--rows-per-file 100000]

The peer's jars: ``hadoop-aws`` at the version of the Hadoop client pyspark ships (3.5.0) and
the AWS SDK v2 ``bundle`` it names, from Maven Central (``scripts/bench-jars``). S3A is pointed
at moto with path-style access, plain HTTP and the server's static keys. Both write Parquet,
Spark's default compression for the peer (snappy) and the sink's default (snappy too) as a user
would leave them; every run writes under a fresh prefix of the setup's bucket
(``target.options["bucket"]`` and ``["prefix"]``). The sink's objects are read back by the
setup; the peer's, by reading every Parquet object its metadata log lists.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from bench.spark_peers import Contest, Peer, bench_jars
from setups import S3Setup
from setups.servers.moto import MotoServer
from twophase.testing import Target


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


def spark_parquet(feed: DataFrame, target: Target, checkpoint: str) -> None:
    path = f"s3a://{target.options['bucket']}/{target.options['prefix']}"
    (feed.writeStream.format("parquet").option("path", path)
     .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
     .awaitTermination())


def start(spark: SparkSession, workdir: Path, stack: contextlib.ExitStack) -> Contest:
    setup = stack.enter_context(S3Setup.started(workdir))
    point_s3a_at(spark, setup.server)

    def listed(target: Target) -> list[int]:
        """The event ids of the Parquet files the peer's metadata log lists (compaction
        aside, this bench's few batches never compact)."""
        bucket, prefix = target.options["bucket"], target.options["prefix"]
        log = f"{prefix}/_spark_metadata/"
        ids: list[int] = []
        for page in setup.client.get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=log):
            for item in page.get("Contents", []):
                body = setup.client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
                for line in body.decode().splitlines()[1:]:  # line 0: the version
                    key = json.loads(line)["path"].split(f"{bucket}/", 1)[1]
                    data = setup.client.get_object(Bucket=bucket, Key=key)["Body"].read()
                    ids += pq.read_table(io.BytesIO(data), columns=["event_id"]).column(
                        "event_id").to_pylist()
        return ids

    return Contest(sink="S3Sink", peer_name="Spark Parquet sink (s3a)", setup=setup,
                   peer=spark_parquet, server_pid=setup.server.process.pid,
                   peer_visible=listed)


PEER = Peer(jars=jars, start=start)
