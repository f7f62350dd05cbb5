"""RedisStreamSink (exactly once: staged, then one commit script per batch) against what a
user writes without it: ``foreachBatch`` whose tasks ``XADD`` their rows through a redis-py
pipeline (at least once: a replayed batch is added again), into fresh streams of one private
durable redis-server (``setups.redis``: AOF with ``appendfsync always``, as the sink demands).
No Spark connector exists for Spark 4 (``spark-redis`` stops at 3.0.0 for Scala 2.12).

    nice .venv/bin/python -m bench.spark_peers redis [--files 4] [--rows-per-file 100000]

* twophase: ``twophase.spark.write_stream(feed, RedisStreamSink(stream, ...))``: each row an
  entry, its columns the fields as text (column-wise from Arrow), a 10,000-row chunk staged
  per ``XADD``, one script per batch;
* peer: ``foreachBatch`` -> ``foreachPartition``: one pipelined ``XADD`` per row, executed
  every :data:`PIPELINE_ROWS` rows, values as ``str()``.

A stream's entries are read back by ``redis-cli`` (``event_id`` of each). The redis-server
process is the "server" CPU column.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from pathlib import Path

import redis
from pyspark.sql import DataFrame, Row, SparkSession

from bench.spark_peers import Contest, Peer
from setups import RedisSetup
from twophase.testing import Target

#: Rows per pipeline round trip of the peer (redis-py's examples batch about so many).
PIPELINE_ROWS = 1000


def xadd_partition(host: str, port: int, stream: str) -> Callable[[Iterable[Row]], None]:
    """A task's writer: its rows XADDed through one pipeline, PIPELINE_ROWS at a time."""
    def write(rows: Iterable[Row]) -> None:
        client = redis.Redis(host=host, port=port)
        pipe = client.pipeline(transaction=False)
        for count, row in enumerate(rows, start=1):
            pipe.xadd(stream, {name: str(value) for name, value in row.asDict().items()
                               if value is not None})
            if count % PIPELINE_ROWS == 0:
                pipe.execute()
        pipe.execute()
        client.close()
    return write


def foreach_batch_xadd(feed: DataFrame, target: Target, checkpoint: str) -> None:
    write = xadd_partition(target.options["host"], target.options["port"],
                           target.options["stream"])

    def each_batch(batch: DataFrame, _batch_id: int) -> None:
        batch.foreachPartition(write)

    (feed.writeStream.foreachBatch(each_batch).option("checkpointLocation", checkpoint)
     .trigger(availableNow=True).start().awaitTermination())


def start(_spark: SparkSession, workdir: Path, stack: contextlib.ExitStack) -> Contest:
    setup = stack.enter_context(RedisSetup.started(workdir))
    return Contest(sink="RedisStreamSink",
                   peer_name="foreachBatch + redis-py pipelined XADD (at least once)",
                   setup=setup, peer=foreach_batch_xadd, server_pid=setup.server.pid)


PEER = Peer(jars=list, start=start)
