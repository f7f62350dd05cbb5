"""End-to-end latency of each sink against what users would pick instead: Kafka in, the target
out, one event at a time.

Run from the repository root (never in CI)::

    nice .venv/bin/python -m bench.latency kafka mysql [postgres sqlite s3 http] \\
        [--events 20000] [--rate 1000] [--trigger default 1s] [--rounds 1] \\
        [--baseline /path/to/other/checkout] [--foreach-batch] [--python-floor] \\
        [--out /tmp/twophase-latency] [--json SUMMARY]

What it measures: a producer writes ``--events`` JSON events (``event_id``, ``order_id``,
``status``, ``ts`` = its produce time) into a fresh topic of one private Kafka broker
(``setups.KafkaSetup``) at ``--rate`` events/s, after :data:`PRIMER_EVENTS` events the reader
must have seen first (so the query's first batch, its start-up, is over); a streaming query
reads the topic (Spark's Kafka source, repartitioned to 2 partitions, ``local[2]``) with the
default trigger (as fast as possible) or a ``processingTime`` one (``--trigger 1s``) and writes
it into a fresh target of the sink's private server (``setups.<Name>Setup.started``; the Kafka
target is a second topic of the same broker). A reader polls the target every 10 ms as its users
read it (the table by SELECT of the event ids from the oldest one not yet seen; Kafka by a
``read_committed`` consumer; S3 by the setup's listing and reading, ``S3Setup.visible``; HTTP in
the receiver's store; Delta and Iceberg by the setups' DuckDB readers) and records when each
event first became visible. Latency = first visible - produce time, over the events produced
after the first ``--warmup`` seconds (:data:`WARMUP_S`): p50/p90/p99/max. Each run then counts
only if a full read of the target sees every event exactly once (at least once for the peer).

Before the first run the broker is warmed (:func:`setups.servers.kafka.warm_up`, 12 s of
transactions as a KafkaSink's tasks, its driver and a read_committed reader make them): a fresh
broker's transactional paths run cold for their first seconds of load (its coordinator loading,
its JIT compiling), and whichever writer ran first would pay for that alone (measured on 2
cores: the first round of twophase on a fresh broker 19-25 % slower at p50 than the second,
8-13 % once warmed). The broker is the benchmark's; what a sink starts cold in its own query
(its Python workers, clients, producers) it still pays in every run, as in production, since
each run is a process of its own.

Writers, the order turning every round: ``twophase`` (``twophase.spark.write_stream`` into the
setup's sink, as ``bench/peer_<name>.py`` leaves it; with ``--foreach-batch`` also
``twophase foreachBatch``, the same with ``foreach_batch=True``), ``peer`` (the at-least-once
writer of ``bench/latency_peers.py``) and, with ``--baseline TREE``, ``twophase@baseline``: the
same query with ``TREE``'s ``twophase`` and ``sinks``; with ``--python-floor`` (Kafka) also
``plain Python data source``: a Python data source producing each task's rows with a plain
producer, at least once (``bench.latency_peers.PlainProduce``), the floor of any Python sink on
that path. Each query runs in a process of its own
(``bench/latency_runner.py``, one SparkSession, ``PYTHONPATH`` the tree under test, checked in a
Spark task) until the reader has seen every event.

Printed (markdown): per writer and trigger the latency percentiles, then the per-batch breakdown:
batches, median rows per batch, medians of Spark's ``durationMs`` entries and, for twophase, of
the state's batch history (``decision_ms``, ``commit_ms``). Written under ``--out``: every run's
latencies, progress and history (JSON) and, if matplotlib is importable, a CDF plot per target;
with ``--json``, a summary (:func:`summary`: provenance, percentiles, CDFs) for
``python -m bench.publish``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from psycopg import sql

from bench.peer_http import RECORDS_PER_REQUEST
from bench.peer_postgres import DURABLE
from bench.session import machine
from bench.spark_peers import PEER, TWOPHASE, bench_jars
from setups import (
    DeltaSetup,
    HttpSetup,
    IcebergSetup,
    KafkaSetup,
    MySQLSetup,
    PostgresSetup,
    S3Setup,
    SinkSetup,
    SQLiteSetup,
    Target,
)
from setups.servers.kafka import spark_kafka_jars
from sinks.kafka.sink import DEFAULT_TRANSACTION_TIMEOUT_MS
from sinks.mysql.markers import DEFAULT_MARKER_TABLE

DEFAULT_EVENTS = 20_000
DEFAULT_RATE = 1_000
DEFAULT_ROUNDS = 1
DEFAULT_OUT = str(Path(tempfile.gettempdir()) / "twophase-latency")
DEFAULT_TRIGGER = "default"
WARMUP_S = 8.0
POLL_INTERVAL_S = 0.010
#: How long a query may take to start (a SparkSession and the first plan, on a loaded machine).
READY_TIMEOUT_S = 300.0
#: How long after the last event the reader waits for the rest.
SETTLE_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 120.0
ORDERS = 50_000
#: Produced at once before the paced events; these start only once a reader saw them all (the
#: query's first batch, with its start-up costs, is past).
PRIMER_EVENTS = 10
PERCENTILES = (50, 90, 99)
DURATIONS = ("triggerExecution", "addBatch", "walCommit", "commitOffsets", "queryPlanning",
             "getBatch", "latestOffset")
HISTORY = ("decision_ms", "commit_ms")
ROOT = Path(__file__).resolve().parent.parent
RUNNER = Path(__file__).resolve().parent / "latency_runner.py"
BASELINE = "twophase@baseline"
FOREACH_BATCH = "twophase foreachBatch"  # write_stream(..., foreach_batch=True)
PYTHON_FLOOR = "plain Python data source"  # bench.latency_peers.PlainProduce
#: Writers that deliver at least once (a repeat is theirs to make).
AT_LEAST_ONCE = frozenset({PEER, PYTHON_FLOOR})
#: How ``bench/latency_runner.py`` names the writers that are not twophase's.
RUNNER_WRITERS = {PEER: "peer", PYTHON_FLOOR: "python_floor"}
#: Targets the Python floor writes to.
PYTHON_FLOOR_TARGETS = ("kafka",)


class RunFailedError(Exception):
    """A run that does not count: its query failed, or its target is not as it should be."""


# --- readers ----------------------------------------------------------------------------------

class Poller(Protocol):
    """A reader of one target: each call returns event ids it sees now (new ones at least)."""

    def poll(self, floor: int) -> Iterable[int]:
        """``floor``: every event below it was seen already."""

    def close(self) -> None: ...


class KafkaPoller:
    """A ``read_committed`` consumer of the whole topic, fetching every 10 ms at most."""

    def __init__(self, bootstrap_servers: str, topic: str) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap_servers,
                                  "group.id": f"latency-{topic}",
                                  "isolation.level": "read_committed",
                                  "enable.auto.commit": False, "fetch.wait.max.ms": 10})
        partitions = self.consumer.list_topics(topic).topics[topic].partitions
        self.consumer.assign([TopicPartition(topic, number, OFFSET_BEGINNING)
                              for number in partitions])

    def poll(self, floor: int) -> Iterable[int]:
        messages = self.consumer.consume(num_messages=100_000, timeout=0)
        return [json.loads(value)["event_id"] for message in messages
                if message.error() is None and (value := message.value()) is not None]

    def close(self) -> None:
        self.consumer.close()


class SqlPoller:
    """``statement`` (the event ids from a floor on) on one autocommit connection."""

    def __init__(self, connection: Any, statement: str) -> None:
        self.connection, self.statement = connection, statement

    def poll(self, floor: int) -> Iterable[int]:
        cursor = self.connection.cursor()
        try:
            cursor.execute(self.statement, (floor,))
            return [row[0] for row in cursor.fetchall()]
        finally:
            cursor.close()

    def close(self) -> None:
        self.connection.close()


class ReceiverPoller:
    """The HTTP receiver's store: the records of one path that arrived since the last poll."""

    def __init__(self, store: Path, path: str) -> None:
        self.db, self.path, self.last = sqlite3.connect(store), path, 0

    def poll(self, floor: int) -> Iterable[int]:
        rows = self.db.execute("SELECT id, record FROM records WHERE path = ? AND id > ? "
                               "ORDER BY id", (self.path, self.last)).fetchall()
        if rows:
            self.last = rows[-1][0]
        return [json.loads(record)["event_id"] for _, record in rows]

    def close(self) -> None:
        self.db.close()


@dataclass
class VisiblePoller:
    """The setup's own reader (S3: lists the prefix, reads each new object once)."""

    target: Target

    def poll(self, floor: int) -> Iterable[int]:
        return self.target.visible()

    def close(self) -> None:
        pass


# --- targets ----------------------------------------------------------------------------------

#: A sink's setup, started (the Kafka target's is the source's).
AbstractSetup = contextlib.AbstractContextManager[SinkSetup]


@dataclass(frozen=True)
class TargetKind:
    """How one sink is measured: its setup, its sink options, its peer's, its reader."""

    peer_name: str
    start: Callable[[Path, KafkaSetup], AbstractSetup]
    poller: Callable[[Any, Target], Poller]
    peer_options: Callable[[Any, Target], dict[str, Any]]
    overrides: dict[str, Any] = field(default_factory=dict)
    jars: Callable[[], list[str]] = list


def kafka_poller(setup: KafkaSetup, target: Target) -> Poller:
    return KafkaPoller(setup.broker.bootstrap_servers, target.options["topic"])


def mysql_poller(setup: MySQLSetup, target: Target) -> Poller:
    table = target.options["table"]
    return SqlPoller(setup.server.connect(),
                     f"SELECT event_id FROM `{table}` WHERE event_id >= %s")


def postgres_poller(setup: PostgresSetup, target: Target) -> Poller:
    statement = sql.SQL("SELECT event_id FROM {} WHERE event_id >= %s").format(
        sql.Identifier(target.options["table"]))
    return SqlPoller(setup.server.connect(), statement.as_string())


def sqlite_poller(_setup: SQLiteSetup, target: Target) -> Poller:
    return SqlPoller(sqlite3.connect(target.options["path"]),
                     "SELECT event_id FROM orders WHERE event_id >= ?")


def http_poller(setup: HttpSetup, target: Target) -> Poller:
    return ReceiverPoller(setup.receiver.db, urlsplit(target.options["url"]).path)


def jdbc_options(url: str, driver: str, params: Any, target: Target) -> dict[str, Any]:
    return {"url": url, "driver": driver, "user": params.user, "password": params.password,
            "table": target.options["table"]}


def mysql_peer(setup: MySQLSetup, target: Target) -> dict[str, Any]:
    params = setup.server.params
    url = (f"jdbc:mysql://{params.host}:{params.port}/{params.database}"
           "?permitMysqlScheme&rewriteBatchedStatements=true")
    return jdbc_options(url, "org.mariadb.jdbc.Driver", params, target)


def postgres_peer(setup: PostgresSetup, target: Target) -> dict[str, Any]:
    params = setup.server.params
    url = (f"jdbc:postgresql://{params.host}:{params.port}/{params.database}"
           "?reWriteBatchedInserts=true")
    return jdbc_options(url, "org.postgresql.Driver", params, target)


def picked(*names: str) -> Callable[[Any, Target], dict[str, Any]]:
    """The peer's options: these of the target's sink options."""
    return lambda _setup, target: {name: target.options[name] for name in names}


TARGETS: dict[str, TargetKind] = {
    "kafka": TargetKind(
        "Spark Kafka sink", lambda _workdir, source: contextlib.nullcontext(source),
        kafka_poller, picked("bootstrap_servers", "topic"),
        {"min_commit_window_ms": 0, "transaction_timeout_ms": DEFAULT_TRANSACTION_TIMEOUT_MS}),
    "mysql": TargetKind(
        "Spark JDBC (Connector/J)", lambda workdir, _source: MySQLSetup.started(workdir),
        mysql_poller, mysql_peer, {"fencing": False, "marker_table": DEFAULT_MARKER_TABLE},
        lambda: bench_jars("mariadb-java-client-*.jar")),
    "postgres": TargetKind(
        "Spark JDBC (pgjdbc)",
        lambda workdir, _source: PostgresSetup.started(workdir, settings=DURABLE),
        postgres_poller, postgres_peer, jars=lambda: bench_jars("postgresql-*.jar")),
    "sqlite": TargetKind(
        "sqlite3 executemany", lambda workdir, _source: SQLiteSetup.started(workdir),
        sqlite_poller, picked("path")),
    "s3": TargetKind(
        "boto3 put per batch", lambda workdir, _source: S3Setup.started(workdir),
        lambda _setup, target: VisiblePoller(target),
        picked("endpoint_url", "region", "access_key_id", "secret_access_key", "bucket",
               "prefix")),
    "http": TargetKind(
        "plain POST", lambda workdir, _source: HttpSetup.started(workdir), http_poller,
        picked("url", "token", "signing_secret"),
        {"encoding": "json", "compression": None,
         "max_records_per_request": RECORDS_PER_REQUEST}),
    "delta": TargetKind(
        "deltalake append", lambda workdir, _source: DeltaSetup.started(workdir),
        lambda _setup, target: VisiblePoller(target), picked("table_uri")),
    "iceberg": TargetKind(
        "pyiceberg append", lambda workdir, _source: IcebergSetup.started(workdir),
        lambda _setup, target: VisiblePoller(target),
        picked("table", "catalog", "catalog_name")),
}


# --- one run ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Load:
    """What each run produces, and how much of it the latencies leave out."""

    events: int
    rate: float
    warmup_s: float


@dataclass
class Run:
    target: str
    writer: str
    trigger: str
    round: int
    load: Load
    produced: list[float]
    first_seen: list[float | None]
    #: Of a full read of the target after the run: events seen more than once, never.
    repeated: int = 0
    missing: int = 0
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def measured_from(self) -> float:
        """When the warm-up ended: the first paced event's produce time + the warm-up."""
        return self.produced[PRIMER_EVENTS] + self.load.warmup_s

    def latencies_ms(self) -> list[float]:
        """Of the events produced after the warm-up, in event order."""
        return [(seen - made) * 1e3 for made, seen in zip(self.produced, self.first_seen,
                                                          strict=True)
                if made >= self.measured_from and seen is not None]

    def batches(self) -> list[dict[str, Any]]:
        """The progress of the batches with rows that started after the warm-up."""
        return [progress for progress in self.result["progress"] if progress["numInputRows"]
                and datetime.fromisoformat(progress["timestamp"]).timestamp()
                >= self.measured_from]

    def history(self) -> list[dict[str, Any]]:
        """twophase's records of the batches decided after the warm-up."""
        return [record for record in self.result["history"]
                if record["decided_at"] >= self.measured_from]


def send(producer: Producer, topic: str, event_id: int, produced: list[float]) -> None:
    """Event ``event_id``, stamped with (and its time recorded in ``produced``) when it is
    handed to the producer."""
    now = produced[event_id] = time.time()
    event = {"event_id": event_id, "order_id": event_id % ORDERS + 1, "status": "created",
             "ts": datetime.fromtimestamp(now, UTC).isoformat()}
    producer.produce(topic, json.dumps(event).encode(), key=str(event["order_id"]))
    producer.poll(0)


def produce(bootstrap_servers: str, topic: str, produced: list[float], rate: float,
            primed: threading.Event, finished: threading.Event) -> None:
    """:data:`PRIMER_EVENTS` events at once; once a reader saw them (``primed``), the rest of
    ``len(produced)``, ``rate`` per second, unless the run is over (``finished``)."""
    producer = Producer({"bootstrap.servers": bootstrap_servers, "linger.ms": 1})
    for event_id in range(PRIMER_EVENTS):
        send(producer, topic, event_id, produced)
    producer.flush()
    if primed.wait(READY_TIMEOUT_S) and not finished.is_set():
        start = time.time()
        for event_id in range(PRIMER_EVENTS, len(produced)):
            if finished.is_set():
                break
            delay = start + (event_id - PRIMER_EVENTS) / rate - time.time()
            if delay > 0:
                time.sleep(delay)
            send(producer, topic, event_id, produced)
    producer.flush()


def watch(poller: Poller, first_seen: list[float | None], produced: list[float],
          primed: threading.Event, running: Callable[[], bool]) -> None:
    """Poll every :data:`POLL_INTERVAL_S` until every event was seen, the query ended, or
    :data:`SETTLE_TIMEOUT_S` passed since the last event was produced (without primers seen,
    :data:`READY_TIMEOUT_S` since the start); ``primed`` set once the primers were seen."""
    floor, unseen, started = 0, len(first_seen), time.time()
    while unseen and running():
        tick = time.monotonic()
        ids = poller.poll(floor)
        now = time.time()
        for event_id in ids:
            if first_seen[event_id] is None:
                first_seen[event_id] = now
                unseen -= 1
        while floor < len(first_seen) and first_seen[floor] is not None:
            floor += 1
        if floor >= PRIMER_EVENTS:
            primed.set()
        if now > (produced[-1] + SETTLE_TIMEOUT_S if primed.is_set()
                  else started + READY_TIMEOUT_S):
            return
        time.sleep(max(0.0, tick + POLL_INTERVAL_S - time.monotonic()))


@dataclass(frozen=True)
class RunSpec:
    target: str
    writer: str
    trigger: str
    round: int
    tree: Path

    @property
    def label(self) -> str:
        return f"{self.target}, {self.writer}, trigger {self.trigger}, round {self.round}"


@contextlib.contextmanager
def query_process(spec: dict[str, Any], tree: Path, workdir: Path
                  ) -> Iterator[subprocess.Popen[bytes]]:
    """The writer's query running in ``bench/latency_runner.py`` (``tree`` first on its
    ``PYTHONPATH``, ``workdir`` its directory), until the block ends; then stopped and its
    result written."""
    spec_path = workdir / "spec.json"
    spec_path.write_text(json.dumps(spec))
    with (workdir / "runner.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-P", str(RUNNER), str(spec_path)], stdin=subprocess.PIPE,
            stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
            env={**os.environ, "PYTHONPATH": str(tree)})
        assert process.stdin is not None
        try:
            wait_ready(process, Path(spec["ready"]), workdir / "runner.log")
            yield process
        finally:
            process.stdin.close()
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def wait_ready(process: subprocess.Popen[bytes], ready: Path, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RunFailedError(f"the query did not start: {log}\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


def processing_time(trigger: str) -> str | None:
    """Spark's ``processingTime`` of ``--trigger`` (``1s``: ``1 seconds``; None: the default)."""
    if trigger == DEFAULT_TRIGGER:
        return None
    seconds = re.fullmatch(r"(\d+(?:\.\d+)?)s", trigger)
    return f"{seconds.group(1)} seconds" if seconds else trigger


def run_once(run: RunSpec, kind: TargetKind, setup: SinkSetup, source: KafkaSetup,
             jars: list[str], load: Load, workdir: Path) -> Run:
    """One writer over a fresh source topic into a fresh target; its latencies, checked."""
    workdir.mkdir(parents=True)
    target = setup.new_target(**kind.overrides)
    source_topic = source.broker.new_topic("events")
    spec = {"writer": RUNNER_WRITERS.get(run.writer, TWOPHASE), "target": run.target,
            "factory": target.factory, "options": target.options,
            "peer_options": kind.peer_options(setup, target),
            "bootstrap_servers": source.broker.bootstrap_servers, "source_topic": source_topic,
            "trigger": processing_time(run.trigger),
            "foreach_batch": run.writer == FOREACH_BATCH,
            "checkpoint": str(workdir / "checkpoint"), "jars": jars,
            "ready": str(workdir / "ready"), "result": str(workdir / "result.json")}
    produced = [math.inf] * (PRIMER_EVENTS + load.events)
    first_seen: list[float | None] = [None] * len(produced)
    poller, primed, finished = kind.poller(setup, target), threading.Event(), threading.Event()
    try:
        with query_process(spec, run.tree, workdir) as process:
            producer = threading.Thread(target=produce, args=(
                source.broker.bootstrap_servers, source_topic, produced, load.rate, primed,
                finished), daemon=True)
            producer.start()
            watch(poller, first_seen, produced, primed, lambda: process.poll() is None)
            finished.set()
            primed.set()
            producer.join()
    finally:
        poller.close()
    if not (workdir / "result.json").exists():
        log = workdir / "runner.log"
        raise RunFailedError(f"no result: {log}\n{log.read_text()[-3000:]}")
    result = json.loads((workdir / "result.json").read_text())
    seen = target.visible()
    return Run(run.target, run.writer, run.trigger, run.round, load, produced, first_seen,
               repeated=len(seen) - len(set(seen)), missing=len(produced) - len(set(seen)),
               result=result)


def checked(run: Run, spec: RunSpec) -> Run:
    """``run``, unless it failed, lost events, repeated them (exactly-once writers) or ran
    another tree's twophase than ``spec.tree``'s (:class:`RunFailedError`)."""
    if run.result["error"]:
        raise RunFailedError(f"the query failed: {run.result['error']}")
    if run.missing or (run.writer not in AT_LEAST_ONCE and run.repeated):
        raise RunFailedError(f"{run.missing} events never visible, {run.repeated} "
                             "visible more than once")
    if not run.latencies_ms():
        raise RunFailedError("no event after the warm-up: raise --events")
    if run.writer != PEER and not all(Path(file).is_relative_to(spec.tree)
                                      for file in run.result["modules"]):
        raise RunFailedError(f"the Python workers imported {run.result['modules']}, "
                             f"not {spec.tree}'s")
    return run


# --- the report -------------------------------------------------------------------------------

def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(share / 100 * len(ordered)) - 1)]


def median_of(values: Iterable[float]) -> str:
    found = list(values)
    return f"{statistics.median(found):,.0f}" if found else "-"


def latency_row(label: str, runs: list[Run]) -> str:
    values = [value for run in runs for value in run.latencies_ms()]
    cells = [f"{percentile(values, share):,.0f}" for share in PERCENTILES]
    repeated = sum(run.repeated for run in runs)
    return (f"| {label} | {' / '.join(cells)} | {max(values):,.0f} | {len(values):,} | "
            f"{'once' if not repeated else f'{repeated} repeated'} |")


def breakdown_row(label: str, runs: list[Run]) -> str:
    batches = [progress for run in runs for progress in run.batches()]
    history = [record for run in runs for record in run.history()]
    durations = [median_of(p["durationMs"][key] for p in batches if key in p["durationMs"])
                 for key in DURATIONS]
    decided = [median_of(record[key] for record in history if key in record)
               for key in HISTORY]
    return (f"| {label} | {len(batches)} | {median_of(p['numInputRows'] for p in batches)} | "
            f"{' | '.join(durations)} | {' | '.join(decided)} |")


def report(runs: list[Run], peer_names: dict[str, str]) -> str:
    groups: dict[tuple[str, str, str], list[Run]] = {}
    for run in runs:
        groups.setdefault((run.target, run.writer, run.trigger), []).append(run)
    labels = {key: f"{key[0]} | {peer_names[key[0]] if key[1] == PEER else key[1]} | {key[2]}"
              for key in groups}
    rounds, load = max(run.round for run in runs) + 1, runs[0].load
    lines = [f"{load.events:,} events at {load.rate:,.0f}/s, first {load.warmup_s:g} s dropped, "
             f"{rounds} round(s), latencies pooled over rounds (ms)", "",
             "| target | writer | trigger | p50 / p90 / p99 | max | events | seen |",
             "|---|---|---|---|---|---|---|"]
    lines += [latency_row(labels[key], group) for key, group in groups.items()]
    lines += ["", "Per batch with rows started after the warm-up, medians (ms): Spark's "
              "durationMs; twophase's history",
              "", f"| target | writer | trigger | batches | rows/batch | {' | '.join(DURATIONS)} "
              f"| {' | '.join(HISTORY)} |",
              "|---|---|---|---|---|" + "---|" * (len(DURATIONS) + len(HISTORY))]
    lines += [breakdown_row(labels[key], group) for key, group in groups.items()]
    return "\n".join(lines)


def save(runs: list[Run], out: Path) -> Path:
    """Every run's latencies, progress and history, as JSON under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"latency-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps([{
        "target": run.target, "writer": run.writer, "trigger": run.trigger, "round": run.round,
        "latencies_ms": run.latencies_ms(), "repeated": run.repeated, "missing": run.missing,
        **run.result} for run in runs]))
    return path


#: The quantiles of each line's CDF that the results file keeps (0, 1, ..., 100 %).
CDF_POINTS = 101


def summary(runs: list[Run], peer_names: dict[str, str], started: dict[str, Any]
            ) -> dict[str, Any]:
    """What ``--json`` writes (``bench/publish.py`` renders the docs' latency table and plot
    from it): the run's provenance as it ``started`` (:func:`bench.session.machine`), the load,
    every run's percentiles and batch medians, and each writer's CDF over its rounds at
    :data:`CDF_POINTS` quantiles."""
    lines: dict[tuple[str, str, str], list[float]] = {}
    records = []
    for run in runs:
        latencies, batches = run.latencies_ms(), run.batches()
        lines.setdefault((run.target, run.writer, run.trigger), []).extend(latencies)
        records.append({
            "target": run.target, "writer": run.writer, "trigger": run.trigger,
            "round": run.round, "events": len(latencies), "repeated": run.repeated,
            "missing": run.missing,
            "ms": {f"p{share}": percentile(latencies, share) for share in (*PERCENTILES, 100)},
            "batches": len(batches),
            "add_batch_ms": _median_or_none(p["durationMs"].get("addBatch") for p in batches)})
    return {
        "provenance": started, "events": runs[0].load.events, "rate": runs[0].load.rate,
        "warmup_s": runs[0].load.warmup_s, "peers": peer_names, "runs": records,
        "cdf": [{"target": target, "writer": writer, "trigger": trigger,
                 "ms": quantiles(values, CDF_POINTS)}
                for (target, writer, trigger), values in lines.items()]}


def quantiles(values: list[float], points: int) -> list[float]:
    """``points`` evenly spaced quantiles of ``values``, from the least to the greatest."""
    ordered = sorted(values)
    return [ordered[round(n * (len(ordered) - 1) / (points - 1))] for n in range(points)]


def _median_or_none(values: Iterable[float | None]) -> float | None:
    found = [value for value in values if value is not None]
    return statistics.median(found) if found else None


def plot(runs: list[Run], peer_names: dict[str, str], path: Path) -> str:
    """A CDF of each target's latencies, one line per writer and trigger, next to ``path``."""
    try:
        import matplotlib  # noqa: PLC0415 - optional: without it, no plot
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return "matplotlib is not installed: no CDF plot"
    written = []
    for target in dict.fromkeys(run.target for run in runs):
        figure, axes = plt.subplots(figsize=(8, 5))
        lines: dict[tuple[str, str], list[float]] = {}
        for run in runs:
            if run.target == target:
                lines.setdefault((run.writer, run.trigger), []).extend(run.latencies_ms())
        for (writer, trigger), values in lines.items():
            ordered = sorted(values)
            axes.plot(ordered, [(n + 1) / len(ordered) for n in range(len(ordered))],
                      label=f"{peer_names[target] if writer == PEER else writer}, "
                            f"trigger {trigger}")
        axes.set(xscale="log", xlabel="latency (ms)", ylabel="share of events",
                 title=f"Kafka -> {target}, end to end")
        axes.legend()
        axes.grid(True, which="both", alpha=0.3)
        png = path.with_name(f"{path.stem}-{target}.png")
        figure.savefig(png, dpi=100)
        plt.close(figure)
        written.append(str(png))
    return "CDF: " + ", ".join(written)


# --- main -------------------------------------------------------------------------------------

def schedule(targets: list[str], triggers: list[str], rounds: int, baseline: Path | None,
             *, foreach_batch: bool = False, python_floor: bool = False) -> Iterator[RunSpec]:
    """Every run, the writers' order turning every round."""
    for target in targets:
        writers = ([(TWOPHASE, ROOT), (PEER, ROOT)]
                   + ([(BASELINE, baseline)] if baseline else [])
                   + ([(FOREACH_BATCH, ROOT)] if foreach_batch else [])
                   + ([(PYTHON_FLOOR, ROOT)]
                      if python_floor and target in PYTHON_FLOOR_TARGETS else []))
        for trigger in triggers:
            for number in range(rounds):
                turn = number % len(writers)
                for writer, tree in writers[turn:] + writers[:turn]:
                    yield RunSpec(target, writer, trigger, number, tree)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="+", choices=list(TARGETS))
    parser.add_argument("--events", type=int, default=DEFAULT_EVENTS)
    parser.add_argument("--rate", type=float, default=DEFAULT_RATE, help="events per second")
    parser.add_argument("--trigger", nargs="+", default=[DEFAULT_TRIGGER],
                        help=f"'{DEFAULT_TRIGGER}' (as fast as possible) or a processingTime "
                             "interval such as 1s")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    parser.add_argument("--warmup", type=float, default=WARMUP_S,
                        help="seconds of events left out at the start of each run")
    parser.add_argument("--baseline", type=Path,
                        help="another checkout: adds the writer twophase@baseline")
    parser.add_argument("--foreach-batch", action="store_true",
                        help=f"adds the writer '{FOREACH_BATCH}' (write_stream's "
                             "foreach_batch=True)")
    parser.add_argument("--python-floor", action="store_true",
                        help=f"adds the writer '{PYTHON_FLOOR}' (at least once, no "
                             f"transaction) for {', '.join(PYTHON_FLOOR_TARGETS)}")
    parser.add_argument("--out", type=Path, default=Path(DEFAULT_OUT))
    parser.add_argument("--json", type=Path,
                        help="also write the run's summary here (provenance, every run's "
                             "percentiles, each writer's CDF: the results file of "
                             "bench/publish.py)")
    args = parser.parse_args()
    baseline = args.baseline.resolve() if args.baseline else None
    load = Load(args.events, args.rate, args.warmup)
    started = machine()
    runs: list[Run] = []
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="twophase-latency-") as tmp, \
            contextlib.ExitStack() as stack:
        workdir = Path(tmp)
        source = stack.enter_context(KafkaSetup.started(workdir / "kafka"))
        source.broker.warm_up()
        setups = {name: stack.enter_context(TARGETS[name].start(workdir / name, source))
                  for name in args.targets}
        source_jars = spark_kafka_jars()
        for number, run in enumerate(schedule(args.targets, args.trigger, args.rounds,
                                              baseline, foreach_batch=args.foreach_batch,
                                              python_floor=args.python_floor)):
            kind = TARGETS[run.target]
            try:
                done = checked(run_once(run, kind, setups[run.target], source,
                                        source_jars + kind.jars(), load,
                                        workdir / f"run-{number}"), run)
            except RunFailedError as failure:
                failures.append(f"{run.label}: {failure}")
                print(f"{run.label}: FAILED", file=sys.stderr, flush=True)
                continue
            runs.append(done)
            print(f"{run.label}: p50 {percentile(done.latencies_ms(), 50):,.0f} ms",
                  file=sys.stderr, flush=True)
    if not runs:
        raise SystemExit("\n".join(failures))
    path = save(runs, args.out)
    peer_names = {name: TARGETS[name].peer_name for name in args.targets}
    if args.json:
        args.json.write_text(json.dumps(summary(runs, peer_names, started), indent=1))
    print(report(runs, peer_names))
    print(f"\nraw: {path}; {plot(runs, peer_names, path)}")
    if failures:
        raise SystemExit("Failed runs:\n" + "\n".join(failures))


if __name__ == "__main__":
    main()
