"""Apache Kafka (a private KRaft broker): a fresh topic and transactional-id prefix per
target, read ``read_committed``. Behind a relay the broker advertises the relay, so every
client connection (the coordinator's markers too) crosses it.

:class:`SecuredKafkaSetup` is the same over a secured broker (SASL_SSL with SCRAM-SHA-512, a
certificate of the run's CA, ACLs enforced): the sink connects as a user holding exactly the
ACLs :mod:`sinks.kafka.access` lists for the target, verifies the certificate and host name,
and reads its password by reference (:func:`sink_with_password_file`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

from setups.base import Proxy, ProxyFactory, SinkSetup, Target
from setups.servers.kafka import (
    APP_USER,
    BrokerSecurity,
    KafkaBroker,
    TopicReader,
    private_broker,
)
from setups.servers.local import free_port
from setups.servers.tls import CertificateAuthority
from sinks.kafka import KafkaSink
from sinks.kafka.access import grants
from twophase import Secret

HOST = "127.0.0.1"
#: Long enough that the broker never aborts a transaction a crash test leaves for recovery.
TRANSACTION_TIMEOUT_MS = 300_000


def sink_with_password_file(*, sasl_password_file: str, **options: Any) -> KafkaSink:
    """A KafkaSink whose SASL password is ``Secret(file=sasl_password_file)`` (a driver spec
    is JSON: it names the file, and the sink reveals it where it connects)."""
    return KafkaSink(**options, sasl_plain_password=Secret(file=sasl_password_file))


class KafkaSetup(SinkSetup):
    name = "kafka"
    factory = "sinks.kafka:KafkaSink"
    killable = True
    model_options: ClassVar[Mapping[str, Any]] = {"transaction_timeout_ms": 60_000,
                                                  "min_commit_window_ms": 0}
    #: A broker round trip per step of the model: its slowest sink.
    model_ci_examples = 3
    servers = ("kafka_broker",)

    def __init__(self, scratch: Path, broker: KafkaBroker, reader: TopicReader | None = None,
                 proxy: Proxy | None = None) -> None:
        super().__init__(scratch, proxy)
        self.broker, self.reader = broker, reader

    @classmethod
    @contextlib.contextmanager
    def started(cls, scratch: Path, proxy: ProxyFactory | None = None) -> Iterator[KafkaSetup]:
        with contextlib.ExitStack() as stack:
            if proxy is None:
                relay, broker = None, stack.enter_context(private_broker(scratch / "kafka"))
            else:
                port = free_port(HOST)
                relay = stack.enter_context(proxy(port))
                broker = stack.enter_context(private_broker(
                    scratch / "kafka", {"advertised.listeners": f"PLAINTEXT://{relay.address}"},
                    port=port))
            yield cls(scratch, broker, stack.enter_context(broker.reader()), relay)

    @classmethod
    @contextlib.contextmanager
    def over(cls, scratch: Path, servers: Mapping[str, Any]) -> Iterator[KafkaSetup]:
        broker = servers["kafka_broker"]
        with broker.reader() as reader:
            yield cls(scratch, broker, reader)

    def target_options(self, **overrides: Any) -> dict[str, Any]:
        topic = self.broker.new_topic("orders")
        return {**self.broker.options(), "topic": topic, "key": "order_id",
                "transactional_id_prefix": f"{topic}-",
                "transaction_timeout_ms": TRANSACTION_TIMEOUT_MS, **overrides}

    def visible(self, target: Target) -> list[int]:
        topic = target.options["topic"]
        return (self.reader.event_ids(topic) if self.reader is not None
                else self.broker.event_ids(topic))

    def in_doubt(self, target: Target) -> list[Any]:
        """The open transactions of the target's id prefix that hold rows of its topic.

        Others may be left: a driver killed after it began a transaction and before it
        registered it (so before any row); the broker aborts those at their timeout."""
        topic = target.options["topic"]
        left = self.broker.open_transactions(target.options["transactional_id_prefix"])
        return sorted(tid for tid, topics in left.items() if topic in topics)

    def kill_server(self) -> None:
        self.broker.kill()

    def start_server(self) -> None:
        if self.broker.process is None or self.broker.process.poll() is not None:
            self.broker.start()


class SecuredKafkaSetup(KafkaSetup):
    """The secured broker (:class:`~setups.servers.kafka.BrokerSecurity`); each target's topic,
    id prefix and registry topic granted to the sink's user, and nothing else."""

    name = "kafka-secured"
    factory = "setups.kafka:sink_with_password_file"

    def __init__(self, scratch: Path, broker: KafkaBroker, reader: TopicReader | None = None,
                 proxy: Proxy | None = None) -> None:
        if broker.security is None:
            raise ValueError("SecuredKafkaSetup needs a broker started with security=")
        super().__init__(scratch, broker, reader, proxy)
        scratch.mkdir(parents=True, exist_ok=True)
        self.password_file = broker.security.write_password(
            APP_USER, scratch / f"kafka-{APP_USER}.password")

    @classmethod
    @contextlib.contextmanager
    def started(cls, scratch: Path, proxy: ProxyFactory | None = None
                ) -> Iterator[SecuredKafkaSetup]:
        if proxy is not None:
            raise NotImplementedError("a relay would need a certificate for its own address")
        security = BrokerSecurity.issued(CertificateAuthority(scratch / "ca"),
                                         CertificateAuthority(scratch / "other-ca", "other CA"))
        with private_broker(scratch / "kafka", security=security) as broker, \
                broker.reader() as reader:
            yield cls(scratch, broker, reader)

    def target_options(self, **overrides: Any) -> dict[str, Any]:
        options = super().target_options(**overrides)
        options["registry_topic"] = options.get("registry_topic",
                                                f"{options['topic']}-registry")
        self.broker.grant(grant.acl(f"User:{APP_USER}") for grant in grants(
            [options["topic"]], options["transactional_id_prefix"], options["registry_topic"],
            create_registry=True))
        del options["sasl_plain_password"]
        return {**options, "sasl_password_file": str(self.password_file)}
