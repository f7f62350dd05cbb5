"""Private Kafka Connect workers for tests: Apache Kafka's own Connect runtime, with Debezium's
PostgreSQL connector as a plugin, against a private broker (:mod:`setups.servers.kafka`).

A :class:`ConnectWorker` is one *distributed* worker JVM (a group of one) on a free loopback
port for its REST API. Distributed, not standalone: a connector created through the REST API
and its source offsets live in the broker's topics (``<group>-configs``, ``<group>-offsets``,
``<group>-status``), so a worker SIGKILLed (:meth:`ConnectWorker.kill`) and started again
(:meth:`ConnectWorker.start`, or :meth:`ConnectWorker.restart`) on the same group runs its
connectors again from their last committed offsets, without being told: Debezium then
re-delivers what it sent after its last offset commit (at least once). Standalone keeps
offsets in a local file as well, but forgets connectors created through its REST API.

:func:`start_worker` starts one (it waits until its REST API answers and the worker has joined
its group) and stops it on exit; :func:`debezium_postgres_config` is a Debezium PostgreSQL
connector's configuration (pgoutput, JSON keys and values without schemas, the topic made by
the worker), :meth:`ConnectWorker.put_connector` creates or changes a connector and
:meth:`ConnectWorker.wait_running` waits until it and its task run. Only processes a worker
started are ever signalled, by their pid.

The worker runs from the jars ``scripts/kafka-broker-jars connect`` fetches from Maven Central
(``scripts/test`` does it through ``scripts/bootstrap`` with ``TWOPHASE_NEED_KAFKA=1``): the
runtime into ``~/.cache/twophase/kafka-connect-<kafka version>/libs`` (the broker's Kafka
version: :func:`connect_libs` refuses another one), Debezium into the plugin folder
``~/.cache/twophase/debezium-postgres-<version>/plugins/debezium-connector-postgres``. If they
are missing, starting a worker FAILS (never skips) and says how to fetch them.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer
from kafka.structs import TopicPartition

from setups.servers.kafka import LOG4J2, kafka_version
from setups.servers.local import HOST, ServerProcess, free_port

REPO = Path(__file__).resolve().parents[2]
CONNECT_POM = REPO / "scripts" / "kafka" / "connect" / "pom.xml"
DEBEZIUM_POM = REPO / "scripts" / "kafka" / "connect" / "debezium" / "pom.xml"
JARS_HINT = ("run scripts/kafka-broker-jars connect (scripts/test does it through "
             "scripts/bootstrap with TWOPHASE_NEED_KAFKA=1)")
#: The connector's class, as the worker lists it among its plugins.
DEBEZIUM_POSTGRES = "io.debezium.connector.postgresql.PostgresConnector"
HEAP = "-Xmx384m"
#: The worker's JVM starts, finds its plugins, creates its topics and joins its group.
READY_TIMEOUT_S = 90.0
#: How long a connector and its task may take to run (Debezium creates its replication slot
#: and publication first; after a SIGKILL the old slot stays active for a moment).
RUNNING_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
REQUEST_TIMEOUT_S = 10.0
POLL_INTERVAL_S = 0.2
#: How often the worker commits its source tasks' offsets (Kafka's default: one minute). What
#: Debezium sent after the last commit, it sends again after a crash: at least once.
OFFSET_FLUSH_INTERVAL_MS = 2000
#: The group's session timeout: a SIGKILLed worker's membership ends after it, and its
#: successor is given the connectors (the broker's smallest by default).
SESSION_TIMEOUT_MS = 6000


_groups = itertools.count()


class ConnectJarsMissingError(RuntimeError):
    """The Connect worker's or Debezium's jars are not in the cache (or of the wrong version)."""


class ConnectorFailedError(RuntimeError):
    """A connector or its task reported FAILED (its trace in the message)."""


def _cache() -> Path:
    return Path(os.environ.get("TWOPHASE_CACHE", Path.home() / ".cache" / "twophase"))


def _property(pom: Path, name: str) -> str:
    match = re.search(rf"<{re.escape(name)}>(.+?)</{re.escape(name)}>", pom.read_text())
    if match is None:
        raise ConnectJarsMissingError(f"no <{name}> in {pom}")
    return match.group(1)


def connect_libs() -> Path:
    """The worker's classpath folder (the broker's Kafka version); raises
    :class:`ConnectJarsMissingError` naming the fix."""
    version = _property(CONNECT_POM, "connect.kafka.version")
    if version != kafka_version():
        raise ConnectJarsMissingError(
            f"the Connect worker's Kafka {version} ({CONNECT_POM}) is not the broker's "
            f"{kafka_version()}: keep connect.kafka.version at kafka.version")
    libs = _cache() / f"kafka-connect-{version}" / "libs"
    if not (libs.parent / ".complete").exists() or not any(libs.glob("connect-runtime-*.jar")):
        raise ConnectJarsMissingError(f"the Kafka Connect {version} jars are not in {libs}: "
                                      f"{JARS_HINT}")
    return libs


def debezium_version() -> str:
    return _property(DEBEZIUM_POM, "debezium.version")


def plugin_path() -> Path:
    """The worker's ``plugin.path``: a folder holding Debezium's plugin folder; raises
    :class:`ConnectJarsMissingError` naming the fix."""
    version = debezium_version()
    plugins = _cache() / f"debezium-postgres-{version}" / "plugins"
    if (not (plugins.parent / ".complete").exists()
            or not any(plugins.glob("*/debezium-connector-postgres-*.jar"))):
        raise ConnectJarsMissingError(f"Debezium's PostgreSQL connector {version} is not in "
                                      f"{plugins}: {JARS_HINT}")
    return plugins


def debezium_postgres_config(
    *, host: str, port: int, database: str, user: str, password: str, topic_prefix: str,
    tables: Sequence[str], slot: str, publication: str | None = None,
    snapshot_mode: str = "no_data", partitions: int = 1,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A Debezium PostgreSQL connector's configuration: logical decoding with ``pgoutput``
    from replication slot ``slot``, the changes of ``tables`` (``schema.table``) into topics
    ``<topic_prefix>.<schema>.<table>`` that the worker creates (``partitions`` each, one
    replica); keys and values JSON without schemas; a delete sends its event
    (``op = 'd'``, ``before`` the old key) and then a tombstone (a null value); numerics as
    strings (exact: read them as DECIMAL), times as Connect's types (epoch milliseconds); a
    publication of just ``tables`` created by the connector
    (``publication.autocreate.mode=filtered``; its name
    ``<slot>_publication`` unless given). ``snapshot_mode`` ``"no_data"``: changes from the
    slot's creation on; ``"initial"``: the tables' rows first (``op = 'r'``). ``extra``:
    further settings over these."""
    config = {
        "connector.class": DEBEZIUM_POSTGRES,
        "tasks.max": "1",
        "plugin.name": "pgoutput",
        "database.hostname": host,
        "database.port": str(port),
        "database.user": user,
        "database.password": password,
        "database.dbname": database,
        "topic.prefix": topic_prefix,
        "table.include.list": ",".join(re.escape(table) for table in tables),
        "slot.name": slot,
        "publication.name": publication or f"{slot}_publication",
        "publication.autocreate.mode": "filtered",
        "snapshot.mode": snapshot_mode,
        "decimal.handling.mode": "string",
        "time.precision.mode": "connect",
        "tombstones.on.delete": "true",
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": "false",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable": "false",
        "topic.creation.default.replication.factor": "1",
        "topic.creation.default.partitions": str(partitions),
        # a SIGKILLed worker's walsender may hold the slot a moment: retry sooner than 10 s
        "slot.retry.delay.ms": "1000",
        "slot.max.retries": "30",
        "errors.max.retries": "-1",
        "errors.retry.delay.max.ms": "2000",
    }
    return {**config, **(extra or {})}


class ConnectWorker(ServerProcess):
    """One distributed Connect worker JVM in a process session of its own (its pid the
    session's), its REST API on ``127.0.0.1:port``, its state in the broker's topics of
    ``group``; :meth:`kill` (SIGKILL) and :meth:`start` keep the group, so its connectors
    run again from their last committed offsets."""

    program = "Kafka Connect worker"
    ready_timeout_s = READY_TIMEOUT_S
    stop_timeout_s = STOP_TIMEOUT_S
    poll_interval_s = POLL_INTERVAL_S

    def __init__(self, home: Path, bootstrap_servers: str, *, group: str | None = None,
                 settings: Mapping[str, str] | None = None) -> None:
        super().__init__(home / "connect.log", free_port(HOST))
        self.home = home
        self.bootstrap_servers = bootstrap_servers
        self.libs = connect_libs()
        self.plugins = plugin_path()
        self.group = group or f"twophase-connect-{os.getpid()}-{next(_groups)}"
        self.settings = dict(settings or {})
        #: Seconds the last start took until the worker served (joined its group).
        self.start_s = 0.0

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def properties(self) -> dict[str, str]:
        """The worker's ``connect-distributed.properties``."""
        return {
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": self.group,
            "config.storage.topic": f"{self.group}-configs",
            "offset.storage.topic": f"{self.group}-offsets",
            "status.storage.topic": f"{self.group}-status",
            "config.storage.replication.factor": "1",
            "offset.storage.replication.factor": "1",
            "status.storage.replication.factor": "1",
            "offset.storage.partitions": "1",
            "status.storage.partitions": "1",
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "key.converter.schemas.enable": "false",
            "value.converter.schemas.enable": "false",
            "offset.flush.interval.ms": str(OFFSET_FLUSH_INTERVAL_MS),
            "listeners": f"http://{HOST}:{self.port}",
            "rest.advertised.host.name": HOST,
            "rest.advertised.port": str(self.port),
            "plugin.path": str(self.plugins),
            # every plugin here (Kafka's, Debezium's) declares itself in META-INF/services:
            # no reflective scan of every jar at each start
            "plugin.discovery": "service_load",
            # a successor is given a dead member's connectors at once, not 5 minutes later
            "scheduled.rebalance.max.delay.ms": "0",
            "session.timeout.ms": str(SESSION_TIMEOUT_MS),
            "heartbeat.interval.ms": "1000",
            "topic.creation.enable": "true",
            **self.settings,
        }

    def start(self) -> None:
        """Start the worker (on its group: its connectors come back) and wait until it
        serves its REST API as a member of its group."""
        if self.running:
            return
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "log4j2.yaml").write_text(LOG4J2.format(log=self.log))
        config = self.home / "worker.properties"
        config.write_text("".join(f"{key}={value}\n" for key, value in self.properties().items()))
        command = ["java", HEAP, "-XX:TieredStopAtLevel=1", "-cp", f"{self.libs}/*",
                   f"-Dlog4j2.configurationFile={self.home / 'log4j2.yaml'}",
                   "org.apache.kafka.connect.cli.ConnectDistributed", str(config)]
        started = time.monotonic()
        with (self.home / "stdout.log").open("ab") as out:
            self._launch(command, stdout=out, stderr=out)
        self.start_s = time.monotonic() - started

    def restart(self, *, crash: bool = True) -> None:
        """SIGKILL (or stop) the worker and start it again on the same group and port."""
        if crash:
            self.kill()
        else:
            self.stop()
        self.start()

    def freeze(self) -> None:
        """SIGSTOP the worker: nothing it does goes on (no record sent, no offset committed)
        until :meth:`thaw` or :meth:`kill`."""
        os.kill(self.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT a frozen worker."""
        os.kill(self.pid, signal.SIGCONT)

    def committed_offsets(self, connector: str) -> dict[str, Any] | None:
        """The last source offset the worker committed for ``connector`` (Debezium's: ``lsn``,
        ``lsn_proc``, ``lsn_commit``, ``txId``, ...), read from its offsets topic; None if it
        committed none. What the connector sent after it, it sends again after a crash."""
        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap_servers,
                                 enable_auto_commit=False, consumer_timeout_ms=1000)
        try:
            partitions = [TopicPartition(f"{self.group}-offsets", number) for number in
                          sorted(consumer.partitions_for_topic(f"{self.group}-offsets") or ())]
            consumer.assign(partitions)
            consumer.seek_to_beginning(*partitions)
            ends = consumer.end_offsets(partitions)
            last: dict[str, Any] | None = None
            deadline = time.monotonic() + REQUEST_TIMEOUT_S
            while any(consumer.position(tp) < ends[tp] for tp in partitions):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"could not read {self.group}-offsets in "
                                       f"{REQUEST_TIMEOUT_S}s")
                for records in consumer.poll(timeout_ms=200).values():
                    for record in records:
                        if record.key and json.loads(record.key)[0] == connector:
                            last = None if record.value is None else json.loads(record.value)
            return last
        finally:
            consumer.close()

    def _ready(self) -> bool:
        """Whether the REST API answers and the herder serves (a member of its group)."""
        try:
            self.request("GET", "/connectors")
        except (OSError, ConnectorFailedError):
            return False
        return True

    # -- the REST API ----------------------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """One REST call; its JSON answer (None if empty). An HTTP error raises
        :class:`ConnectorFailedError` with the worker's message (and its status)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path, data=data, method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as answer:
                text = answer.read()
        except urllib.error.HTTPError as error:
            raise ConnectorFailedError(f"{method} {path}: HTTP {error.code}: "
                                       f"{error.read().decode(errors='replace')}") from error
        return json.loads(text) if text else None

    def plugins_listed(self) -> list[str]:
        """The connector classes the worker found."""
        return [plugin["class"] for plugin in self.request("GET", "/connector-plugins")]

    def put_connector(self, name: str, config: Mapping[str, str]) -> None:
        """Create connector ``name`` with ``config``, or change its configuration."""
        self.request("PUT", f"/connectors/{name}/config", dict(config))

    def delete_connector(self, name: str) -> None:
        with contextlib.suppress(ConnectorFailedError):
            self.request("DELETE", f"/connectors/{name}")

    def status(self, name: str) -> dict[str, Any]:
        """The connector's status: its state and its tasks' (``RUNNING``, ``FAILED``, ...)."""
        answer: dict[str, Any] = self.request("GET", f"/connectors/{name}/status")
        return answer

    def wait_running(self, name: str, timeout_s: float = RUNNING_TIMEOUT_S) -> None:
        """Wait until connector ``name`` and each of its tasks run; a FAILED one raises
        :class:`ConnectorFailedError` with its trace, and so does a timeout."""
        deadline = time.monotonic() + timeout_s
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            if not self.running:
                raise RuntimeError(f"the worker exited: {self._log_tail()}")
            with contextlib.suppress(ConnectorFailedError, OSError):
                status = self.status(name)
            states = [status.get("connector", {}).get("state")] + [
                task.get("state") for task in status.get("tasks", [])]
            if "FAILED" in states:
                raise ConnectorFailedError(f"connector {name} failed: {json.dumps(status)}")
            if status.get("tasks") and set(states) == {"RUNNING"}:
                return
            time.sleep(POLL_INTERVAL_S)
        raise ConnectorFailedError(f"connector {name} not running after {timeout_s}s: "
                                   f"{json.dumps(status)}; log {self.log}:\n{self._log_tail()}")


@contextlib.contextmanager
def start_worker(home: Path, bootstrap_servers: str, *,
                 settings: Mapping[str, str] | None = None) -> Iterator[ConnectWorker]:
    """A worker of a new group on the broker at ``bootstrap_servers``, its files in
    ``home``, started and serving (it lists Debezium's connector); stopped on exit."""
    worker = ConnectWorker(home, bootstrap_servers, settings=settings)
    try:
        worker.start()
        if DEBEZIUM_POSTGRES not in worker.plugins_listed():
            raise ConnectJarsMissingError(f"the worker does not list {DEBEZIUM_POSTGRES} "
                                          f"(plugin.path {worker.plugins}): {JARS_HINT}")
        yield worker
    finally:
        worker.stop()
