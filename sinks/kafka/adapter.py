"""Every use of kafka-python's private parts, here and nowhere else (see FLINK-40689).

kafka-python (3.x) has no public API to send EndTxn for a transaction another process opened,
which is what a two-phase commit across processes needs, so this module reaches into:

=====================================================  ========================================
private part                                           used for
=====================================================  ========================================
``KafkaAdminClient._find_coordinator_id(key,           the transaction coordinator of a
key_type=CoordinatorType.TRANSACTION)``                transactional id (FindCoordinator)
``KafkaAdminClient._manager.send(request, node_id=)``  EndTxn to that coordinator
and ``._manager.run(coroutine)``
``EndTxnRequest(..., max_version=3)``                  transaction version 1 (v3), whose epoch
                                                       stays fixed for the transaction, as the
                                                       executors' librdkafka producer speaks it
=====================================================  ========================================

The producer id and epoch come from the coordinator (DescribeTransactions), not from a
client's internals (:mod:`~sinks.kafka.producer`). ``tests/test_kafka_adapter.py`` fails
loudly when an upgrade of kafka-python moves any of them; :data:`KAFKA_PYTHON_TESTED` names the
version this was written against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kafka import KafkaAdminClient
from kafka.protocol.metadata import CoordinatorType
from kafka.protocol.producer.transaction import EndTxnRequest

KAFKA_PYTHON_TESTED = "3.0.12"
#: The highest EndTxn version of transaction version 1 (librdkafka sends v0-1: the same).
END_TXN_MAX_VERSION = 3


@dataclass(frozen=True)
class ProducerIdentity:
    """What the transaction coordinator knows a producer's open transaction by."""

    transactional_id: str
    producer_id: int
    epoch: int


def end_transaction(admin: KafkaAdminClient, identity: ProducerIdentity, *,
                    commit: bool) -> int:
    """Send EndTxn(commit or abort) for ``identity`` to its coordinator; the error code."""

    async def send() -> Any:
        coordinator = await admin._find_coordinator_id(
            identity.transactional_id, key_type=CoordinatorType.TRANSACTION)
        request = EndTxnRequest(transactional_id=identity.transactional_id,
                                producer_id=identity.producer_id,
                                producer_epoch=identity.epoch, committed=commit,
                                max_version=END_TXN_MAX_VERSION)
        return await admin._manager.send(request, node_id=coordinator)

    response = admin._manager.run(send)
    return int(response.error_code)


def forget_coordinator(admin: KafkaAdminClient, transactional_id: str) -> None:
    """Drop the cached coordinator of ``transactional_id`` (after NOT_COORDINATOR)."""
    admin._manager.cluster._coordinators.pop(
        (CoordinatorType.TRANSACTION, transactional_id), None)
