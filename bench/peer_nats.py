"""JetStreamSink (exactly once: staged in a stream of its own, then republished as one
compare-and-set chain per batch at commit) against a plain at-least-once Python data source
whose tasks publish each row straight into the subject with nats-py's ``publish_async`` and
await the acks (no staging, no chain, no proof: a replayed batch is published again). Spark has
no NATS writer; this is what a user would write by hand. Both write the row as the same JSON
object into a fresh stream and subject of one private nats-server (``setups.nats`` over
``setups.servers.nats``, the sink owning the stream: its pipelined chain), read back by the
setup's own consumer; the server is the "server" CPU column.

    nice .venv/bin/python -m bench.spark_peers nats [--files 4] [--rows-per-file 100000]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, WriterCommitMessage

from bench.spark_peers import Contest, Peer
from setups import NatsSetup
from twophase.testing import Target

NAMES = ("event_id", "order_id", "status", "ts")
#: Publishes in flight per task before their acks are awaited (the sink stages with the same).
ACKS_IN_FLIGHT = 1000


class PlainPublish(DataSource):
    """At least once: each task publishes its rows to the subject, acks awaited."""

    @classmethod
    def name(cls) -> str:
        return "plain_nats_publish"

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        return PlainPublishWriter(dict(self.options))


class PlainPublishWriter(DataSourceStreamWriter):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        asyncio.run(self._publish(iterator))
        return WriterCommitMessage()

    async def _publish(self, rows: Iterator[Any]) -> None:
        client = await nats.connect(self.options["servers"])
        try:
            js, pending = client.jetstream(), []
            for row in rows:
                record = dict(zip(NAMES, row, strict=True))
                payload = json.dumps(record, default=str, separators=(",", ":")).encode()
                pending.append(await js.publish_async(self.options["subject"], payload))
                if len(pending) == ACKS_IN_FLIGHT:
                    await asyncio.gather(*pending)
                    pending = []
            await asyncio.gather(*pending)
        finally:
            await client.close()

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
        pass


def plain(feed: DataFrame, target: Target, checkpoint: str) -> None:
    options = {name: target.options[name] for name in ("servers", "subject")}
    (feed.writeStream.format(PlainPublish.name()).options(**options)
     .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
     .awaitTermination())


def start(spark: SparkSession, workdir: Path, stack: contextlib.ExitStack) -> Contest:
    spark.dataSource.register(PlainPublish)
    setup = stack.enter_context(NatsSetup.started(workdir))
    return Contest(sink="JetStreamSink", peer_name="plain publish_async (Python data source)",
                   setup=setup, peer=plain, server_pid=setup.server.pid)


PEER = Peer(jars=list, start=start)
