"""Apache Kafka (a private KRaft broker): a fresh topic and transactional-id prefix per
target, read ``read_committed``. Behind a relay the broker advertises the relay, so every
client connection (the coordinator's markers too) crosses it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

from setups.base import Proxy, ProxyFactory, SinkSetup, Target
from setups.servers.kafka import KafkaBroker, TopicReader, private_broker
from setups.servers.local import free_port

HOST = "127.0.0.1"
#: Long enough that the broker never aborts a transaction a crash test leaves for recovery.
TRANSACTION_TIMEOUT_MS = 300_000


class KafkaSetup(SinkSetup):
    name = "kafka"
    factory = "sinks.kafka:KafkaSink"
    killable = True
    model_options: ClassVar[Mapping[str, Any]] = {"transaction_timeout_ms": 60_000,
                                                  "min_commit_window_ms": 0}

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
