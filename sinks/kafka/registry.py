"""The registry: which twophase transaction each (transactional id, producer id, epoch) carries.

A pooled transactional id says nothing about the batch it serves, but the driver's recovery
(:meth:`~sinks.kafka.committer.KafkaCommitter.list_in_doubt` and ``is_orphan``) must judge an open
transaction by its twophase :class:`~twophase.TxnId`. So every transaction first writes, as
its own first record, ``key = transactional id``, ``value = {txn, producer id, epoch,
deadline}`` into a small compacted topic (one partition), and flushes it before any data
record. Being part of the transaction, it is committed or aborted with the data; the registry
is read with ``isolation.level=read_uncommitted`` so open transactions are seen too, and an
entry counts only where its producer id and epoch match what the coordinator describes (an
aborted attempt's entry is stale, and says so by its epoch).

Why a topic and not record headers: the driver would have to read each open transaction's
first data record (by ``describe_producers`` start offsets) on every sweep. Compaction keeps
the registry at about one record per pooled id (``segment.ms`` of an hour); the driver reads
it once per sweep, a task once per transaction (incrementally, in a reused worker).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError
from kafka.structs import TopicPartition

from sinks.kafka.connection import KafkaSettings
from sinks.kafka.errors import refused_credentials
from twophase import TxnId
from twophase.kit import ClientCache

log = logging.getLogger(__name__)

DEFAULT_REGISTRY_TOPIC = "twophase-kafka-transactions"
REGISTRY_PARTITION = 0
#: Compaction settings: roll hourly so old entries of a pooled id are cleaned away.
REGISTRY_CONFIGS = {"cleanup.policy": "compact", "segment.ms": "3600000",
                    "min.cleanable.dirty.ratio": "0.1"}
#: One wait for the next fetch while catching up to the end offset. Short: when the last
#: thing to read is a transaction marker (after every commit), a poll returns no record and
#: waits out its whole timeout, though the position has reached the end.
POLL_MS = 5
READ_TIMEOUT_S = 60.0

@dataclass(frozen=True)
class Entry:
    """One registration: the transaction that ``producer_id``/``epoch`` opened."""

    txn: TxnId
    producer_id: int
    epoch: int
    deadline_ms: int

    def value(self) -> bytes:
        return json.dumps({"txn": str(self.txn), "producer_id": self.producer_id,
                           "epoch": self.epoch, "deadline_ms": self.deadline_ms},
                          separators=(",", ":")).encode()

    @classmethod
    def parse(cls, value: bytes) -> Entry:
        fields = json.loads(value)
        return cls(TxnId.parse(fields["txn"]), int(fields["producer_id"]),
                   int(fields["epoch"]), int(fields["deadline_ms"]))


def ensure_topic(admin: KafkaAdminClient, topic: str, replication: int,
                 configs: Mapping[str, str] = REGISTRY_CONFIGS) -> bool:
    """Create the registry topic if it is missing (one partition, ``configs``); True if it
    was created."""
    if topic in admin.list_topics():
        return False
    try:
        admin.create_topics([NewTopic(topic, 1, replication, topic_configs=dict(configs))])
    except TopicAlreadyExistsError:
        return False
    log.info("created the twophase registry topic %s", topic)
    return True


class _View:
    """This process's read of the registry: a consumer kept at the end, and the last entries."""

    def __init__(self, settings: KafkaSettings, topic: str) -> None:
        self.partition = TopicPartition(topic, REGISTRY_PARTITION)
        self.consumer = settings.consumer(isolation_level="read_uncommitted")
        self.consumer.assign([self.partition])
        self.consumer.seek_to_beginning(self.partition)
        self.entries: dict[str, Entry] = {}
        self.lock = threading.Lock()

    def refresh(self) -> dict[str, Entry]:
        with self.lock:
            end = self.consumer.end_offsets([self.partition])[self.partition]
            deadline = time.monotonic() + READ_TIMEOUT_S
            while self.consumer.position(self.partition) < end:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"reading the registry {self.partition.topic} to "
                                       f"offset {end} took over {READ_TIMEOUT_S}s")
                for records in self.consumer.poll(timeout_ms=POLL_MS).values():
                    for record in records:
                        self._apply(record.key, record.value)
            return dict(self.entries)

    def _apply(self, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            return
        tid = key.decode()
        if value is None:
            self.entries.pop(tid, None)
            return
        try:
            self.entries[tid] = Entry.parse(value)
        except (ValueError, KeyError):
            log.warning("ignoring an unreadable registry entry for %s", tid)

    def close(self) -> None:
        self.consumer.close()


def read(settings: KafkaSettings, topic: str) -> dict[str, Entry]:
    """The latest entry of every transactional id in the registry (open ones included). A view
    that fails is dropped (the next read makes another); one refused a rotated password is
    made again with the new one at once (:class:`twophase.kit.ClientCache`)."""
    key = (settings, topic)
    what = f"reading the registry {topic} ({settings.where})"
    return _views.retried_if_rotated(key, lambda: _refreshed(key, what), refused_credentials,
                                     what=what)


def _refreshed(key: tuple[KafkaSettings, str], what: str) -> dict[str, Entry]:
    """The view's entries, a refused login named as such (its consumer logs in again with the
    password it was made with: :meth:`~sinks.kafka.connection.KafkaSettings.login_checked`)."""
    settings, _topic = key
    view = _views.get(key)
    try:
        with settings.login_checked(view.consumer.config.get("sasl_plain_password"), what):
            return view.refresh()
    except Exception:
        _views.drop(key)
        raise


_views: ClientCache[tuple[KafkaSettings, str], _View] = ClientCache(
    lambda key: _View(*key), lambda key: key[0].secrets, _View.close)
