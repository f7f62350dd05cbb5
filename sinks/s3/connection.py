"""Where the objects go and how the sink reaches them: :class:`S3Settings`, and boto3 clients.

A client is made lazily, at most one per process, connection and attempt count (boto3 clients
are thread-safe; one serves every bucket of its endpoint and credentials), and never pickled:
the sink holds only the settings. Every client of a process comes from one boto3 session, so
botocore parses S3's service model once, not once per client. Credentials come from the options
or from boto3's own chain; ``repr`` never shows them, and nothing logs them.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import boto3
from botocore.config import Config

Checksums = Literal["when_required", "when_supported"]

DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_READ_TIMEOUT_S = 120.0
#: boto3's own attempts on executors (uploads); the driver's committer makes one attempt and
#: leaves retrying to twophase, which knows which errors it may retry.
DEFAULT_MAX_ATTEMPTS = 3
MAX_POOL_CONNECTIONS = 32

_clients: dict[tuple[Any, ...], Any] = {}
_sessions: dict[int, boto3.session.Session] = {}
_clients_lock = threading.Lock()


@dataclass(frozen=True)
class S3Settings:
    """Bucket, endpoint, addressing, region and credentials (hidden from ``repr``)."""

    bucket: str
    endpoint_url: str | None = None
    region: str | None = None
    path_style: bool = False
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    checksums: Checksums = "when_required"
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S

    @property
    def where(self) -> str:
        """The bucket and endpoint, as error messages name them."""
        return f"s3://{self.bucket}" + (f" at {self.endpoint_url}" if self.endpoint_url else "")

    def client(self, *, max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> Any:
        """This process's client for this endpoint and these credentials (made on first use)."""
        key = (os.getpid(), self._connection(), max_attempts)
        with _clients_lock:
            client = _clients.get(key)
            if client is None:
                client = _clients[key] = self._new_client(max_attempts)
            return client

    def _connection(self) -> S3Settings:
        """These settings without the bucket: what a client depends on."""
        return replace(self, bucket="")

    def _new_client(self, max_attempts: int) -> Any:
        config = Config(
            s3={"addressing_style": "path" if self.path_style else "auto"},
            retries={"max_attempts": max_attempts, "mode": "standard"},
            request_checksum_calculation=self.checksums,
            response_checksum_validation="when_required",
            connect_timeout=self.connect_timeout_s,
            read_timeout=self.read_timeout_s,
            max_pool_connections=MAX_POOL_CONNECTIONS,
        )
        return _session().client(
            "s3", endpoint_url=self.endpoint_url, region_name=self.region,
            aws_access_key_id=self.access_key_id, aws_secret_access_key=self.secret_access_key,
            aws_session_token=self.session_token, config=config)


def _session() -> boto3.session.Session:
    """This process's boto3 session (call with ``_clients_lock`` held: sessions are not
    thread-safe)."""
    session = _sessions.get(os.getpid())
    if session is None:
        session = _sessions[os.getpid()] = boto3.session.Session()
    return session
