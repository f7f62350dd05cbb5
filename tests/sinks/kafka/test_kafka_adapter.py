"""kafka-python's private parts that sinks.kafka.adapter relies on, and librdkafka's behaviour
that sinks.kafka.producer relies on: this fails loudly, naming the part, when an upgrade moves
one (FLINK-40689: reflection that broke on upgrades). Against the real broker, each part is
also exercised once."""

from __future__ import annotations

import gc
import inspect
from importlib import metadata

import kafka
from kafka import KafkaAdminClient
from kafka.protocol.metadata import CoordinatorType
from kafka.protocol.producer.transaction import EndTxnRequest

from setups.servers.kafka import KafkaBroker
from sinks.kafka import adapter, producer
from sinks.kafka.lookups import describe


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


def test_librdkafka_leaves_a_dropped_producers_transaction_open_and_close_aborts_it(
        kafka_broker: KafkaBroker, kafka_topic: str) -> None:
    """What sinks.kafka.producer relies on: dropping the producer (dealloc, rd_kafka_destroy)
    leaves its flushed transaction open for the driver's EndTxn; ``close()`` aborts it."""
    installed = metadata.version("confluent-kafka")
    assert installed == producer.CONFLUENT_KAFKA_TESTED, (
        f"confluent-kafka {installed} is not the tested "
        f"{producer.CONFLUENT_KAFKA_TESTED}: re-check sinks/kafka/producer.py's table")
    admin = kafka_broker.admin()
    try:
        kept, closed = (_flushed(kafka_broker, f"{kafka_topic}-{name}", kafka_topic)
                        for name in ("kept", "closed"))
        kept.release()
        gc.collect()
        closed.client.close()
        states = describe(admin, [kept.transactional_id, closed.transactional_id])
        assert states[kept.transactional_id].state.value == "Ongoing"
        assert states[closed.transactional_id].state.value in {"PrepareAbort", "CompleteAbort"}
        description = states[kept.transactional_id]
        identity = adapter.ProducerIdentity(kept.transactional_id, description.producer_id,
                                            description.producer_epoch)
        assert adapter.end_transaction(admin, identity, commit=True) == 0  # NONE
        adapter.forget_coordinator(admin, identity.transactional_id)
        assert adapter.end_transaction(admin, identity, commit=False) != 0  # committed already
    finally:
        admin.close()
    assert sorted(kafka_broker.read(kafka_topic, "read_committed"),
                  key=lambda record: record.value)[0].value == b"kept"


def _flushed(broker: KafkaBroker, tid: str, topic: str) -> producer.TransactionalProducer:
    """A producer whose open transaction holds one flushed record (its name)."""
    made = producer.TransactionalProducer({"bootstrap.servers": broker.bootstrap_servers}, tid)
    made.begin(30)
    made.send([(topic, None, tid.rsplit("-", 1)[1].encode(), None)])
    made.flush(30)
    return made
