"""kafka-python's private parts that sinks.kafka.adapter relies on: this fails loudly, naming
the part, when an upgrade of kafka-python moves one (FLINK-40689: reflection that broke on
upgrades). Against the real broker, each part is also exercised once."""

from __future__ import annotations

import inspect

import kafka
from kafka import KafkaAdminClient, KafkaProducer
from kafka.protocol.metadata import CoordinatorType
from kafka.protocol.producer.transaction import EndTxnRequest

from sinks.kafka import adapter
from sinks.kafka.committer import describe
from tests.servers.kafka import KafkaBroker


def test_the_private_parts_are_where_the_adapter_expects_them() -> None:
    assert kafka.__version__ == adapter.KAFKA_PYTHON_TESTED, (
        f"kafka-python {kafka.__version__} is not the tested {adapter.KAFKA_PYTHON_TESTED}: "
        "re-check every part listed in sinks/kafka/adapter.py, then bump KAFKA_PYTHON_TESTED")
    assert "_find_coordinator_id" in vars(KafkaAdminClient) or hasattr(
        KafkaAdminClient, "_find_coordinator_id")
    assert inspect.iscoroutinefunction(KafkaAdminClient._find_coordinator_id)
    assert "key_type" in inspect.signature(KafkaAdminClient._find_coordinator_id).parameters
    assert CoordinatorType.TRANSACTION.value == 1
    fields = set(inspect.signature(EndTxnRequest.__init__).parameters) | set(
        getattr(EndTxnRequest, "__annotations__", {}))
    request = EndTxnRequest(transactional_id="t", producer_id=1, producer_epoch=2,
                            committed=True, max_version=adapter.END_TXN_MAX_VERSION)
    assert (request.transactional_id, request.producer_id, request.producer_epoch,
            request.committed) == ("t", 1, 2, True), fields
    assert EndTxnRequest.max_version >= adapter.END_TXN_MAX_VERSION


def test_a_transactional_producer_exposes_its_id_epoch_and_error_state(
        kafka_broker: KafkaBroker, kafka_topic: str) -> None:
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap_servers,
                             transactional_id=f"{kafka_topic}-adapter")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(kafka_topic, b"x").get(10)
        identity = adapter.producer_identity(producer, f"{kafka_topic}-adapter")
        assert identity.producer_id >= 0 and identity.epoch >= 0
        assert adapter.transaction_error(producer) is None
    finally:
        producer.close(timeout=1)
    admin = kafka_broker.admin()
    try:
        tid = identity.transactional_id
        assert describe(admin, [tid])[tid].state.value == "Ongoing"  # close() did not end it
        assert adapter.end_transaction(admin, identity, commit=False) == 0  # NONE
        adapter.forget_coordinator(admin, tid)
        assert adapter.end_transaction(admin, identity, commit=True) != 0  # aborted already
    finally:
        admin.close()
