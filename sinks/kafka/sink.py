"""Apache Kafka, exactly once by transactions committed from the driver: :class:`KafkaSink`.

Every partition's slice of a micro-batch is ONE Kafka transaction of a transactional producer
whose id comes from a bounded pool (:mod:`~sinks.kafka.pool`). Records of an open or aborted
transaction are hidden only from consumers reading with ``isolation.level=read_committed``:
**every consumer of the target topic must read that way**, or it sees pre-committed batches
that may still be aborted (and, after a crash, duplicates of them).

What a crash leaves behind, phase by phase (the broker keeps what it acknowledged):

==========  =====================  ====================  =====================  ==================
phase       calls                  a crash here leaves   resolved by            raises
==========  =====================  ====================  =====================  ==================
begin       ListTransactions +     an initialised id     nothing to resolve;    RetryableError
            DescribeTransactions   with an empty or      an open transaction    (every slot held,
            (pool slot: one        registry-only open    is listed by           broker down),
            request), registry     transaction, or       ``list_in_doubt`` and  FatalError (id
            read, while the        nothing               aborted by the sweep,  committed before)
            producer connects;                           or taken over by the
            Metadata (from an                            next init, or timed
            advertised broker),                          out by the broker
            InitProducerId
            (aborts the slot's
            orphan), Describe-
            Transactions (its
            producer id, epoch),
            registry record
            (flushed)
write       Produce (librdkafka,   an open transaction   as begin               ConfigurationError
            batched natively;      with some records:                           (unknown topic),
            Arrow encoded column-  invisible to                                 SchemaMismatch-
            wise)                  read_committed                               Error (record too
                                   consumers; pins the                          large), Retryable-
                                   topic's last stable                          Error
                                   offset until aborted
pre-commit  flush; the producer    an open transaction   once decided, the      as write
            is dropped WITHOUT     with every record:    driver commits it
            ending it (never       durable, invisible    (EndTxn); else the
            ``close()``)                                 sweep aborts it
commit      DescribeTransactions,  before EndTxn: the    recovery commits       TransactionLost-
            EndTxn(commit) to the  open transaction;     again: CompleteCommit  Error (aborted,
            coordinator (driver,   after: committed      at the handle's        timed out, taken
            any process)                                 epoch proves           over: names the
                                                         ALREADY_COMMITTED      deadline),
                                                                                RetryableError
abort       DescribeTransactions,  the open transaction  repeat it: not open    RetryableError
            EndTxn(abort)          or nothing            at the epoch ->
                                                         NOT_FOUND
==========  =====================  ====================  =====================  ==================

**Timeouts.** The broker aborts a transaction ``transaction_timeout_ms`` after it began (at
most the brokers' ``transaction.max.timeout.ms``, 15 minutes by default). A decided batch
must be committed before that deadline, so the handle records it, and a commit that comes
too late (a driver down for longer) raises :class:`TransactionLostError` naming it: the batch
stays pending, loudly, never reported as delivered. ``check_schema`` refuses a
``transaction_timeout_ms`` the brokers would reject and warns when it leaves a batch less
than ``min_commit_window_ms`` to be decided and committed. The default is the brokers' default
maximum.

**Lingering transactions.** A crashed attempt's open transaction pins the topic's last stable
offset (read_committed consumers stall behind it). ``list_in_doubt`` lists open transactions
of the namespace by ListTransactions (a pattern of the pool's ids) and names each by the
registry (:mod:`~sinks.kafka.registry`), so the driver's sweep aborts the orphans at the next
batch or start; the next init of the same pooled id aborts it too. An open transaction with
no registered owner (a crash between init and the registry record) holds no data and is left
to the broker's timeout.

Reuse of a committed transaction id (a state restored from a backup) is refused at begin
while the pooled id still shows that transaction committed; once a later batch has reused
the id, it no longer can be (duplicates then, not loss).

An empty partition still opens a transaction (holding its registry record) and commits it.
There are no proofs of commit to purge: the coordinator's state is the proof
(``transactional.id.expiration.ms``, 7 days by default, bounds how late a recommit can prove
anything).

**Keyed** (``mode="keyed"``, :mod:`~sinks.kafka.changelog`): the topic, compacted, as the
changelog of each key's latest state. The phases are the same; a task produces one record per
key (its newest change, the version in a header, a delete as a tombstone), and rows reach the
tasks routed by key, so that a key's newest change of a batch is its last record in its
partition. A late older change in a later batch is not suppressed (the topic keeps no version
per key): it becomes the key's last record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal

from kafka.admin import (
    ConfigResource,
    ConfigResourceType,
)

from sinks.kafka import registry
from sinks.kafka.adapter import ProducerIdentity
from sinks.kafka.changelog import Produced, validate_changelog
from sinks.kafka.committer import KafkaCommitter
from sinks.kafka.connection import kafka_settings
from sinks.kafka.errors import (
    FIX_CLUSTER_ACCESS,
    FIX_TIMEOUT,
    FIX_TOPIC,
    KAFKA_ERRORS,
    SYSTEM,
    TOPIC_AUTHORIZATION_FAILED,
    classify,
    classify_code,
    code_name,
)
from sinks.kafka.lookups import describe, list_ids
from sinks.kafka.pool import (
    DEFAULT_ATTEMPT_SLOTS,
    candidates,
    choose,
    partition_pattern,
)
from sinks.kafka.producer import TransactionalProducer, librdkafka_names
from sinks.kafka.records import RecordShape
from twophase import (
    Column,
    ConfigurationError,
    Handle,
    RetryableError,
    Secret,
    TransactionContext,
    TwoPhaseCommitSink,
    TxnId,
)
from twophase.kit import KEYED, TlsMode, classified, namespace_from, validate_keyed

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

#: The brokers' default ``transaction.max.timeout.ms``: the longest a batch may wait.
DEFAULT_TRANSACTION_TIMEOUT_MS = 900_000
#: Below this, ``check_schema`` warns: too little time for a trigger plus a slow commit.
DEFAULT_MIN_COMMIT_WINDOW_MS = 120_000
FLUSH_TIMEOUT_S = 120.0
INIT_TIMEOUT_S = 60.0
MAX_REPLICATION = 3
BROKER_MAX_TIMEOUT = "transaction.max.timeout.ms"
#: librdkafka properties that only the sink's security options may set (both clients get those).
SECURITY_PROPERTY_PREFIXES = ("security.", "sasl.", "ssl.")
#: ``mode=``: every row a record (the default), or the newest change per key on a compacted
#: topic (:mod:`~sinks.kafka.changelog`).
INSERT: Final = "insert"
KafkaMode = Literal["insert", "keyed"]
MODES: Final = (INSERT, KEYED)


@dataclass
class KafkaTransaction:
    """One task's open Kafka transaction."""

    ctx: TransactionContext
    producer: TransactionalProducer
    identity: ProducerIdentity
    deadline_ms: int
    rows: int = 0
    shape: RecordShape = field(default_factory=RecordShape)
    #: The keyed mode's versions produced per key (:mod:`~sinks.kafka.changelog`).
    produced: Produced = field(default_factory=Produced)


class KafkaSink(TwoPhaseCommitSink[KafkaTransaction]):
    """Records into Kafka topics, one transaction per partition and batch (see module docs).

    ``topic`` (or ``topic_column``) names the target; ``key``, ``value`` and ``headers`` name
    columns (:mod:`~sinks.kafka.records`). ``transaction_timeout_ms`` bounds how long a decided
    batch may wait for its commit. ``transactional_id_prefix`` + namespace prefixes the pooled
    ids (``attempt_slots`` per partition and batch parity). ``producer_configs`` go to the
    executors' librdkafka producer (``linger.ms``, ``batch.size``, ``compression.type``,
    ``message.max.bytes``...; kafka-python's ``linger_ms``, ``max_request_size``... are
    translated), never security ones. Security options go to both clients alike
    (:mod:`~sinks.kafka.connection`): ``tls`` (``"off"`` unless given: ``"verify"`` for an SSL
    or SASL_SSL listener verifies the certificate, against ``ca_bundle``, and the host name
    unless ``ssl_check_hostname=False``; ``"require"`` verifies neither), ``client_cert``/
    ``client_key`` (mutual TLS; ``ssl_password`` for an encrypted key) and SASL's own
    ``sasl_mechanism``, ``sasl_plain_username``, ``sasl_plain_password``. (The TLS options are
    every prebuilt sink's; the former ``security_protocol``, ``ssl_cafile``, ``ssl_certfile``,
    ``ssl_keyfile`` work and warn until 0.6.0.) ``sasl_plain_password`` and ``ssl_password``
    may be :class:`twophase.Secret` references, and never show in ``repr``, logs or errors.
    ``connection``: those connection options (``bootstrap_servers`` too, which may then be left
    out; :data:`~sinks.kafka.connection.CONNECTION_OPTIONS`) as one value, a mapping of their
    names or a :class:`twophase.Secret` holding a JSON object of them
    (``Secret(env="KAFKA_CONNECTION")``): read as the sink is made, but its
    ``sasl_plain_password`` and ``ssl_password`` stay references
    (:class:`twophase.kit.SecretField`), read from the Secret at every connection. An option
    given there and as a keyword too is refused.
    The ACLs the principal needs: :mod:`~sinks.kafka.access`.

    ``mode="keyed"`` (with ``key=``, ``version=``, optionally ``deleted=`` and
    ``version_header=``) makes the topic a changelog of each key's latest state
    (:mod:`~sinks.kafka.changelog`): each task produces one record per key, its newest change
    of the batch, the version in the header ``twophase.version``, a delete as a tombstone (null
    value); rows are routed by key (:meth:`route_key`), so a key's changes of a batch are
    reduced in one task and the newest record of a key is its last in the partition; the
    topic's ``cleanup.policy`` must include ``compact`` (checked at start). A late older change
    in a later batch is **not** suppressed: a topic keeps no version per key to compare it
    with, so it becomes the key's last record (a table sink's keyed mode drops it).
    """

    kind: ClassVar[str] = "kafka"

    def __init__(
        self,
        bootstrap_servers: str | None = None,
        topic: str | None = None,
        *,
        connection: str | Secret | Mapping[str, Any] | None = None,
        topic_column: str | None = None,
        key: str | None = None,
        value: str | None = None,
        headers: Sequence[str] = (),
        mode: KafkaMode = "insert",
        version: str | None = None,
        deleted: str | None = None,
        version_header: str | None = None,
        transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS,
        min_commit_window_ms: int = DEFAULT_MIN_COMMIT_WINDOW_MS,
        transactional_id_prefix: str = "twophase-",
        attempt_slots: int = DEFAULT_ATTEMPT_SLOTS,
        registry_topic: str = registry.DEFAULT_REGISTRY_TOPIC,
        registry_replication: int | None = None,
        producer_configs: Mapping[str, Any] | None = None,
        tls: TlsMode | None = None,
        ca_bundle: str | None = None,
        client_cert: str | None = None,
        client_key: str | None = None,
        **options: Any,
    ) -> None:
        if (topic is None) == (topic_column is None):
            raise ConfigurationError("KafkaSink: name exactly one of topic= and topic_column=.",
                                     fix="pass topic='orders' or topic_column='topic'")
        if not isinstance(attempt_slots, int) or attempt_slots < 1:
            raise ConfigurationError(f"KafkaSink: attempt_slots={attempt_slots!r}.",
                                     fix=f"pass a positive int (default {DEFAULT_ATTEMPT_SLOTS})")
        if not isinstance(transaction_timeout_ms, int) or transaction_timeout_ms < 1:
            raise ConfigurationError(
                f"KafkaSink: transaction_timeout_ms={transaction_timeout_ms!r}.",
                fix=f"pass a positive int (default {DEFAULT_TRANSACTION_TIMEOUT_MS})")
        self.settings = kafka_settings(connection, {
            "bootstrap_servers": bootstrap_servers, "tls": tls, "ca_bundle": ca_bundle,
            "client_cert": client_cert, "client_key": client_key, **options})
        self.shape = RecordShape(topic, topic_column, key, value, tuple(headers))
        self.mode = _checked_mode(mode, key)
        self.changelog = validate_changelog(
            validate_keyed(SYSTEM, mode, () if key is None else (key,), version, deleted),
            self.shape, version_header)
        self.transaction_timeout_ms = transaction_timeout_ms
        self.min_commit_window_ms = min_commit_window_ms
        self.transactional_id_prefix = transactional_id_prefix
        self.attempt_slots = attempt_slots
        self.registry_topic = registry_topic
        self.registry_replication = registry_replication
        self.producer_configs = _checked_producer_configs(producer_configs or {})

    @property
    def where(self) -> str:
        """The target, as error messages name it."""
        target = self.shape.topic or f"the topics in column {self.shape.topic_column!r}"
        return f"{self.settings.where}, topic {target}"

    def default_namespace(self) -> str:
        return namespace_from(self.shape.topic or self.shape.topic_column or "", self.kind)

    # -- driver: start checks ------------------------------------------------------------------

    def check_schema(self, columns: Sequence[Column]) -> None:
        """Columns fit; the topic exists; the timeout fits the brokers; the registry exists."""
        self.shape.check(columns)
        if self.changelog is not None:
            self.changelog.check_columns(self.where, columns)
        what = f"checking {self.where}"
        self.settings.with_admin(lambda admin: self._check_cluster(admin, what), what)

    def _check_cluster(self, admin: Any, what: str) -> None:
        with classified(classify, what, KAFKA_ERRORS):
            if self.shape.topic is not None:
                self._check_topic(admin, self.shape.topic)
                if self.changelog is not None:
                    self.changelog.check_topic(admin, self.shape.topic, self.settings.where)
            self._check_timeout(admin)
            brokers = len(admin.describe_cluster()["brokers"])
            replication = self.registry_replication or min(MAX_REPLICATION, brokers)
            registry.ensure_topic(admin, self.registry_topic, replication)

    def _check_topic(self, admin: Any, topic: str) -> None:
        """The topic exists and the principal may see it (a broker answers the same
        TOPIC_AUTHORIZATION_FAILED for a topic it hides and one that does not exist)."""
        if topic in admin.list_topics():
            return
        described = admin.describe_topics([topic])
        code = code_name(int(described[0]["error_code"])) if described else "NONE"
        if code == TOPIC_AUTHORIZATION_FAILED:
            raise classify_code(described[0]["error_code"],
                                f"checking topic {topic!r} in {self.settings.where}")
        raise ConfigurationError(f"{SYSTEM}: topic {topic!r} does not exist in "
                                 f"{self.settings.where}.", fix=FIX_TOPIC)

    def _check_timeout(self, admin: Any) -> None:
        broker_max = self.broker_max_timeout_ms(admin)
        if self.transaction_timeout_ms > broker_max:
            raise ConfigurationError(
                f"{SYSTEM}: transaction_timeout_ms={self.transaction_timeout_ms} exceeds the "
                f"brokers' {BROKER_MAX_TIMEOUT}={broker_max}: they would refuse every "
                "transaction.", fix=FIX_TIMEOUT)
        if self.transaction_timeout_ms < self.min_commit_window_ms:
            log.warning(
                "KafkaSink: transaction_timeout_ms=%d leaves a batch under %d ms from its "
                "first record to its commit: a slow trigger or a driver restart loses it "
                "(TransactionLostError). Raise transaction_timeout_ms (and the brokers' %s) "
                "well above the trigger interval plus the longest expected commit delay.",
                self.transaction_timeout_ms, self.min_commit_window_ms, BROKER_MAX_TIMEOUT)

    def broker_max_timeout_ms(self, admin: Any) -> int:
        """The smallest ``transaction.max.timeout.ms`` of the brokers."""
        brokers = admin.describe_cluster()["brokers"]
        resources = [ConfigResource(ConfigResourceType.BROKER, str(broker["broker_id"]),
                                    configs={BROKER_MAX_TIMEOUT: None}) for broker in brokers]
        described = admin.describe_configs(resources, config_filter="all")
        return min(_config_values(described, BROKER_MAX_TIMEOUT))

    def route_key(self) -> tuple[str, ...] | None:
        """Keyed, the record key: two tasks' records of one key would reach its partition in
        the order their producers appended them, not by version, so each key's changes of a
        batch must be reduced in one task (else None: any partitioning will do)."""
        return None if self.changelog is None else self.changelog.keyed.key

    # -- executor ------------------------------------------------------------------------------

    def begin_transaction(self, ctx: TransactionContext) -> KafkaTransaction:
        if self.changelog is not None:
            self.changelog.keyed.check_rows(self.where, ctx.column_names)
        what = f"opening transaction {ctx.txn_id}"
        return self.settings.with_admin(lambda admin: self._begin(ctx, admin, what), what)

    def _begin(self, ctx: TransactionContext, admin: Any, what: str) -> KafkaTransaction:
        with classified(classify, what, KAFKA_ERRORS):
            producer = self._producer_of_free_slot(admin, ctx.txn_id)
            opened_ms = int(time.time() * 1000)
            try:
                return self._open(ctx, producer, admin, opened_ms)
            except BaseException:
                producer.abort()
                raise

    def _producer_of_free_slot(self, admin: Any, txn: TxnId) -> TransactionalProducer:
        """A producer (not initialised) for the pooled id ``txn`` may take
        (:func:`~sinks.kafka.pool.choose`). It is made for ``txn``'s first candidate before
        the pool is looked up, so that it connects meanwhile; a producer never initialised
        has not touched its id, so dropping it (another slot chosen, or none) is harmless."""
        ids = candidates(self.transactional_id_prefix, txn, self.attempt_slots)
        producer = TransactionalProducer(self._producer_configs(), ids[0])
        try:
            tid = self._free_slot(admin, txn, ids)
        except BaseException:
            producer.release()
            raise
        if tid == producer.transactional_id:
            return producer
        producer.release()
        return TransactionalProducer(self._producer_configs(), tid)

    def _free_slot(self, admin: Any, txn: TxnId, ids: Sequence[str]) -> str:
        """The first of ``ids`` that ``txn`` may initialise, by the coordinator's description
        of each and the registry (read only once the pool has been used)."""
        known = set(list_ids(admin, partition_pattern(
            self.transactional_id_prefix, txn)))
        descriptions = describe(admin, [tid for tid in ids if tid in known])
        entries = registry.read(self.settings, self.registry_topic) if known else {}
        return choose(txn, ids, descriptions, entries)

    def _producer_configs(self) -> dict[str, Any]:
        configs = {**self.settings.librdkafka_configs(),
                   "transaction.timeout.ms": self.transaction_timeout_ms,
                   **librdkafka_names(self.producer_configs)}
        # librdkafka refuses a socket timeout beyond the transaction's (+ 100 ms)
        configs["socket.timeout.ms"] = min(int(configs["socket.timeout.ms"]),
                                           self.transaction_timeout_ms)
        return configs

    def _open(self, ctx: TransactionContext, producer: TransactionalProducer, admin: Any,
              opened_ms: int) -> KafkaTransaction:
        tid = producer.transactional_id
        producer.connect(self.registry_topic, INIT_TIMEOUT_S)
        producer.begin(INIT_TIMEOUT_S)
        identity = _identity(admin, tid)
        deadline_ms = opened_ms + self.transaction_timeout_ms
        entry = registry.Entry(ctx.txn_id, identity.producer_id, identity.epoch, deadline_ms)
        producer.send([(self.registry_topic, tid.encode(), entry.value(), None)],
                      partition=registry.REGISTRY_PARTITION)
        producer.flush(FLUSH_TIMEOUT_S)
        log.debug("transaction %s opened as %s", ctx.txn_id, identity)
        return KafkaTransaction(ctx, producer, identity, deadline_ms, shape=self.shape)

    def write(self, txn: KafkaTransaction, rows: Iterable[Sequence[Any]]) -> None:
        """Each row a record; keyed, the newest change of each key
        (:meth:`~sinks.kafka.changelog.Changelog.records`)."""
        names = txn.ctx.column_names
        with classified(classify, f"writing transaction {txn.ctx.txn_id}", KAFKA_ERRORS):
            if self.changelog is not None:
                txn.rows += txn.producer.send(
                    self.changelog.records(rows, names, txn.produced))
                return
            encode = txn.shape.encoder()
            txn.rows += txn.producer.send(
                encode(dict(zip(names, row, strict=True))) for row in rows)

    def write_arrow(self, txn: KafkaTransaction, batches: Iterable[pa.RecordBatch]) -> None:
        """Rows straight from Arrow, encoded column-wise (no Python per row but ``produce``)."""
        from sinks.kafka.arrow import columns_of  # noqa: PLC0415 - only this path needs pyarrow

        with classified(classify, f"writing transaction {txn.ctx.txn_id}", KAFKA_ERRORS):
            if self.changelog is not None:
                txn.rows += txn.producer.send(
                    self.changelog.arrow_records(batches, txn.produced))
                return
            for batch in batches:
                txn.rows += txn.producer.send(columns_of(txn.shape, batch).records())

    def pre_commit(self, txn: KafkaTransaction) -> Handle:
        with classified(classify, f"pre-commit of transaction {txn.ctx.txn_id}", KAFKA_ERRORS):
            txn.producer.flush(FLUSH_TIMEOUT_S)
        txn.producer.release()  # leaves the transaction open (close() would abort it)
        identity = txn.identity
        return self.handle(txn.ctx.txn_id, txn.rows, transactional_id=identity.transactional_id,
                           producer_id=identity.producer_id, epoch=identity.epoch,
                           deadline_ms=txn.deadline_ms,
                           timeout_ms=self.transaction_timeout_ms)

    def discard(self, txn: KafkaTransaction) -> None:
        """Abort the open transaction (its records never become visible) and drop it."""
        txn.producer.abort()

    # -- driver: everything in the committer --------------------------------------------------

    #: Deprecated on the sink (removed in 0.6.0): call them on ``sink.committer()``.
    moved_to_committer = frozenset({"commit_deadline", "list_in_doubt"})

    def committer(self) -> KafkaCommitter:
        return KafkaCommitter(self)


def _identity(admin: Any, tid: str) -> ProducerIdentity:
    """The producer id and epoch the coordinator holds for ``tid`` right after our init (a
    newer one if another attempt raced us: then our registry record is refused, see
    :mod:`~sinks.kafka.producer`)."""
    description = describe(admin, [tid]).get(tid)
    if description is None:
        raise RetryableError(f"KafkaSink: the coordinator does not describe {tid} right after "
                             "its InitProducerId.", fix="retried automatically")
    return ProducerIdentity(tid, description.producer_id, description.producer_epoch)


def _checked_mode(mode: str, key: str | None) -> KafkaMode:
    """``mode`` if the sink has it (keyed: with the key= it reads)."""
    if mode not in MODES:
        raise ConfigurationError(
            f"{SYSTEM}: unknown mode {mode!r}.",
            fix="pass mode='insert' (every row a record, the default) or mode='keyed' (the "
                "newest change of each key on a compacted topic, deletes as tombstones)")
    if mode == KEYED and key is None:
        raise ConfigurationError(
            f"{SYSTEM}: mode='keyed' needs key=, the column whose value is each record's key.",
            fix="pass key='order_id' (the column naming the state a change belongs to)")
    return INSERT if mode == INSERT else KEYED


def _checked_producer_configs(configs: Mapping[str, Any]) -> dict[str, Any]:
    """``producer_configs`` without security properties: those go to both clients, as the
    sink's own options, or the executors and the driver would connect differently."""
    security = sorted(name for name in librdkafka_names(dict(configs))
                      if name.startswith(SECURITY_PROPERTY_PREFIXES)
                      or name == "enable.ssl.certificate.verification")
    if security:
        raise ConfigurationError(
            f"{SYSTEM}: producer_configs= holds security properties {security}.",
            fix="pass tls=, ca_bundle=, client_cert=, client_key=, ssl_password=, "
                "ssl_check_hostname=, sasl_mechanism=, sasl_plain_username=, "
                "sasl_plain_password= to the sink itself: the driver's client takes them too")
    return dict(configs)


def _config_values(described: Any, name: str) -> list[int]:
    """Values of ``name`` in kafka-python's describe_configs answer."""
    values: list[int] = []
    for resources in described.values():
        for configs in resources.values():
            entry = configs.get(name)
            if entry is not None:
                raw = entry.get("value") if isinstance(entry, dict) else entry
                values.append(int(str(raw)))
    if not values:
        raise ConfigurationError(f"{SYSTEM}: the brokers did not report {name}.",
                                 fix=FIX_CLUSTER_ACCESS)
    return values
