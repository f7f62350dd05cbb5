"""HTTP (the reference receiver, a separate process): a fresh URL path and staging directory
per target, judged by the receiver's store. The receiver holds nothing open between
requests (a request is stored or not), so nothing is in doubt on its side.

The secured variant (``started(..., tls_ca=...)``, or the ``http_secured`` receiver): HTTPS
with a certificate of the run's CA, verified by the sink (``ca_bundle=``), a bearer token and
a signing secret (the receiver's authorization: it refuses a request without both)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from setups.base import Proxy, ProxyFactory, SinkSetup, Target, relayed
from setups.servers.http_receiver import ReceiverProcess, new_path, secured, started
from setups.servers.moto import MotoServer
from setups.servers.tls import CertificateAuthority
from twophase.kit.s3 import S3_OPTIONS

#: Small requests, so that a partition's slice is several requests with a key each.
RECORDS_PER_REQUEST = 30


def s3_staging(moto: MotoServer, bucket: str, prefix: str = "staging") -> dict[str, Any]:
    """The sink options of a staging under ``s3a://bucket/prefix`` on ``moto``."""
    return {"staging": f"s3a://{bucket}/{prefix}",
            "staging_options": {k: v for k, v in moto.options().items() if k in S3_OPTIONS}}


class HttpSetup(SinkSetup):
    name = "http"
    factory = "sinks.http:HttpSink"
    killable = True
    model_ci_examples = 12
    servers = ("http_receiver",)

    def __init__(self, scratch: Path, receiver: ReceiverProcess, proxy: Proxy | None = None
                 ) -> None:
        super().__init__(scratch, proxy)
        self.receiver = receiver

    @classmethod
    @contextlib.contextmanager
    def started(cls, scratch: Path, proxy: ProxyFactory | None = None, *,
                tls_ca: CertificateAuthority | None = None) -> Iterator[HttpSetup]:
        workdir = scratch / "receiver"
        with (secured(workdir, tls_ca) if tls_ca is not None else started(workdir)
              ) as receiver, relayed(proxy, receiver.port) as relay:
            yield cls(scratch, receiver, relay)

    @classmethod
    @contextlib.contextmanager
    def over(cls, scratch: Path, servers: Mapping[str, Any]) -> Iterator[HttpSetup]:
        yield cls(scratch, servers["http_receiver"])

    def target_options(self, **overrides: Any) -> dict[str, Any]:
        path = new_path()
        options = {**self.receiver.sink_options(path),
                   "staging": str(self.scratch / f"staging-{self.number()}"),
                   "encoding": "jsonl", "compression": "gzip",
                   "max_records_per_request": RECORDS_PER_REQUEST, **overrides}
        if self.proxy is not None:
            scheme = "https" if self.receiver.certfile else "http"
            options["url"] = f"{scheme}://{self.proxy.address}{path}"
        return options

    def visible(self, target: Target) -> list[int]:
        return self.receiver.event_ids(urlsplit(target.options["url"]).path)

    def kill_server(self) -> None:
        self.receiver.kill()

    def start_server(self) -> None:
        process = self.receiver.process
        if process is None or process.poll() is not None:
            self.receiver.start()
