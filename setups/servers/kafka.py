"""Private Apache Kafka brokers for tests and benchmarks: real KRaft single-node brokers.

The test fixtures over it (the pytest plugin ``tests/fixtures/kafka.py``):

* ``kafka_broker`` (session): a :class:`KafkaBroker` (broker + controller in one JVM, loopback
  ports, its own log dir, ``-Xmx512m``, ``auto.create.topics.enable=false``) started once per
  test session, stopped at the end. :meth:`KafkaBroker.kill` (SIGKILL) and
  :meth:`KafkaBroker.restart` serve the crash tests; the log dir survives both.
* ``kafka_topic`` (function): a fresh topic on it (:data:`TOPIC_PARTITIONS` partitions).
* ``kafka_secured_broker`` (session): a broker serving SASL_SSL only (SCRAM-SHA-512 users made
  when it is formatted, a certificate of ``tls_ca``, the StandardAuthorizer, ACLs granted by
  :meth:`KafkaBroker.grant`), with two more listeners whose certificates a client must refuse
  (another CA's, another host name's) and one that requires a client certificate of ``tls_ca``
  (``ssl.client.auth=required``, mutual TLS; :attr:`KafkaBroker.client_cert_port`), and one
  that ends every SASL session a client does not renew within :data:`SESSION_LIFETIME_MS`
  (:attr:`KafkaBroker.reauth_port`): :class:`BrokerSecurity`. :meth:`KafkaBroker.set_password`
  makes a SCRAM user or changes its password.
* ``kafka_short_timeout_broker`` (module): a second broker whose
  ``transaction.max.timeout.ms`` is :data:`SHORT_MAX_TIMEOUT_MS`, for transactions that outlive
  their timeout.

The broker runs from the jars ``scripts/kafka-broker-jars`` fetches from Maven Central into
``~/.cache/twophase/kafka-<version>/libs`` (``scripts/test`` does it through
``scripts/bootstrap``). If they are missing the fixture FAILS (it never skips) and says so.
``bench/kafka_txn.py`` starts its broker through :func:`private_broker` too.

:func:`spark_kafka_jars` lists Spark's Kafka source jars (``spark.jars``), which
``scripts/kafka-broker-jars spark`` fetches into ``~/.cache/twophase/spark-kafka-<version>/jars``;
:meth:`KafkaBroker.produce_feed` fills a topic with a generated feed for that source.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import re
import secrets
import signal
import subprocess
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import (
    ACL,
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    NewTopic,
    ResourcePattern,
    ResourcePatternFilter,
    ResourceType,
    TransactionState,
    UserScramCredentialUpsertion,
)
from kafka.errors import KafkaError, TopicAlreadyExistsError
from kafka.structs import TopicPartition

from setups.servers.local import ServerMissingError, free_port, stop_process, write_owner_only
from setups.servers.tls import WRONG_HOST, CertificateAuthority, Issued

HOST = "127.0.0.1"
REPO = Path(__file__).resolve().parents[2]
POM = REPO / "scripts" / "kafka" / "pom.xml"
SPARK_POM = REPO / "scripts" / "kafka" / "spark" / "pom.xml"
JARS_HINT = "run scripts/kafka-broker-jars (scripts/test does it through scripts/bootstrap)"
SPARK_JARS_HINT = ("run scripts/kafka-broker-jars spark (scripts/test does it through "
                   "scripts/bootstrap with TWOPHASE_NEED_KAFKA=1)")
HEAP = "-Xmx512m"
READY_TIMEOUT_S = 90.0
#: A starting broker refuses connections: kafka-python's backoff between them doubles up to
#: 30 s by default, which would notice a broker up late by as much; capped here.
READY_BACKOFF_MAX_MS = 500
READ_TIMEOUT_S = 30.0
POLL_MS = 200
#: The broker answers a read's fetch at once when it has data; without data, after this.
READ_FETCH_WAIT_MS = 10
STOP_TIMEOUT_S = 20.0
TOPIC_PARTITIONS = 3
#: The ``transaction.max.timeout.ms`` of ``kafka_short_timeout_broker``.
SHORT_MAX_TIMEOUT_MS = 5000
#: How often the broker looks for timed-out transactions (default 10 s; faster for tests).
ABORT_CHECK_INTERVAL_MS = 1000

#: What a transaction not yet ended is in (ongoing, or on its way to an end).
OPEN_TRANSACTION_STATES = (TransactionState.ONGOING, TransactionState.PREPARE_COMMIT,
                           TransactionState.PREPARE_ABORT, TransactionState.PREPARE_EPOCH_FENCE)

_topics = itertools.count()

#: :func:`warm_up`'s topic: made by the first warm-up of a broker, it tells later ones that the
#: broker is warm already.
WARM_UP_TOPIC = "twophase-broker-warm-up"
#: How long :func:`warm_up` keeps the broker busy: on 2 cores a fresh broker's first ~10 s of
#: transactional load run slower than the rest (its JIT compiling, interpreted request paths).
WARM_UP_S = 12.0
#: Records in each of the warm-up's transactions: about a latency run's batch.
WARM_UP_RECORDS = 400
#: Transactional ids the warm-up turns through (a fresh producer and InitProducerId each time,
#: as every task of a KafkaSink does).
WARM_UP_IDS = 2
#: How long one of the warm-up's inits, flushes or commits may take.
WARM_UP_TIMEOUT_S = 60.0

LOG4J2 = """\
Configuration:
  status: warn
  Appenders:
    File:
      name: file
      fileName: "{log}"
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: INFO
      AppenderRef:
        ref: file
"""
#: The secured broker's authorizer decisions, allowed ones too (DEBUG), in a file of their own.
AUTHORIZER_LOG4J2 = """\
Configuration:
  status: warn
  Appenders:
    File:
      - name: file
        fileName: "{log}"
        PatternLayout:
          pattern: "[%d] %p %m (%c)%n"
      - name: authorizer
        fileName: "{authorizer_log}"
        PatternLayout:
          pattern: "[%d] %p %m%n"
  Loggers:
    Logger:
      name: kafka.authorizer.logger
      level: DEBUG
      additivity: false
      AppenderRef:
        ref: authorizer
    Root:
      level: INFO
      AppenderRef:
        ref: file
"""

#: The SASL mechanism of the secured broker (its users are made when its log dir is formatted).
SCRAM = "SCRAM-SHA-512"
#: The broker's own principal (inter-broker and controller connections): a super user.
BROKER_USER = "broker"
#: The tests' administrator (topics, ACLs, reads): a super user.
ADMIN_USER = "admin"
#: The sink's principal: it may do only what ACLs grant it.
APP_USER = "app"
#: Another principal like it, for tests that grant and revoke ACLs one by one.
PROBE_USER = "probe"
SECURED_USERS = (BROKER_USER, ADMIN_USER, APP_USER, PROBE_USER)
SUPER_USERS = (BROKER_USER, ADMIN_USER)
#: The secured broker's listener that clients use (its certificate is for this host).
SECURED_LISTENER = "SASL_SSL"
#: Listeners of the secured broker whose certificate a verifying client must refuse: issued
#: by another CA, and issued for another host name (the same broker: no second start).
OTHER_CA_LISTENER = "OTHER_CA"
WRONG_HOST_LISTENER = "WRONG_HOST"
#: A listener of the secured broker that also requires a client certificate of the run's CA
#: (SASL_SSL still: the principal is the SCRAM user, its ACLs as on the other listener).
CLIENT_CERT_LISTENER = "CLIENT_CERT"
#: A listener of the secured broker that ends a SASL session :data:`SESSION_LIFETIME_MS` after
#: its login unless the client logs in again (KIP-368, ``connections.max.reauth.ms``): a
#: password changed on the broker stops working on the connections made with it too, as on
#: brokers whose operators revoke credentials.
REAUTH_LISTENER = "REAUTH"
SESSION_LIFETIME_MS = 2000
#: How long :meth:`KafkaBroker.set_password` waits for one login with the new password.
LOGIN_TIMEOUT_MS = 2000
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule"
PLAIN_LOGIN = "org.apache.kafka.common.security.plain.PlainLoginModule"
#: Kafka's config provider that reads a value from a file (the file's name is the key).
DIRECTORY_PROVIDER = "org.apache.kafka.common.config.provider.DirectoryConfigProvider"


class KafkaJarsMissingError(ServerMissingError):
    """The broker jars are not in the cache."""


def kafka_version() -> str:
    match = re.search(r"<kafka.version>(.+?)</kafka.version>", POM.read_text())
    if match is None:
        raise KafkaJarsMissingError(f"no <kafka.version> in {POM}")
    return match.group(1)


def _cache() -> Path:
    return Path(os.environ.get("TWOPHASE_CACHE", Path.home() / ".cache" / "twophase"))


def spark_kafka_jars() -> list[str]:
    """Spark's Kafka source and the jars it needs beyond pyspark's, for ``spark.jars``; raises
    :class:`KafkaJarsMissingError` naming the fix."""
    match = re.search(r"<spark.kafka.version>(.+?)</spark.kafka.version>", SPARK_POM.read_text())
    if match is None:
        raise KafkaJarsMissingError(f"no <spark.kafka.version> in {SPARK_POM}")
    jars = _cache() / f"spark-kafka-{match.group(1)}" / "jars"
    found = sorted(str(jar) for jar in jars.glob("*.jar"))
    if not (jars.parent / ".complete").exists() or not any("spark-sql-kafka" in j for j in found):
        raise KafkaJarsMissingError(f"Spark's Kafka source jars are not in {jars}: "
                                    f"{SPARK_JARS_HINT}")
    return found


def libs_dir() -> Path:
    """The cached broker jars; raises :class:`KafkaJarsMissingError` naming the fix."""
    cache = _cache()
    version = kafka_version()
    libs = cache / f"kafka-{version}" / "libs"
    if not (libs.parent / ".complete").exists() or not any(libs.glob("kafka_2.13-*.jar")):
        raise KafkaJarsMissingError(f"the Apache Kafka {version} broker jars are not in {libs}: "
                                    f"{JARS_HINT}")
    return libs


@dataclass(frozen=True)
class BrokerSecurity:
    """What makes a broker a secured one: SASL_SSL (SCRAM) with a certificate of the run's CA,
    SCRAM users with their passwords, and the StandardAuthorizer (super users: the broker and
    the admin; everyone else only what ACLs grant).

    The controller listener stays on loopback as SASL_PLAINTEXT with PLAIN (KRaft controllers
    cannot check SCRAM credentials: those live in the metadata they serve), its one user the
    broker. ``refused`` are further SASL_SSL listeners whose certificates a client must refuse;
    :data:`CLIENT_CERT_LISTENER`, if given a port, presents :attr:`certificate` and requires a
    client certificate issued by the CA of :attr:`cafile` (the brokers' trust store);
    :data:`REAUTH_LISTENER`, if given one, ends sessions after :data:`SESSION_LIFETIME_MS`.
    """

    cafile: Path
    certificate: Issued
    passwords: Mapping[str, str]
    refused: Mapping[str, Issued] = field(default_factory=dict)

    @classmethod
    def issued(cls, ca: CertificateAuthority, other_ca: CertificateAuthority,
               name: str = "kafka") -> BrokerSecurity:
        """A certificate from ``ca``, one from ``other_ca`` and one for :data:`WRONG_HOST`
        (the refused listeners), and a fresh password per user."""
        return cls(ca.cafile, ca.issue(name),
                   {user: secrets.token_hex(16) for user in SECURED_USERS},
                   {OTHER_CA_LISTENER: other_ca.issue(f"{name}-other-ca"),
                    WRONG_HOST_LISTENER: ca.issue(f"{name}-wrong-host", (WRONG_HOST,))})

    def client_configs(self, user: str) -> dict[str, Any]:
        """kafka-python's options to connect as ``user`` (verifying the certificate and host)."""
        return {"security_protocol": "SASL_SSL", "sasl_mechanism": SCRAM,
                "sasl_plain_username": user, "sasl_plain_password": self.passwords[user],
                "ssl_cafile": str(self.cafile), "ssl_check_hostname": True}

    def sink_options(self, user: str) -> dict[str, Any]:
        """:class:`~sinks.kafka.KafkaSink`'s options to connect as ``user`` (TLS verified)."""
        return {"tls": "verify", "ca_bundle": str(self.cafile), "sasl_mechanism": SCRAM,
                "sasl_plain_username": user, "sasl_plain_password": self.passwords[user]}

    def write_password(self, user: str, path: Path) -> Path:
        """``user``'s password into a new file at ``path`` only its owner can read."""
        write_owner_only(path, self.passwords[user])
        return path

    def spark_source_options(self, user: str, password_file: Path) -> dict[str, str]:
        """Spark's Kafka source options to read as ``user`` (verifying the certificate and
        host), the password by reference: the Java client reads ``password_file``."""
        password = f"${{dir:{password_file.parent}:{password_file.name}}}"
        return {"kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": SCRAM,
                "kafka.sasl.jaas.config":
                    f'{SCRAM_LOGIN} required username="{user}" password="{password}";',
                "kafka.config.providers": "dir",
                "kafka.config.providers.dir.class": DIRECTORY_PROVIDER,
                "kafka.ssl.truststore.type": "PEM",
                "kafka.ssl.truststore.location": str(self.cafile)}

    def scram_users(self) -> list[str]:
        """``kafka-storage format --add-scram`` arguments: every user's SCRAM credential."""
        return [f"--add-scram={SCRAM}=[name={user},password={password}]"
                for user, password in self.passwords.items()]

    def settings(self, ports: Mapping[str, int], controller_port: int) -> dict[str, str]:
        """``server.properties`` of the secured listeners (``ports`` by listener name)."""
        broker = self.passwords[BROKER_USER]
        listeners = {**{name: f"{HOST}:{port}" for name, port in ports.items()},
                     "CONTROLLER": f"{HOST}:{controller_port}"}
        settings = {
            "listeners": ",".join(f"{name}://{address}" for name, address in listeners.items()),
            "advertised.listeners": ",".join(f"{name}://{HOST}:{port}"
                                             for name, port in ports.items()),
            "inter.broker.listener.name": SECURED_LISTENER,
            "listener.security.protocol.map": ",".join(
                [f"{name}:SASL_SSL" for name in ports] + ["CONTROLLER:SASL_PLAINTEXT"]),
            "sasl.enabled.mechanisms": SCRAM,
            "sasl.mechanism.inter.broker.protocol": SCRAM,
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.controller.plain.sasl.jaas.config":
                f'{PLAIN_LOGIN} required username="{BROKER_USER}" password="{broker}" '
                f'user_{BROKER_USER}="{broker}";',
            "authorizer.class.name": AUTHORIZER,
            "super.users": ";".join(f"User:{user}" for user in SUPER_USERS),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.cafile),
        }
        for name in ports:
            issued = self.refused.get(name, self.certificate)
            prefix = f"listener.name.{name.lower()}"
            settings |= {
                f"{prefix}.{SCRAM.lower()}.sasl.jaas.config":
                    f'{SCRAM_LOGIN} required username="{BROKER_USER}" password="{broker}";',
                f"{prefix}.ssl.keystore.type": "PEM",
                f"{prefix}.ssl.keystore.certificate.chain": _inline(issued.certfile),
                f"{prefix}.ssl.keystore.key": _inline(issued.keyfile),
            }
        if CLIENT_CERT_LISTENER in ports:
            settings[f"listener.name.{CLIENT_CERT_LISTENER.lower()}.ssl.client.auth"] = "required"
        if REAUTH_LISTENER in ports:
            settings[f"listener.name.{REAUTH_LISTENER.lower()}.{SCRAM.lower()}."
                     "connections.max.reauth.ms"] = str(SESSION_LIFETIME_MS)
        return settings


def _inline(pem: Path) -> str:
    """A PEM file as one ``server.properties`` value (Java's properties read ``\\n``)."""
    return pem.read_text().strip().replace("\n", "\\n")


def _properties(port: int, controller_port: int, data: Path, overrides: dict[str, str]) -> str:
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.bootstrap.servers": f"{HOST}:{controller_port}",
        "listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(data),
        "num.partitions": "1",
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "transaction.abort.timed.out.transaction.cleanup.interval.ms":
            str(ABORT_CHECK_INTERVAL_MS),
        **overrides,
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


class TopicReader:
    """Reads whole topics as a reader of them sees them, through one consumer reused by every
    read (a model checks what is visible after every step: a consumer per read would cost a
    connection and a metadata round trip each time). Close it, or use it as a context manager.
    """

    def __init__(self, bootstrap_servers: str, isolation: str = "read_committed",
                 **configs: Any) -> None:
        self._consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers,
                                       isolation_level=isolation, enable_auto_commit=False,
                                       fetch_max_wait_ms=READ_FETCH_WAIT_MS, **configs)
        self._partitions: dict[str, list[TopicPartition]] = {}

    def read(self, topic: str) -> list[Any]:
        """Every record of ``topic`` from the beginning to the end offsets (with read_committed:
        the last stable offset)."""
        partitions = self._partitions_of(topic)
        consumer = self._consumer
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        records: list[Any] = []
        deadline = time.monotonic() + READ_TIMEOUT_S
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {topic} to {ends} in {READ_TIMEOUT_S}s")
            for batch in consumer.poll(timeout_ms=POLL_MS).values():
                records.extend(batch)
        return records

    def event_ids(self, topic: str) -> list[int]:
        """The sorted ``event_id`` of every JSON record of ``topic``."""
        return sorted(json.loads(record.value)["event_id"] for record in self.read(topic))

    def _partitions_of(self, topic: str) -> list[TopicPartition]:
        if topic not in self._partitions:
            found = self._consumer.partitions_for_topic(topic)
            if not found:
                raise LookupError(f"the broker does not list topic {topic}")
            self._partitions[topic] = [TopicPartition(topic, p) for p in sorted(found)]
        return self._partitions[topic]

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> TopicReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class KafkaBroker:
    """One KRaft broker process on loopback ports, restartable on the same log dir.

    A secured one (``security``) serves SASL_SSL on :attr:`port` only; its clients here (admin,
    readers, feeds) connect as :data:`ADMIN_USER`, and :meth:`options` are the sink's, as
    :data:`APP_USER`, who may do what :meth:`grant` allows and nothing more."""

    port: int
    home: Path
    libs: Path
    process: subprocess.Popen[bytes] | None = None
    #: Seconds the last start took until the broker served metadata.
    start_s: float = 0.0
    settings: dict[str, str] = field(default_factory=dict)
    security: BrokerSecurity | None = None
    #: The secured broker's listeners whose certificates must be refused, by name.
    refused_ports: dict[str, int] = field(default_factory=dict)
    #: The secured broker's listener that requires a client certificate (mutual TLS).
    client_cert_port: int | None = None
    #: The secured broker's listener that ends SASL sessions (:data:`REAUTH_LISTENER`).
    reauth_port: int | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def log(self) -> Path:
        return self.home / "server.log"

    @property
    def authorizer_log(self) -> Path:
        """The secured broker's authorizer decisions (allowed ones too), one a line."""
        return self.home / "authorizer.log"

    def options(self, user: str = APP_USER) -> dict[str, Any]:
        """What a KafkaSink needs to reach it (the crash suite passes these to the driver):
        on a secured broker, as ``user`` over SASL_SSL, verifying the certificate."""
        security = {} if self.security is None else self.security.sink_options(user)
        return {"bootstrap_servers": self.bootstrap_servers, **security}

    def client_configs(self, user: str = ADMIN_USER) -> dict[str, Any]:
        """kafka-python's security options for ``user`` (none on a plain broker)."""
        return {} if self.security is None else self.security.client_configs(user)

    def _java(self, main: str, *args: str, heap: str = HEAP) -> list[str]:
        return ["java", heap, "-cp", f"{self.libs}/*",
                f"-Dlog4j2.configurationFile={self.home / 'log4j2.yaml'}", main, *args]

    def format(self) -> None:
        cluster = uuid.uuid4()
        cluster_id = base64.urlsafe_b64encode(cluster.bytes).decode().rstrip("=")
        users = [] if self.security is None else self.security.scram_users()
        formatted = subprocess.run(  # "=": a cluster id may begin with "-"
            self._java("kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}",
                       "-c", str(self.home / "server.properties"), "--standalone", *users,
                       heap="-Xmx256m"),
            capture_output=True, text=True, check=False)
        if formatted.returncode != 0:
            raise RuntimeError(f"formatting the Kafka log dir failed: {formatted.stdout}"
                               f"{formatted.stderr}")

    def start(self) -> None:
        started = time.monotonic()
        with (self.home / "stdout.log").open("ab") as out:
            self.process = subprocess.Popen(
                self._java("kafka.Kafka", str(self.home / "server.properties")),
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready()
        self.start_s = time.monotonic() - started

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        assert self.process is not None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"Kafka broker exited with {self.process.returncode}: "
                                   f"{self._tail()}")
            with contextlib.suppress(Exception):
                admin = KafkaAdminClient(bootstrap_servers=self.bootstrap_servers,
                                         request_timeout_ms=3000,
                                         reconnect_backoff_max_ms=READY_BACKOFF_MAX_MS,
                                         **self.client_configs())
                try:
                    admin.describe_cluster()
                    return
                finally:
                    admin.close()
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"Kafka broker did not serve within {READY_TIMEOUT_S}s: "
                           f"{self._tail()}")

    def _tail(self) -> str:
        texts = [path.read_text(errors="replace")[-3000:]
                 for path in (self.home / "stdout.log", self.log) if path.exists()]
        return "\n".join(texts)

    def rss_mib(self) -> float:
        """Resident memory of the broker's JVM, in MiB."""
        assert self.process is not None
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        kib = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
        return kib / 1024

    def kill(self) -> None:
        """SIGKILL the broker (a crash); :meth:`start` brings it back on the same data."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        stop_process(self.process, STOP_TIMEOUT_S)

    def restart(self, *, crash: bool = True) -> None:
        """Kill (or stop) the broker and start it again on the same ports and data."""
        if crash:
            self.kill()
        else:
            self.stop()
        self.start()

    def warm_up(self) -> bool:
        """This broker warmed for a benchmark, once (:func:`warm_up`; a plain broker: the
        warm-up's clients take no security options)."""
        return warm_up(self.bootstrap_servers)

    def admin(self) -> KafkaAdminClient:
        return KafkaAdminClient(bootstrap_servers=self.bootstrap_servers,
                                **self.client_configs())

    def reader(self, isolation: str = "read_committed") -> TopicReader:
        """A reader of whole topics (one consumer, reused by every read until closed)."""
        return TopicReader(self.bootstrap_servers, isolation, **self.client_configs())

    def grant(self, acls: Iterable[ACL]) -> None:
        """Create ``acls`` (as the admin), and return once the broker's authorizer has them
        (the controller commits them, the broker applies its metadata a moment later)."""
        acls = list(acls)
        admin = self.admin()
        try:
            created = admin.create_acls(acls)
            if created["failed"]:
                raise RuntimeError(f"the broker refused ACLs: {created['failed']}")
            deadline = time.monotonic() + READY_TIMEOUT_S
            while not all(_applied(admin, acl) for acl in acls):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"ACLs not applied within {READY_TIMEOUT_S}s: {acls}")
                time.sleep(0.05)
        finally:
            admin.close()

    def set_password(self, user: str, password: str) -> None:
        """Make ``user``'s SCRAM credential, or change its password (as the admin), and return
        once the broker logs ``user`` in with it (the controller commits it, the broker
        applies its metadata a moment later)."""
        admin = self.admin()
        try:
            failed = {name: error for name, error in admin.alter_user_scram_credentials(
                [UserScramCredentialUpsertion(user, SCRAM, password)]).items() if error}
        finally:
            admin.close()
        if failed:
            raise RuntimeError(f"the broker refused the SCRAM credential: {failed}")
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self._logs_in(user, password):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{user} cannot log in {READY_TIMEOUT_S}s after the "
                                   "change of its password")

    def _logs_in(self, user: str, password: str) -> bool:
        """Whether a client logging in as ``user`` with ``password`` bootstraps."""
        configs = {**self.client_configs(), "sasl_plain_username": user,
                   "sasl_plain_password": password}
        try:
            admin = KafkaAdminClient(bootstrap_servers=self.bootstrap_servers,
                                     bootstrap_timeout_ms=LOGIN_TIMEOUT_MS, **configs)
        except KafkaError:
            return False
        admin.close()
        return True

    def revoke(self, acls: Iterable[ACL]) -> None:
        """Delete exactly ``acls`` (as the admin)."""
        admin = self.admin()
        try:
            admin.delete_acls([_filter_of(acl) for acl in acls])
        finally:
            admin.close()

    def read(self, topic: str, isolation: str = "read_committed") -> list[Any]:
        """Every record a fresh consumer reads from ``topic`` (see :meth:`TopicReader.read`)."""
        with self.reader(isolation) as reader:
            return reader.read(topic)

    def event_ids(self, topic: str, isolation: str = "read_committed") -> list[int]:
        """The sorted ``event_id`` of every JSON record a fresh reader of ``topic`` sees."""
        with self.reader(isolation) as reader:
            return reader.event_ids(topic)

    def produce_feed(self, topic: str, feed_dir: Path, key: str | None = None) -> int:
        """Every line of the feed's files (:func:`~twophase.testing.driver.generate_feed`), in
        order, as one record each (keyed by the JSON field ``key``, if given) by a plain
        producer, flushed; returns the count."""
        producer = KafkaProducer(bootstrap_servers=self.bootstrap_servers, acks="all",
                                 **self.client_configs())
        sent = 0
        try:
            for path in sorted(feed_dir.glob("*.json")):
                for line in path.read_bytes().splitlines():
                    record_key = None if key is None else str(json.loads(line)[key]).encode()
                    producer.send(topic, line, key=record_key)
                    sent += 1
            producer.flush()
        finally:
            producer.close()
        return sent

    def open_transactions(self, transactional_id_prefix: str) -> dict[str, set[str]]:
        """Transactional ids with ``transactional_id_prefix`` that the coordinators list as
        open (:data:`OPEN_TRANSACTION_STATES`), each with the topics it has written to."""
        admin = self.admin()
        try:
            listed = admin.list_transactions(
                state_filters=[state.value for state in OPEN_TRANSACTION_STATES],
                transactional_id_pattern=re.escape(transactional_id_prefix) + ".*")
            ids = sorted(listing.transactional_id for listings in listed.values()
                         for listing in listings)
            described = admin.describe_transactions(ids) if ids else {}
        finally:
            admin.close()
        return {tid: {partition.topic for partition in description.topic_partitions}
                for tid, description in described.items()}

    def new_topic(self, prefix: str = "twophase", partitions: int = TOPIC_PARTITIONS,
                  configs: Mapping[str, str] | None = None) -> str:
        """A new topic (with the topic ``configs`` given), once the broker lists it (its
        metadata lags the controller's commit: a sink checking the topic right after
        ``create_topics`` could miss it)."""
        name = f"{prefix}-{os.getpid()}-{next(_topics)}"
        admin = self.admin()
        try:
            admin.create_topics([NewTopic(name, partitions, 1,
                                          topic_configs=dict(configs or {}))])
            deadline = time.monotonic() + READY_TIMEOUT_S
            while name not in admin.list_topics():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"topic {name} not listed {READY_TIMEOUT_S}s after "
                                       "its creation")
                time.sleep(0.05)
        finally:
            admin.close()
        return name


def warm_up(bootstrap_servers: str, seconds: float = WARM_UP_S, topic: str = WARM_UP_TOPIC
            ) -> bool:
    """Warm a fresh plain broker's transactional paths for ``seconds``, once; False if it was
    warmed already (``topic`` exists).

    A benchmark's, not a sink's, warm-up: a fresh broker's first transactional use creates
    ``__transaction_state`` and loads its coordinator (``init_transactions`` waits ~1 s through
    "not coordinator" answers), and for its first seconds of load its JVM interprets and
    compiles the request paths (InitProducerId, AddPartitionsToTxn, Produce, EndTxn and its
    markers, read_committed Fetch, ListTransactions, DescribeTransactions), slowing every
    client and, on a small machine, every other process too. A long-running cluster is past
    all of this; whichever writer a benchmark happens to run first on a fresh broker is not,
    and would pay for it alone. So this drives that mix, as a KafkaSink's tasks and driver and
    a read_committed reader do, into the throwaway ``topic``: a fresh transactional producer
    per transaction (:data:`WARM_UP_IDS` ids in turn, named after ``topic``),
    :data:`WARM_UP_RECORDS` records, commit, the transactions listed and described, the
    committed records read. Every transaction it opens it commits."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers)
    try:
        try:
            admin.create_topics([NewTopic(topic, TOPIC_PARTITIONS, 1)])
        except TopicAlreadyExistsError:
            return False
        consumer = confluent_kafka.Consumer({
            "bootstrap.servers": bootstrap_servers, "group.id": topic,
            "isolation.level": "read_committed", "enable.auto.commit": False})
        consumer.assign([confluent_kafka.TopicPartition(topic, number,
                                                        confluent_kafka.OFFSET_BEGINNING)
                         for number in range(TOPIC_PARTITIONS)])
        try:
            _warm_transactions(bootstrap_servers, admin, consumer, seconds, topic)
        finally:
            consumer.close()
        return True
    finally:
        admin.close()


def _warm_transactions(bootstrap_servers: str, admin: KafkaAdminClient,
                       consumer: confluent_kafka.Consumer, seconds: float, topic: str) -> None:
    ids = [f"{topic}-{number}" for number in range(WARM_UP_IDS)]
    value = b"x" * 100
    deadline = time.monotonic() + seconds
    for turn in itertools.count():
        if time.monotonic() > deadline:
            return
        producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap_servers,
                                             "transactional.id": ids[turn % WARM_UP_IDS],
                                             "linger.ms": 5})
        producer.init_transactions(WARM_UP_TIMEOUT_S)
        producer.begin_transaction()
        for record in range(WARM_UP_RECORDS):
            producer.produce(topic, value, key=str(record).encode())
        producer.flush(WARM_UP_TIMEOUT_S)
        admin.list_transactions(transactional_id_pattern=re.escape(topic) + ".*")
        admin.describe_transactions(ids[:1 + min(turn, WARM_UP_IDS - 1)])
        producer.commit_transaction(WARM_UP_TIMEOUT_S)
        consumer.consume(num_messages=10 * WARM_UP_RECORDS, timeout=0.01)


def _applied(admin: KafkaAdminClient, acl: ACL) -> bool:
    found, _error = admin.describe_acls(_filter_of(acl))
    return bool(found)


def _filter_of(acl: ACL) -> ACLFilter:
    pattern = acl.resource_pattern
    return ACLFilter(acl.principal, acl.host, acl.operation, acl.permission_type,
                     ResourcePatternFilter(pattern.resource_type, pattern.resource_name,
                                           pattern.pattern_type))


def allow(user: str, operation: ACLOperation, resource: ResourceType, name: str,
          pattern: ACLResourcePatternType = ACLResourcePatternType.LITERAL) -> ACL:
    """An ACL allowing ``user`` ``operation`` on a resource, from any host."""
    return ACL(f"User:{user}", "*", operation, ACLPermissionType.ALLOW,
               ResourcePattern(resource, name, pattern))


@contextlib.contextmanager
def private_broker(home: Path, settings: dict[str, str] | None = None, *,
                   port: int | None = None,
                   security: BrokerSecurity | None = None) -> Iterator[KafkaBroker]:
    """Format and start a broker in ``home`` (on ``port``, or a free one), wait until it
    serves, stop it on exit.

    ``settings`` override ``server.properties`` (dots as in Kafka's names), e.g.
    ``private_broker(home, {"transaction.max.timeout.ms": "5000"})``. With ``security`` it
    serves SASL_SSL only (:class:`BrokerSecurity`); its files are readable by the owner only.
    """
    libs = libs_dir()
    home.mkdir(parents=True, exist_ok=True)
    controller_port = free_port(HOST)
    broker = KafkaBroker(port or free_port(HOST), home, libs, settings=dict(settings or {}),
                         security=security)
    overrides = broker.settings
    log4j2 = LOG4J2.format(log=broker.log)
    if security is not None:
        broker.refused_ports = {name: free_port(HOST) for name in security.refused}
        broker.client_cert_port = free_port(HOST)
        broker.reauth_port = free_port(HOST)
        overrides = {**security.settings({SECURED_LISTENER: broker.port,
                                          **broker.refused_ports,
                                          CLIENT_CERT_LISTENER: broker.client_cert_port,
                                          REAUTH_LISTENER: broker.reauth_port},
                                         controller_port),
                     **overrides}
        log4j2 = AUTHORIZER_LOG4J2.format(log=broker.log, authorizer_log=broker.authorizer_log)
    (home / "log4j2.yaml").write_text(log4j2)
    write_owner_only(home / "server.properties",
                      _properties(broker.port, controller_port, home / "data", overrides))
    broker.format()
    try:
        broker.start()
        yield broker
    finally:
        broker.stop()
