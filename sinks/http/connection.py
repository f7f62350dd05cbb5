"""Where the requests go and how: :class:`HttpSettings`, and one pooled session per process.

The session (``requests.Session`` with a connection pool as large as the driver's commit
parallelism) is made on first use in a process, shared by every committer and thread there,
and never pickled: the sink holds only the settings. The bearer token, the signing secret and
the extra headers stay out of ``repr``, messages and logs; the token and the signing secret
may be :class:`~twophase.Secret` references, revealed for each request as it is built.

TLS (:class:`twophase.kit.Tls`, every prebuilt sink's options): requests verifies the
receiver's certificate and host name by default (``tls="verify"``; certifi's CAs, or
``REQUESTS_CA_BUNDLE``); ``ca_bundle=`` names a private CA's file, and only ``tls="require"``
turns the check off; ``client_cert``/``client_key`` present a client certificate.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests
from requests.adapters import HTTPAdapter

from sinks.http.errors import SYSTEM
from sinks.http.protocol import SIGNATURE
from sinks.http.signing import sign
from twophase.kit import DEFAULT_COMMIT_PARALLELISM, SecretOption, Tls, reveal

DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_READ_TIMEOUT_S = 60.0
POOL_SIZE = 2 * DEFAULT_COMMIT_PARALLELISM
METHODS = ("POST", "PUT")

_sessions: dict[int, requests.Session] = {}
_sessions_lock = threading.Lock()


def session() -> requests.Session:
    """This process's pooled session (made on first use; requests retry nothing by itself)."""
    with _sessions_lock:
        current = _sessions.get(os.getpid())
        if current is None:
            current = _sessions[os.getpid()] = requests.Session()
            adapter = HTTPAdapter(pool_connections=POOL_SIZE, pool_maxsize=POOL_SIZE,
                                  max_retries=0)
            current.mount("http://", adapter)
            current.mount("https://", adapter)
        return current


@dataclass(frozen=True)
class HttpSettings:
    """The receiver's URL and method, authentication, TLS and timeouts."""

    url: str
    method: str = "POST"
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    token: SecretOption | None = field(default=None, repr=False)
    signing_secret: SecretOption | None = field(default=None, repr=False)
    tls: Tls = field(default_factory=lambda: Tls(system=SYSTEM))
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S

    @property
    def where(self) -> str:
        """The URL without credentials or query, as messages name it."""
        parts = urlsplit(self.url)
        host = parts.netloc.rpartition("@")[2]
        return urlunsplit((parts.scheme, host, parts.path, "", ""))

    def where_of(self, path: str) -> str:
        """Another ``path`` on the receiver, as messages name it."""
        parts = urlsplit(self.where)
        return urlunsplit((parts.scheme, parts.netloc, path, "", ""))

    @property
    def path(self) -> str:
        """The path and query the receiver fingerprints."""
        parts = urlsplit(self.url)
        return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    @property
    def tls_options(self) -> dict[str, Any]:
        """requests' ``verify=`` and ``cert=`` of :attr:`tls`."""
        verify: bool | str = (self.tls.ca_bundle or True) if self.tls.verifies else False
        cert = self.tls.client_cert if self.tls.client_key is None \
            else (self.tls.client_cert, self.tls.client_key)
        return {"verify": verify, "cert": cert}

    @property
    def timeout(self) -> tuple[float, float]:
        return self.connect_timeout_s, self.read_timeout_s

    def request_headers(self, body: bytes, content: Mapping[str, str]) -> dict[str, str]:
        """The configured headers, the content headers, the token and a fresh signature."""
        headers = {**dict(self.headers), **content}
        token, signing_secret = reveal(self.token), reveal(self.signing_secret)
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if signing_secret:
            headers[SIGNATURE] = sign(signing_secret.encode(), body, time.time())
        return headers
