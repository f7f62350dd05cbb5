"""S3 (a private ``moto_server``): Parquet objects under a fresh prefix of one bucket per
target. moto keeps its objects in memory, so its "kill" would lose them, which no S3 does:
it fails by the network only."""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from setups.base import Proxy, ProxyFactory, SinkSetup, Target, relayed
from setups.servers.moto import MotoServer, private_server


def read_rows(body: bytes, key: str) -> list[dict[str, Any]]:
    """The rows of one object, read back by its format (from the key's suffix)."""
    if key.endswith(".gz"):
        body, key = gzip.decompress(body), key[:-3]
    if key.endswith(".parquet"):
        rows: list[dict[str, Any]] = pq.read_table(io.BytesIO(body)).to_pylist()
        return rows
    if key.endswith(".csv"):
        return list(csv.DictReader(io.StringIO(body.decode())))
    return [json.loads(line) for line in body.decode().splitlines()]


class S3Setup(SinkSetup):
    name = "s3"
    factory = "sinks.s3:S3Sink"

    def __init__(self, scratch: Path, server: MotoServer, bucket: str,
                 proxy: Proxy | None = None) -> None:
        super().__init__(scratch, proxy)
        self.server, self.bucket, self.client = server, bucket, server.client()
        #: Event ids per (key, ETag): the listing is read every time, an object's body once.
        self._read: dict[tuple[str, str], list[int]] = {}

    @classmethod
    @contextlib.contextmanager
    def started(cls, scratch: Path, proxy: ProxyFactory | None = None) -> Iterator[S3Setup]:
        with private_server(scratch / "moto") as server, \
                relayed(proxy, server.port) as relay:
            yield cls(scratch, server, server.new_bucket("orders"), relay)

    def target_options(self, **overrides: Any) -> dict[str, Any]:
        options = {**self.server.options(), "bucket": self.bucket,
                   "prefix": f"orders-{self.number()}", "format": "parquet", **overrides}
        if self.proxy is not None:
            options["endpoint_url"] = f"http://{self.proxy.address}"
        return options

    def visible(self, target: Target) -> list[int]:
        listing = self.client.list_objects_v2(Bucket=self.bucket,
                                              Prefix=f"{target.options['prefix']}/")
        return [event_id for item in listing.get("Contents", ())
                for event_id in self._event_ids(item["Key"], item["ETag"])]

    def in_doubt(self, target: Target) -> list[Any]:
        """The multipart uploads still open under the target's prefix."""
        listing = self.client.list_multipart_uploads(Bucket=self.bucket,
                                                     Prefix=f"{target.options['prefix']}/")
        return [upload["Key"] for upload in listing.get("Uploads", ())]

    def _event_ids(self, key: str, etag: str) -> list[int]:
        if (key, etag) not in self._read:
            body = self.client.get_object(Bucket=self.bucket, Key=key, IfMatch=etag)["Body"]
            self._read[(key, etag)] = [int(row["event_id"])
                                       for row in read_rows(body.read(), key)]
        return self._read[(key, etag)]
