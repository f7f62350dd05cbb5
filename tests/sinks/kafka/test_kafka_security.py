"""sinks.kafka against the secured broker (SASL_SSL with SCRAM-SHA-512, a certificate of the
run's CA, the StandardAuthorizer): the ACLs it needs and nothing more, TLS verified by default,
and a password given by reference that nothing carries in clear.

Sink-level: the executors' librdkafka producer and the driver's kafka-python clients run in
this process, as the contract suite runs them. The crash test over the same broker is in
``tests/sinks/kafka/test_kafka_crash.py``.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
from collections.abc import Iterator
from typing import Any

import pytest
from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kafka.errors import KafkaError as KafkaPythonError

from setups.servers.kafka import (
    OTHER_CA_LISTENER,
    PROBE_USER,
    WRONG_HOST_LISTENER,
    KafkaBroker,
)
from sinks.kafka import KafkaSink
from sinks.kafka.access import Grant, cleanup_grants, grants, status_grants
from sinks.kafka.connection import CONNECTION_OPTIONS
from sinks.kafka.registry import REGISTRY_CONFIGS
from tests.sinks import as_connection_json, committed_through_its_pickled_copy
from twophase import (
    AbortOutcome,
    CommitOutcome,
    ConfigurationError,
    Secret,
    TwoPhaseError,
)
from twophase.testing.contract import (
    NAMESPACE,
    ORDER_COLUMNS,
    abort,
    commit,
    list_in_doubt,
    orders,
    prepare,
)

PRINCIPAL = f"User:{PROBE_USER}"
PASSWORD_VARIABLE = "TWOPHASE_TEST_KAFKA_PASSWORD"
CONNECTION_VARIABLE = "TWOPHASE_TEST_KAFKA_CONNECTION"
#: Short client timeouts: a refused step fails in seconds.
FAST: dict[str, Any] = {"connect_timeout_ms": 5000, "request_timeout_ms": 5000,
                        "max_block_ms": 5000}


class Target:
    """A fresh topic, registry topic and id prefix on the secured broker (the registry made
    by the admin beforehand, so the sink needs no CREATE)."""

    def __init__(self, broker: KafkaBroker) -> None:
        self.broker = broker
        self.topic = broker.new_topic("secured")
        self.registry = f"{self.topic}-registry"
        self.prefix = f"{self.topic}-"
        admin = broker.admin()
        try:
            admin.create_topics([NewTopic(self.registry, 1, 1, topic_configs=REGISTRY_CONFIGS)])
        finally:
            admin.close()

    def grants(self) -> list[Grant]:
        return grants([self.topic], self.prefix, self.registry)

    def sink(self, **options: Any) -> KafkaSink:
        return KafkaSink(**{**self.connection(), **self.target_options(), **options})

    def connection(self) -> dict[str, Any]:
        """The probe user's connection options (short timeouts)."""
        return {**self.broker.options(PROBE_USER), **FAST}

    def target_options(self) -> dict[str, Any]:
        return {"topic": self.topic, "key": "order_id", "transactional_id_prefix": self.prefix,
                "registry_topic": self.registry, "transaction_timeout_ms": 60_000,
                "min_commit_window_ms": 0}


@contextlib.contextmanager
def granted(broker: KafkaBroker, acls: list[Grant]) -> Iterator[None]:
    """``acls`` granted to the probe user for the block, revoked after it (the cluster ACL
    would otherwise outlive the test)."""
    broker.grant(grant.acl(PRINCIPAL) for grant in acls)
    try:
        yield
    finally:
        broker.revoke(grant.acl(PRINCIPAL) for grant in acls)


def every_step(sink: KafkaSink) -> None:
    """What a query does through the sink: checks, a committed batch, a batch left in doubt,
    listed and aborted, and a batch on a reused pooled id."""
    sink.check_schema(ORDER_COLUMNS)
    assert commit(sink, prepare(sink, orders(0, 3))) is CommitOutcome.COMMITTED
    prepare(sink, orders(3, 3), batch=1)
    (in_doubt,) = list_in_doubt(sink, NAMESPACE)
    assert abort(sink, in_doubt) is AbortOutcome.ABORTED
    assert commit(sink, prepare(sink, orders(6, 3), batch=2)) is CommitOutcome.COMMITTED


# -- least privilege ---------------------------------------------------------------------------


def test_the_listed_acls_are_enough_and_the_records_go_over_sasl_ssl(
        kafka_secured_broker: KafkaBroker) -> None:
    broker = kafka_secured_broker
    target = Target(broker)
    with granted(broker, target.grants()):
        every_step(target.sink())
    assert broker.event_ids(target.topic) == [0, 1, 2, 6, 7, 8]
    allowed = broker.authorizer_log.read_text()
    assert (f"Principal = {PRINCIPAL} is Allowed operation = WRITE from host = 127.0.0.1 on "
            f"resource = Topic:LITERAL:{target.topic} for request = Produce") in allowed
    with pytest.raises(KafkaPythonError):  # the only client listener speaks TLS, not plain
        KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers, bootstrap_timeout_ms=2000)


@pytest.mark.parametrize(("missing", "named"), [
    (0, r"checking topic .* TOPIC_AUTHORIZATION_FAILED.*Fix: .*WRITE on the target topic"),
    (1, r"TOPIC_AUTHORIZATION_FAILED.*registry.*Fix: .*READ and WRITE on the registry topic"),
    (2, r"opening .*TOPIC_AUTHORIZATION_FAILED.*Fix: .*READ and WRITE on the registry topic"),
    (3, r"TRANSACTIONAL_ID_AUTHORIZATION_FAILED.*Fix: .*WRITE on its transactional ids, a "
        r"PREFIXED ACL"),
    (4, r"did not report transaction\.max\.timeout\.ms.*Fix: .*DESCRIBE_CONFIGS on the "
        r"cluster"),
], ids=["topic-write", "registry-read", "registry-write", "ids-write", "cluster-configs"])
def test_each_listed_acl_is_needed_and_its_absence_is_named(
        kafka_secured_broker: KafkaBroker, missing: int, named: str) -> None:
    target = Target(kafka_secured_broker)
    acls = target.grants()
    assert len(acls) == 5, "a new ACL in sinks.kafka.access needs a case here"
    with granted(kafka_secured_broker, acls[:missing] + acls[missing + 1:]), \
            pytest.raises(ConfigurationError, match=named):
        every_step(target.sink())


def test_the_sink_creates_its_registry_with_create_on_it_else_names_the_acl(
        kafka_secured_broker: KafkaBroker) -> None:
    broker = kafka_secured_broker
    topic = broker.new_topic("secured")
    registry = f"{topic}-new-registry"
    sink = KafkaSink(**broker.options(PROBE_USER), topic=topic, key="order_id",
                     transactional_id_prefix=f"{topic}-", registry_topic=registry,
                     transaction_timeout_ms=60_000, min_commit_window_ms=0, **FAST)
    needed = grants([topic], f"{topic}-", registry)
    with granted(broker, needed), pytest.raises(ConfigurationError,
                                                match=r"CreateTopics.*Fix: .*CREATE on it"):
        sink.check_schema(ORDER_COLUMNS)
    with granted(broker, grants([topic], f"{topic}-", registry, create_registry=True)):
        sink.check_schema(ORDER_COLUMNS)
        assert commit(sink, prepare(sink, orders(0, 2))) is CommitOutcome.COMMITTED
    assert broker.event_ids(topic) == [0, 1]


def test_status_and_cleanup_need_only_their_listed_acls(
        kafka_secured_broker: KafkaBroker) -> None:
    """``status --sink`` lists with READ on the registry and DESCRIBE on the ids; cleanup
    also aborts, with WRITE on the ids."""
    broker = kafka_secured_broker
    target = Target(broker)
    sink = target.sink()
    with granted(broker, target.grants()):
        sink.check_schema(ORDER_COLUMNS)
        prepare(sink, orders(0, 3))
    with granted(broker, status_grants(target.prefix, target.registry)):
        (listed,) = list_in_doubt(sink, NAMESPACE)
        with pytest.raises(ConfigurationError, match="TRANSACTIONAL_ID_AUTHORIZATION_FAILED"):
            abort(sink, listed)
    with granted(broker, cleanup_grants(target.prefix, target.registry)):
        (listed,) = list_in_doubt(sink, NAMESPACE)
        assert abort(sink, listed) is AbortOutcome.ABORTED
    assert broker.open_transactions(target.prefix) == {}


def test_the_acls_read_as_kafka_acls_commands() -> None:
    commands = [grant.command("User:etl") for grant in grants(["orders"], "etl-", "reg")]
    assert commands == [
        "--add --allow-principal User:etl --operation Write --topic orders",
        "--add --allow-principal User:etl --operation Read --topic reg",
        "--add --allow-principal User:etl --operation Write --topic reg",
        "--add --allow-principal User:etl --operation Write --transactional-id etl- "
        "--resource-pattern-type prefixed",
        "--add --allow-principal User:etl --operation DescribeConfigs --cluster",
    ]


# -- TLS verified by default -------------------------------------------------------------------


@pytest.mark.parametrize(("listener", "cause", "fix"), [
    (OTHER_CA_LISTENER, r"self.signed certificate in certificate chain \(it is not issued by "
                        r"a CA this client trusts\)", r"Fix: pass ca_bundle= the PEM file"),
    (WRONG_HOST_LISTENER, r"IP address mismatch.*\(it is not issued for the name dialled\)",
     r"Fix: connect to the brokers by a name .* ssl_check_hostname=False"),
], ids=["other-ca", "wrong-host"])
def test_a_certificate_a_client_would_refuse_is_refused_before_anything_is_written(
        kafka_secured_broker: KafkaBroker, listener: str, cause: str, fix: str) -> None:
    broker = kafka_secured_broker
    target = Target(broker)
    refused = f"127.0.0.1:{broker.refused_ports[listener]}"
    sink = target.sink(bootstrap_servers=refused)
    with granted(broker, target.grants()):
        with pytest.raises(ConfigurationError, match=f"broker at {refused}: {cause}.*{fix}"):
            sink.check_schema(ORDER_COLUMNS)  # the driver, at start
        with pytest.raises(ConfigurationError, match=cause):
            prepare(sink, orders(0, 3))  # an executor
    assert broker.event_ids(target.topic, "read_uncommitted") == []
    assert broker.open_transactions(target.prefix) == {}


def test_only_the_options_that_say_so_relax_verification(
        kafka_secured_broker: KafkaBroker) -> None:
    """``ssl_check_hostname=False`` skips the host name (the chain still verified);
    ``tls="require"``, every sink's one way to turn verification off, skips both."""
    broker = kafka_secured_broker
    target = Target(broker)
    wrong_host = f"127.0.0.1:{broker.refused_ports[WRONG_HOST_LISTENER]}"
    other_ca = f"127.0.0.1:{broker.refused_ports[OTHER_CA_LISTENER]}"
    with granted(broker, target.grants()):
        relaxed = target.sink(bootstrap_servers=wrong_host, ssl_check_hostname=False)
        relaxed.check_schema(ORDER_COLUMNS)
        assert commit(relaxed, prepare(relaxed, orders(0, 2))) is CommitOutcome.COMMITTED
        with pytest.raises(ConfigurationError, match="not issued by a CA"):
            target.sink(bootstrap_servers=other_ca,
                        ssl_check_hostname=False).check_schema(ORDER_COLUMNS)
        unverified = target.sink(bootstrap_servers=other_ca, tls="require", ca_bundle=None)
        unverified.check_schema(ORDER_COLUMNS)
        handle = prepare(unverified, orders(2, 2), batch=1)
        assert commit(unverified, handle) is CommitOutcome.COMMITTED
    assert broker.event_ids(target.topic) == [0, 1, 2, 3]


def test_security_properties_in_producer_configs_are_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"security properties \['ssl\.ca\.location'"
                                                 r"\].*Fix: pass tls="):
        KafkaSink("127.0.0.1:9", "t", producer_configs={"ssl.ca.location": "/x"})
    with pytest.raises(ConfigurationError, match=r"enable\.ssl\.certificate\.verification"):
        KafkaSink("127.0.0.1:9", "t",
                  producer_configs={"enable.ssl.certificate.verification": False})


# -- secrets by reference ----------------------------------------------------------------------


def test_a_connection_in_a_secret_writes_and_commits(
        kafka_secured_broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    """``connection=Secret(env=...)`` holding every connection option as JSON, the SASL
    password too: the executors' copy of the sink (pickled, without the password) writes over
    SASL_SSL, the driver's commits, the records are there."""
    broker = kafka_secured_broker
    assert broker.security is not None
    password = broker.security.passwords[PROBE_USER]
    target = Target(broker)
    held, left = as_connection_json(target.connection(), CONNECTION_OPTIONS)
    assert left == {}
    monkeypatch.setenv(CONNECTION_VARIABLE, held)
    sink = KafkaSink(connection=Secret(env=CONNECTION_VARIABLE), **target.target_options())
    with granted(broker, target.grants()):
        committed_through_its_pickled_copy(sink, password, orders(0, 5), sink.settings)
    assert broker.event_ids(target.topic) == [0, 1, 2, 3, 4]


def test_a_password_by_reference_is_in_no_repr_pickle_log_or_error(
        kafka_secured_broker: KafkaBroker, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    """The canary is the probe user's real password: the sink connects with it, with every
    logger at DEBUG and librdkafka's own debug output on, and fails once (a missing ACL) and
    once more with a wrong password; nothing produced carries either."""
    broker = kafka_secured_broker
    assert broker.security is not None
    canary = broker.security.passwords[PROBE_USER]
    wrong = f"wrong-{canary[::-1]}"
    monkeypatch.setenv(PASSWORD_VARIABLE, canary)
    caplog.set_level(logging.DEBUG)
    target = Target(broker)
    reference = {"sasl_plain_password": Secret(env=PASSWORD_VARIABLE),
                 "ssl_password": Secret(env=PASSWORD_VARIABLE),
                 "producer_configs": {"debug": "security,conf,eos"}}
    sink = target.sink(**reference)
    texts = [repr(sink), repr(sink.settings), pickle.dumps(sink).hex(),
             pickle.dumps(sink).decode("latin-1")]
    errors: list[TwoPhaseError] = []
    with granted(broker, target.grants()[:-1]):  # DESCRIBE_CONFIGS missing: check fails
        try:
            sink.check_schema(ORDER_COLUMNS)
        except TwoPhaseError as error:
            errors.append(error)
        assert commit(sink, prepare(sink, orders(0, 3))) is CommitOutcome.COMMITTED
    monkeypatch.setenv(PASSWORD_VARIABLE, wrong)
    with pytest.raises(TwoPhaseError) as refused:
        prepare(target.sink(**reference, connect_timeout_ms=2000), orders(3, 1))
    errors.append(refused.value)
    assert len(errors) == 2
    texts += [f"{error} {error.fix} {error!r}" for error in errors]
    texts += [pickle.dumps(sink).hex(), pickle.dumps(sink).decode("latin-1")]
    records = caplog.records
    assert any(record.name == "sinks.kafka.producer" and "[redacted]" in record.getMessage()
               for record in records), "librdkafka's debug output was not captured"
    texts += [f"{record.getMessage()} {record.exc_text or ''}" for record in records]
    out, err = capfd.readouterr()
    texts += [out, err]
    for secret in (canary, wrong):
        assert not [text for text in texts if secret in text], "a password leaked"
    assert broker.event_ids(target.topic) == [0, 1, 2]
