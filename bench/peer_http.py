"""HttpSink (exactly once: payloads staged, then POSTed with an ``Idempotency-Key`` at commit)
against a plain at-least-once Python data source whose tasks POST their rows as JSON arrays of
the same size with a fresh key each (no staging, no proof), to the same reference receiver
(``python -m sinks.http.receiver``: bearer token and HMAC signature checked, every record stored
in its SQLite store, an fsync per request). Spark has no HTTP writer; this is the floor a user
would write by hand. Each run posts to a fresh URL path of the receiver (a target of
``setups.http``: ``target.options["url"]``), read back from its store; the sink as a user would
leave it (JSON, uncompressed, its default request size), staging under the setup's scratch.

    nice .venv/bin/python -m bench.spark_peers http [--files 4] [--rows-per-file 100000]
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import requests
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, WriterCommitMessage

from bench.spark_peers import Contest, Peer
from setups import HttpSetup
from sinks.http.protocol import IDEMPOTENCY_KEY, SIGNATURE, key_header
from sinks.http.signing import sign
from sinks.http.sink import DEFAULT_MAX_RECORDS_PER_REQUEST
from twophase.testing import Target

RECORDS_PER_REQUEST = DEFAULT_MAX_RECORDS_PER_REQUEST  # the sink's default request size
NAMES = ("event_id", "order_id", "status", "ts")


class PlainPost(DataSource):
    """At-least-once: each task POSTs its rows, ``RECORDS_PER_REQUEST`` per request."""

    @classmethod
    def name(cls) -> str:
        return "plain_http_post"

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        return PlainPostWriter(dict(self.options))


class PlainPostWriter(DataSourceStreamWriter):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        with requests.Session() as session:
            records: list[dict[str, Any]] = []
            for row in iterator:
                records.append(dict(zip(NAMES, row, strict=True)))
                if len(records) == RECORDS_PER_REQUEST:
                    self._post(session, records)
                    records = []
            if records:
                self._post(session, records)
        return WriterCommitMessage()

    def _post(self, session: requests.Session, records: list[dict[str, Any]]) -> None:
        body = json.dumps(records, default=str).encode()
        reply = session.post(self.options["url"], data=body, timeout=60, headers={
            "Content-Type": "application/json", IDEMPOTENCY_KEY: key_header(str(uuid.uuid4())),
            "Authorization": f"Bearer {self.options['token']}",
            SIGNATURE: sign(self.options["signing_secret"].encode(), body, time.time())})
        reply.raise_for_status()

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
        pass


def plain(feed: DataFrame, target: Target, checkpoint: str) -> None:
    options = {name: target.options[name] for name in ("url", "token", "signing_secret")}
    (feed.writeStream.format(PlainPost.name()).options(**options)
     .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
     .awaitTermination())


def start(spark: SparkSession, workdir: Path, stack: contextlib.ExitStack) -> Contest:
    spark.dataSource.register(PlainPost)
    setup = stack.enter_context(HttpSetup.started(workdir))
    assert setup.receiver.process is not None
    return Contest(sink="HttpSink", peer_name="plain POST (Python data source)", setup=setup,
                   peer=plain, server_pid=setup.receiver.process.pid,
                   overrides={"encoding": "json", "compression": None,
                              "max_records_per_request": RECORDS_PER_REQUEST})


PEER = Peer(jars=list, start=start)
