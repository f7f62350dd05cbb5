"""How the sink reaches the cluster: :class:`KafkaSettings`, kafka-python and librdkafka clients.

The sink holds only settings (they are pickled to executors); clients are made where they are
used. The driver's admin client (EndTxn, listing, describing) is made at most once per process
and settings: kafka-python's admin client is safe to call from several threads. Security options
(TLS, SASL) pass through unchanged; ``repr`` never shows the password, and nothing logs it:
kafka-python's admin client logs its whole configuration at DEBUG, so that one record is
dropped (:class:`_HideClientConfigs`). TLS verifies the broker's certificate and host name
unless told otherwise. The executor's producer is librdkafka's (:mod:`~sinks.kafka.producer`):
:meth:`KafkaSettings.librdkafka_configs` translates the same settings to its property names.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer

DEFAULT_REQUEST_TIMEOUT_MS = 30_000
#: How long a client tries to reach the cluster at all before it gives up.
DEFAULT_CONNECT_TIMEOUT_MS = 30_000
#: How long a producer waits for metadata (a topic, the cluster) before it gives up.
DEFAULT_MAX_BLOCK_MS = 30_000

_admins: dict[tuple[Any, ...], KafkaAdminClient] = {}
_admins_lock = threading.Lock()


class _HideClientConfigs(logging.Filter):
    """Drops kafka-python's DEBUG record of a client's configuration (it holds passwords)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Starting KafkaAdminClient with configuration")


logging.getLogger("kafka.admin.client").addFilter(_HideClientConfigs())


@dataclass(frozen=True)
class KafkaSettings:
    """Bootstrap servers, security (password hidden from ``repr``), client id and timeouts.

    ``extra`` is passed to every kafka-python client as is (e.g. ``{"api_version_auto_timeout_ms":
    5000}``); it must not hold secrets, since it is shown by ``repr``.
    """

    bootstrap_servers: str
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = field(default=None, repr=False)
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: str | None = field(default=None, repr=False)
    ssl_check_hostname: bool = True
    client_id: str = "twophase"
    request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS
    connect_timeout_ms: int = DEFAULT_CONNECT_TIMEOUT_MS
    max_block_ms: int = DEFAULT_MAX_BLOCK_MS
    extra: tuple[tuple[str, Any], ...] = ()

    @property
    def where(self) -> str:
        """The cluster, as error messages name it."""
        return f"Kafka at {self.bootstrap_servers}"

    def client_configs(self) -> dict[str, Any]:
        """The options every kafka-python client takes (None values left to its defaults)."""
        configs: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers.split(","),
            "security_protocol": self.security_protocol,
            "sasl_mechanism": self.sasl_mechanism,
            "sasl_plain_username": self.sasl_plain_username,
            "sasl_plain_password": self.sasl_plain_password,
            "ssl_cafile": self.ssl_cafile,
            "ssl_certfile": self.ssl_certfile,
            "ssl_keyfile": self.ssl_keyfile,
            "ssl_password": self.ssl_password,
            "ssl_check_hostname": self.ssl_check_hostname,
            "client_id": self.client_id,
            "request_timeout_ms": self.request_timeout_ms,
            "bootstrap_timeout_ms": self.connect_timeout_ms,
        }
        return {key: value for key, value in configs.items() if value is not None} | dict(
            self.extra)

    def librdkafka_configs(self) -> dict[str, Any]:
        """The same settings as librdkafka properties (``extra`` is kafka-python's only)."""
        configs: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol.lower(),
            "sasl.mechanism": self.sasl_mechanism,
            "sasl.username": self.sasl_plain_username,
            "sasl.password": self.sasl_plain_password,
            "ssl.ca.location": self.ssl_cafile,
            "ssl.certificate.location": self.ssl_certfile,
            "ssl.key.location": self.ssl_keyfile,
            "ssl.key.password": self.ssl_password,
            "ssl.endpoint.identification.algorithm": "https" if self.ssl_check_hostname
            else "none",
            "client.id": self.client_id,
            "socket.timeout.ms": self.request_timeout_ms,
            "socket.connection.setup.timeout.ms": self.connect_timeout_ms,
            "topic.metadata.propagation.max.ms": self.max_block_ms,
        }
        return {key: value for key, value in configs.items() if value is not None}

    def consumer(self, **configs: Any) -> KafkaConsumer:
        return KafkaConsumer(**self.client_configs(), enable_auto_commit=False, **configs)

    def new_admin(self) -> KafkaAdminClient:
        return KafkaAdminClient(**self.client_configs())

    def admin(self) -> KafkaAdminClient:
        """This process's admin client for these settings (made on first use, kept)."""
        key = (os.getpid(), self)
        with _admins_lock:
            admin = _admins.get(key)
            if admin is None:
                admin = _admins[key] = self.new_admin()
            return admin

    def forget_admin(self) -> None:
        """Drop this process's admin client (after a connection failure), closing it."""
        with _admins_lock:
            admin = _admins.pop((os.getpid(), self), None)
        if admin is not None:
            admin.close()
