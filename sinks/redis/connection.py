"""How the sink reaches Redis: :class:`RedisSettings`, one redis-py client per process.

The sink holds only settings (pickled to the executors); the client (:class:`redis.Redis`, or
:class:`redis.cluster.RedisCluster` with ``cluster=True``) is made where it is used, once per
process and settings, and shared by the threads of the driver's commit (redis-py's clients are
thread-safe: each command borrows a connection from the client's pool). The client never
retries a command by itself: a staged chunk sent twice would be staged twice (twophase retries
whole steps, each idempotent). Every call goes
through :meth:`RedisSettings.run`: the server's errors classified
(:mod:`~sinks.redis.errors`), and a login the server refuses after the password's ``Secret``
changed (a rotation) tried once more with a client made with the new one
(:class:`twophase.kit.ClientCache`). The password is read when a client is made, never kept in
the settings' ``repr`` or logged.

**TLS** (:class:`twophase.kit.Tls`): ``tls="verify"`` (the default) checks the server's
certificate against ``ca_bundle`` (else the system's CAs) and the host name; ``"require"``
encrypts without checking; ``"off"`` is plain text. ``client_cert``/``client_key`` for a
server with ``tls-auth-clients yes``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from sinks.redis.errors import ERRORS_CAUGHT, classify, is_refused_login
from twophase import TwoPhaseError
from twophase.kit import ClientCache, SecretOption, Tls, classified, reveal, scrubbed

log = logging.getLogger(__name__)

T = TypeVar("T")
Client = redis.Redis | RedisCluster

DEFAULT_PORT = 6379
DEFAULT_CONNECT_TIMEOUT_S = 10.0
#: A reply's timeout: above the longest commit script (a budget's rows, well under a second).
DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class RedisSettings:
    """Where and how to connect (the password a reference or clear text, never shown)."""

    host: str
    port: int = DEFAULT_PORT
    db: int = 0
    username: str | None = None
    password: SecretOption | None = field(default=None, repr=False)
    cluster: bool = False
    tls: Tls = field(default_factory=Tls)
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def address(self) -> str:
        scheme = "rediss" if self.tls.encrypts else "redis"
        return f"{scheme}://{self.host}:{self.port}" + ("" if self.cluster else f"/{self.db}")

    def client_options(self) -> dict[str, Any]:
        """redis-py's keyword arguments for these settings (the password read now)."""
        options: dict[str, Any] = {
            "host": self.host, "port": self.port, "username": self.username,
            "password": reveal(self.password), "socket_timeout": self.timeout_s,
            "socket_connect_timeout": self.connect_timeout_s, "protocol": 2,
            "retry": Retry(NoBackoff(), 0)}
        if not self.cluster:
            options["db"] = self.db
        if self.tls.encrypts:
            options.update(ssl=True, ssl_cert_reqs="required" if self.tls.verifies else "none",
                           ssl_check_hostname=self.tls.verifies,
                           ssl_ca_certs=self.tls.ca_bundle, ssl_certfile=self.tls.client_cert,
                           ssl_keyfile=self.tls.client_key or None)
        return options

    def make_client(self) -> Client:
        options = self.client_options()
        if self.cluster:
            return RedisCluster(**options)
        return redis.Redis(**options)

    def run(self, step: Callable[[Client], T], what: str) -> T:
        """``step(client)`` with this process's client, the server's errors classified."""
        def attempt() -> T:
            with classified(self.classify, what, ERRORS_CAUGHT):
                return step(_CLIENTS.get(self))
        return _CLIENTS.retried_if_rotated(self, attempt, is_refused_login, what=what)

    def classify(self, exc: BaseException, what: str) -> TwoPhaseError:
        """The sink's classifier, its errors scrubbed of the password (read only when an
        error is classified, not at every step: a step is as small as one staged chunk)."""
        return scrubbed(classify, reveal(self.password))(exc, what)


def text(value: bytes | str) -> str:
    """A reply's bytes as text (the client does not decode replies: staged chunks are binary)."""
    return value.decode() if isinstance(value, bytes) else value


def _close(client: Client) -> None:
    client.close()


_CLIENTS: ClientCache[RedisSettings, Client] = ClientCache(
    RedisSettings.make_client, lambda settings: (settings.password,), _close)
