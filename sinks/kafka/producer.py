"""The executor's data path: a librdkafka transactional producer (``confluent-kafka``).

Records go to the brokers through librdkafka (C): batching, compression, the idempotent
sequence numbers and AddPartitionsToTxn are native, and the one Python step per record is
the call of ``Producer.produce``. The control path stays where it was proven: the committer
ends every transaction with EndTxn through kafka-python's admin client
(:mod:`~sinks.kafka.committer`, in whichever process decides it), from the transactional id,
producer id and epoch in the handle.

What librdkafka does and does not do to an open transaction (``confluent-kafka`` 2.16.1 with
librdkafka 2.16.0 against Apache Kafka 4.1; ``tests/test_kafka_adapter.py`` fails loudly when an
upgrade changes any of it):

======================================  ==========================================================
event                                   the open transaction afterwards
======================================  ==========================================================
``Producer.close()``                    ABORTED (confluent-kafka aborts an open transaction):
                                        this module never calls it on a pre-committed one
the producer's last reference dropped   open: deallocation only destroys the client
(``rd_kafka_destroy``)                  (``rd_kafka_destroy`` sends no EndTxn)
the process exits or is SIGKILLed       open
======================================  ==========================================================

so :meth:`TransactionalProducer.release` just drops the client, and a pre-committed transaction
stays open and committable by the driver whatever happens to the executor's process afterwards.

librdkafka's API does not expose the producer id and epoch. The coordinator does: after
``init_transactions``, DescribeTransactions (KIP-664) gives the id's producer id and epoch.
Describe and init are not one step, so a racing attempt could init the same id in between;
then the description shows the newer epoch, this producer is fenced, and the registry record
it sends next (claiming that epoch) is refused by the coordinator (AddPartitionsToTxn at a
stale epoch): the attempt fails and registers nothing. librdkafka ends transactions with EndTxn
v0-1 (transaction version 1: the epoch stays fixed for the transaction), which is what the
driver's EndTxn (v3, transaction version 1) expects.

Why librdkafka, and not kafka-python fed with ready-made RecordBatch v2 bytes: the latter keeps
the producer in Python (its sender, accumulator and transaction manager, reached into through
private parts that move between releases) and still needs its own varint, CRC-32C and batch
framing code; librdkafka is a maintained native producer whose only gap, the producer id and
epoch, the coordinator fills, and whose one hazard, ``close()``, is simply never called.

A record the brokers refuse fails the transaction only at its delivery report: reports are
asked for failures only (``delivery.report.only.error``) and the first one is raised at
:meth:`TransactionalProducer.flush`, before a handle could be handed over. When the
transaction itself fails (AddPartitionsToTxn refused: a missing WRITE ACL on a topic), the
records' reports only say ``_PURGE_QUEUE``; the cause is in librdkafka's ``TXNERR`` log line
(its API has no call that returns it without trying to commit), so :class:`_ClientLog` keeps
it and :meth:`~TransactionalProducer.flush` raises that instead.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from sinks.kafka.records import Record

log = logging.getLogger(__name__)

#: The confluent-kafka version whose close / dealloc behaviour the table above was measured on.
CONFLUENT_KAFKA_TESTED = "2.16.1"

#: Java's (and kafka-python's) key hashing, so a key lands where Spark's sink puts it.
PARTITIONER = "murmur2_random"
#: How long ``produce`` waits for room in librdkafka's queue before it tries again.
QUEUE_FULL_WAIT_S = 0.05
#: Records librdkafka may hold unsent (its queue): a Spark partition's chunk fits.
QUEUE_MAX_MESSAGES = 1_000_000
DEFAULT_LINGER_MS = 5
#: librdkafka's first reconnect backoff (its default is 100 ms). Half of it also spaces a new
#: producer's first two connections (bootstrap address, then the broker it advertises), which
#: every task waits for before its InitProducerId; backoffs still double up to
#: ``reconnect.backoff.max.ms``.
DEFAULT_RECONNECT_BACKOFF_MS = 20
#: librdkafka's node id of a bootstrap address (brokers it learnt carry the cluster's ids).
BOOTSTRAP_NODE_ID = -1
#: ``produce``'s partition: the partitioner's choice.
ANY_PARTITION = -1
ABORT_TIMEOUT_S = 10.0
#: librdkafka's log facility of "the current transaction failed", ending in the error's name.
TXN_ERROR_FACILITY = "TXNERR"
_ERROR_NAME = re.compile(r"\(([A-Z_]+)\)\s*$")
#: kafka-python's names of producer options whose librdkafka name is not the dotted one.
KAFKA_PYTHON_NAMES = {"max_request_size": "message.max.bytes"}


def librdkafka_names(configs: dict[str, Any]) -> dict[str, Any]:
    """``producer_configs`` as librdkafka properties: ``linger.ms`` as is, kafka-python's
    ``linger_ms`` (and ``max_request_size``...) translated."""
    return {KAFKA_PYTHON_NAMES.get(name, name.replace("_", ".")): value
            for name, value in configs.items()}


class _ClientLog:
    """librdkafka's log lines into this module's logger (librdkafka redacts its secrets, e.g.
    ``sasl.password = [redacted]``), keeping the last transaction error it reports."""

    def __init__(self) -> None:
        self.txn_error: KafkaError | None = None

    def log(self, level: int, msg: str, *args: object) -> None:
        log.log(level, msg, *args)
        facility, text = (str(args[0]), str(args[-1])) if len(args) >= 2 else ("", "")
        if facility == TXN_ERROR_FACILITY and (match := _ERROR_NAME.search(text)):
            code = getattr(KafkaError, match.group(1), None)
            if isinstance(code, int):
                self.txn_error = KafkaError(code, text.split("]: ", 1)[-1])


class TransactionalProducer:
    """One transactional id's librdkafka producer, for one transaction (see module docs)."""

    def __init__(self, configs: dict[str, Any], transactional_id: str) -> None:
        self.transactional_id = transactional_id
        self.failure: KafkaError | None = None
        self._log = _ClientLog()
        self._client: Producer | None = Producer({
            "partitioner": PARTITIONER, "linger.ms": DEFAULT_LINGER_MS,
            "queue.buffering.max.messages": QUEUE_MAX_MESSAGES,
            "reconnect.backoff.ms": DEFAULT_RECONNECT_BACKOFF_MS,
            **configs,
            "transactional.id": transactional_id,
            "delivery.report.only.error": True,
            "on_delivery": self._delivered,
            "error_cb": self._client_error,
            "logger": self._log,  # librdkafka's log lines, through logging (at poll/flush)
        })

    @property
    def client(self) -> Producer:
        if self._client is None:
            raise RuntimeError(f"the producer of {self.transactional_id} was released")
        return self._client

    def _delivered(self, error: KafkaError | None, message: Message) -> None:
        if error is not None and self.failure is None:
            self.failure = error

    def _client_error(self, error: KafkaError) -> None:
        if error.fatal() and self.failure is None:
            self.failure = error
        log.debug("librdkafka (%s): %s", self.transactional_id, error)

    def connect(self, topic: str, timeout_s: float) -> None:
        """Return once a broker the cluster advertises (not a bootstrap address) has answered
        a metadata request for ``topic``; call it right before :meth:`begin`.

        librdkafka drops its bootstrap connections as soon as it has learnt the cluster's
        brokers. An InitProducerId begun before that can lose its FindCoordinator with the
        dropped connection and then waits out librdkafka's fixed 500 ms retry (measured: a
        third of the tasks did). Made early (the constructor starts connecting at once) and
        connected late, the producer also waits less for its spaced-out first connections.
        """
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if self.client.list_topics(topic, timeout=left).orig_broker_id != BOOTSTRAP_NODE_ID:
                return
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT,
                                        f"no advertised broker answered within {timeout_s}s"))

    def begin(self, timeout_s: float) -> None:
        """InitProducerId (aborting the id's open transaction, if any), then begin."""
        self.client.init_transactions(timeout_s)
        self.client.begin_transaction()

    def send(self, records: Iterable[Record], partition: int = ANY_PARTITION) -> int:
        """Queue every record (waiting for room when the queue is full); how many."""
        produce, count = self.client.produce, 0
        for topic, key, value, headers in records:
            while True:
                try:
                    if headers is None:  # positional only: a third faster to parse
                        produce(topic, value, key, partition)
                    else:
                        produce(topic, value, key, partition, headers=headers)
                    break
                except BufferError:
                    self.client.poll(QUEUE_FULL_WAIT_S)
            count += 1
        return count

    def flush(self, timeout_s: float) -> None:
        """Wait until the brokers acknowledged every record; raise the first failure."""
        left = self.client.flush(timeout_s)
        if self.failure is None and left:
            self.failure = KafkaError(KafkaError._MSG_TIMED_OUT,
                                      f"{left} records unacknowledged after {timeout_s}s")
        if self.failure is not None:
            if self.failure.code() == KafkaError._PURGE_QUEUE and self._log.txn_error:
                raise KafkaException(self._log.txn_error)  # the cause of the purge
            raise KafkaException(self.failure)

    def release(self) -> None:
        """Drop the client WITHOUT ending its transaction (never ``close()``: it aborts)."""
        self._client = None

    def abort(self) -> None:
        """Abort the open transaction (its records never become visible), then release.
        Never raises: what it cannot abort, the driver's sweep or the broker's timeout does."""
        try:
            if self._client is not None:
                self._client.abort_transaction(ABORT_TIMEOUT_S)
        except KafkaException:
            log.info("could not abort the transaction of %s", self.transactional_id,
                     exc_info=True)
        finally:
            self.release()
