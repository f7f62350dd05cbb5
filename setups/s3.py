"""S3 (a private ``moto_server``): Parquet objects under a fresh prefix of one bucket per
target. moto keeps its objects in memory, so its "kill" would lose them, which no S3 does:
it fails by the network only.

The secured variant (:meth:`S3Setup.secured`, or ``started(..., tls_ca=...)``): moto over
HTTPS with a certificate of the run's CA, verified by the sink (``ca_bundle=``), checking
credentials and IAM policies; each target's sink runs as a user of its own holding exactly
the least-privilege policy of its prefix (:func:`sinks.s3.errors.iam_policy`)."""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from setups.base import Proxy, ProxyFactory, SinkSetup, Target, relayed
from setups.servers.moto import MotoServer, private_server
from setups.servers.tls import CertificateAuthority
from sinks.s3.errors import iam_policy

#: moto authorizes HeadBucket as s3:HeadBucket, where AWS asks for s3:ListBucket: the one
#: action a moto user needs beyond the README's policy.
MOTO_HEAD_BUCKET = "s3:HeadBucket"


def moto_policy(bucket: str, prefix: str) -> dict[str, Any]:
    """The README's least-privilege policy of a sink on ``prefix``, as moto names HeadBucket."""
    policy = iam_policy(bucket, prefix)
    policy["Statement"][0]["Action"].append(MOTO_HEAD_BUCKET)
    return policy


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
    model_ci_examples = 5
    servers = ("moto_server", "s3_bucket")

    def __init__(self, scratch: Path, server: MotoServer, bucket: str,
                 proxy: Proxy | None = None, *, least_privilege: bool = False) -> None:
        super().__init__(scratch, proxy)
        self.server, self.bucket, self.client = server, bucket, server.client()
        #: Each target's sink runs as a user holding exactly its prefix's policy.
        self.least_privilege = least_privilege
        #: Event ids per (key, ETag): the listing is read every time, an object's body once.
        self._read: dict[tuple[str, str], list[int]] = {}

    @classmethod
    def secured(cls, scratch: Path, server: MotoServer, bucket: str) -> S3Setup:
        """Over a server that serves HTTPS and checks IAM policies (``moto_secured``)."""
        if server.ca_bundle is None:
            raise ValueError("the secured S3 setup needs a moto_server over HTTPS")
        return cls(scratch, server, bucket, least_privilege=True)

    @classmethod
    @contextlib.contextmanager
    def started(cls, scratch: Path, proxy: ProxyFactory | None = None, *,
                tls_ca: CertificateAuthority | None = None) -> Iterator[S3Setup]:
        """A private server; the secured variant with ``tls_ca`` (see the module docstring)."""
        secured = tls_ca is not None
        with private_server(scratch / "moto", checks_credentials=secured, ca=tls_ca,
                            tls=tls_ca.issue("moto") if tls_ca is not None else None
                            ) as server, \
                relayed(proxy, server.port) as relay:
            yield cls(scratch, server, server.new_bucket("orders"), relay,
                      least_privilege=secured)

    @classmethod
    @contextlib.contextmanager
    def over(cls, scratch: Path, servers: Mapping[str, Any]) -> Iterator[S3Setup]:
        yield cls(scratch, servers["moto_server"], servers["s3_bucket"])

    def target_options(self, **overrides: Any) -> dict[str, Any]:
        number = self.number()
        prefix = f"orders-{number}"
        options = {**self.server.options(), "bucket": self.bucket, "prefix": prefix,
                   "format": "parquet", **overrides}
        if self.least_privilege:
            options["access_key_id"], options["secret_access_key"] = \
                self.server.add_user_with_policy(f"sink-{self.bucket}-{number}",
                                                 moto_policy(self.bucket, options["prefix"]))
        if self.proxy is not None:
            scheme = "https" if self.server.ca_bundle else "http"
            options["endpoint_url"] = f"{scheme}://{self.proxy.address}"
        return options

    def visible(self, target: Target) -> list[int]:
        return [event_id for item in self._listed("list_objects_v2", "Contents", target)
                for event_id in self._event_ids(item["Key"], item["ETag"])]

    def in_doubt(self, target: Target) -> list[Any]:
        """The multipart uploads still open under the target's prefix."""
        return [upload["Key"]
                for upload in self._listed("list_multipart_uploads", "Uploads", target)]

    def _listed(self, operation: str, field: str, target: Target) -> Iterator[dict[str, Any]]:
        """Every item of ``operation``'s listing under the target's prefix, page after page
        (a page holds at most 1,000)."""
        pages = self.client.get_paginator(operation).paginate(
            Bucket=self.bucket, Prefix=f"{target.options['prefix']}/")
        for page in pages:
            yield from page.get(field, ())

    def _event_ids(self, key: str, etag: str) -> list[int]:
        if (key, etag) not in self._read:
            body = self.client.get_object(Bucket=self.bucket, Key=key, IfMatch=etag)["Body"]
            self._read[(key, etag)] = [int(row["event_id"])
                                       for row in read_rows(body.read(), key)]
        return self._read[(key, etag)]
