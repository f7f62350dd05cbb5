"""The real Debezium pipeline, with real parts and no mocks.

PostgreSQL (a private cluster with ``wal_level=logical``) -> Debezium's PostgreSQL connector
(``pgoutput``, a least-privileged replication role) on a Kafka Connect worker (Apache Kafka's
own runtime, the broker's version, distributed: its connector and offsets in the broker) -> the
session's Kafka broker -> Spark's Kafka source -> :func:`twophase.debezium.debezium_changes` ->
a sink group of a keyed :class:`~sinks.mysql.MySQLXASink` (MariaDB) and a keyed
:class:`~sinks.postgres.PostgresSink` (the session's PostgreSQL), committed in that order.
The Spark driver is ``examples/debezium_pipeline.py`` run as a user runs it, in a process
session of its own.

* The source side alone: a row inserted, updated and deleted arrives as Debezium's events
  (``c``, ``u``, ``d`` and the delete's tombstone), keyed by the primary key, in LSN order.
* End to end, crashed: a workload of inserts, many updates per key, deletes and re-inserts of
  the same keys runs while the driver streams the topic; the driver is SIGKILLed at crash
  points (:data:`~twophase.testing.crash_points.GROUP_CRASH_POINTS`) and started again, and the
  Connect worker is SIGKILLed with records sent after its last offset commit (frozen first,
  so that this is certain) and started again: Debezium sends them again (at least once; the
  test checks that the topic holds duplicates). Once the topic holds every change, a last run
  (``availableNow``) drains it. Each target table then equals the source table row for row
  (both read as sorted lists of tuples), every row's ``version`` is its key's newest LSN on
  the topic, nothing is in doubt (``XA RECOVER``, ``pg_prepared_xacts``) and the state file
  has nothing pending. In CI one driver kill (between the members' commits) and one worker
  kill; ``-m long``: a driver kill at each of the group's six points and two worker kills.

The connector runs with ``snapshot.mode=no_data``: a table's rows are all inserted after its
slot exists, so every event is a streamed change with an LSN of its own. (With ``initial``
the snapshot's events carry the slot's consistent point as their LSN, which is also the LSN
of the first change streamed after it: measured here, an update right after the connector
started had the LSN of the snapshot's rows; a version of the LSN alone cannot order them.)
"""

from __future__ import annotations

import contextlib
import json
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from setups.servers.kafka import KafkaBroker, spark_kafka_jars
from setups.servers.kafka_connect import ConnectWorker, debezium_postgres_config, start_worker
from setups.servers.mariadb import Db, MariaDBServer
from setups.servers.postgres import PgView, PostgresServer, logical_server
from sinks.postgres.connection import TLS_OF_SSLMODE
from tests import REPO
from twophase._state import StateStore
from twophase.testing.crash_points import (
    BETWEEN_MEMBERS,
    CRASH_ENV,
    GROUP_CRASH_POINTS,
    kill_session,
)
from twophase.testing.driver import SPARK_CONF, driver_environment

pytestmark = [pytest.mark.spark]

EXAMPLE = REPO / "examples" / "debezium_pipeline.py"
SOURCE_DDL = ("CREATE TABLE {table} (id bigint PRIMARY KEY, status text NOT NULL, "
              "amount numeric(12,2))")
MYSQL_DDL = ("CREATE TABLE `{table}` (id BIGINT PRIMARY KEY, status VARCHAR(32) NOT NULL, "
             "amount DECIMAL(12,2), version BIGINT NOT NULL) ENGINE=InnoDB")
PG_DDL = ("CREATE TABLE {table} (id bigint PRIMARY KEY, status text NOT NULL, "
          "amount numeric(12,2), version bigint NOT NULL)")
#: The source table's columns as Spark reads them from an event's ``after``.
COLUMNS = "id BIGINT, status STRING, amount DECIMAL(12,2)"
STATUSES = ("created", "paid", "packed", "shipped", "delivered", "returned")
TOPIC_PARTITIONS = 2
DRIVER_TIMEOUT_S = 300.0
DELIVERY_TIMEOUT_S = 120.0
KILL_ATTEMPTS = 50
POLL_S = 0.5

Row = tuple[int, str, Decimal | None]


# -- the source: a table, its connector, its topic ---------------------------------------------


@dataclass(frozen=True)
class Event:
    """One record of Debezium's topic: ``op`` None is a delete's tombstone."""

    partition: int
    offset: int
    key: int
    op: str | None
    lsn: int | None
    after: Row | None


def _row(after: dict[str, Any]) -> Row:
    amount = after["amount"]
    return (int(after["id"]), str(after["status"]),
            None if amount is None else Decimal(str(amount)))


@dataclass
class CdcSource:
    """A fresh table of the logical-decoding server, captured by its own connector (slot,
    publication, role) into its own topic."""

    server: PostgresServer
    broker: KafkaBroker
    worker: ConnectWorker
    table: str

    @property
    def connector(self) -> str:
        return self.table

    @property
    def topic(self) -> str:
        return f"{self.table}.public.{self.table}"

    def rows(self) -> list[Row]:
        """The table, sorted by key."""
        return [(int(i), str(s), a) for i, s, a in PgView(self.server).query(
            sql.SQL("SELECT id, status, amount FROM {} ORDER BY id").format(
                sql.Identifier(self.table)))]

    def events(self) -> list[Event]:
        """Every record of the topic, in each partition's order (none before the worker
        makes the topic, with its first record)."""
        try:
            records = self.broker.read(self.topic)
        except LookupError:
            return []
        events = []
        for record in records:
            key = int(json.loads(record.key)["id"])
            if record.value is None:
                events.append(Event(record.partition, record.offset, key, None, None, None))
                continue
            value = json.loads(record.value)
            after = value["after"]
            events.append(Event(record.partition, record.offset, key, value["op"],
                                int(value["source"]["lsn"]),
                                None if after is None else _row(after)))
        return events

    def wait_delivered(self, timeout_s: float = DELIVERY_TIMEOUT_S) -> list[Event]:
        """Wait until the topic holds every change of the table: each key's newest event (by
        LSN) is its row now, or a delete of a key the table lacks. Returns the events."""
        deadline = time.monotonic() + timeout_s
        while True:
            events, rows = self.events(), self.rows()
            if newest_rows(events) == rows:
                return events
            if time.monotonic() > deadline:
                raise AssertionError(f"the topic does not hold the table's changes after "
                                     f"{timeout_s}s: {len(events)} events, newest "
                                     f"{newest_rows(events)[:5]}..., table {rows[:5]}...; "
                                     f"{self.worker.status(self.connector)}")
            time.sleep(POLL_S)


def newest_by_key(events: Sequence[Event]) -> dict[int, Event]:
    """Each key's newest event by LSN (tombstones skipped)."""
    newest: dict[int, Event] = {}
    for event in events:
        if event.lsn is not None and (event.key not in newest
                                      or event.lsn > (newest[event.key].lsn or -1)):
            newest[event.key] = event
    return newest


def newest_rows(events: Sequence[Event]) -> list[Row]:
    """The table the events describe: each key's newest state, deleted keys left out."""
    return sorted(event.after for event in newest_by_key(events).values()
                  if event.op != "d" and event.after is not None)


def duplicates(events: Sequence[Event]) -> int:
    """Events sent more than once (the same key and LSN again): Debezium's at least once."""
    counts = Counter((event.key, event.lsn) for event in events if event.lsn is not None)
    return sum(count - 1 for count in counts.values())


@pytest.fixture(scope="module")
def cdc_postgres() -> Iterator[PostgresServer]:
    """A private PostgreSQL with ``wal_level=logical`` for this module's source tables."""
    with logical_server() as server:
        yield server


@pytest.fixture(scope="module")
def connect_worker(kafka_broker: KafkaBroker,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectWorker]:
    """A Kafka Connect worker (distributed, a group of one) on the session's broker, with
    Debezium's PostgreSQL connector as a plugin."""
    with start_worker(tmp_path_factory.mktemp("connect"), kafka_broker.bootstrap_servers
                      ) as worker:
        yield worker


@pytest.fixture
def connect(connect_worker: ConnectWorker) -> Iterator[ConnectWorker]:
    """The module's worker, started again if an earlier test killed it."""
    connect_worker.start()
    yield connect_worker
    connect_worker.start()  # a test that killed it may have failed before starting it again


@pytest.fixture
def source(cdc_postgres: PostgresServer, connect: ConnectWorker,
           kafka_broker: KafkaBroker) -> Iterator[CdcSource]:
    """A fresh source table and its running connector (``snapshot.mode=no_data``: every
    change after the slot's creation), as a role holding only what Debezium needs."""
    view = PgView(cdc_postgres)
    table = view.new_table(SOURCE_DDL, prefix="src")
    user, password = f"dbz_{table}", secrets.token_hex(12)
    cdc_postgres.create_replication_user(user, password, [table])
    params = cdc_postgres.params
    cdc = CdcSource(cdc_postgres, kafka_broker, connect, table)
    connect.put_connector(cdc.connector, debezium_postgres_config(
        host=params.host, port=params.port, database=params.database, user=user,
        password=password, topic_prefix=table, tables=[f"public.{table}"], slot=table,
        snapshot_mode="no_data", partitions=TOPIC_PARTITIONS))
    try:
        connect.wait_running(cdc.connector)
        _wait_for(lambda: any(name == table and active
                              for name, _plugin, active in view.replication_slots()),
                  f"replication slot {table} active")
        yield cdc
    finally:
        connect.delete_connector(cdc.connector)
        _drop_slot(cdc_postgres, table)


def _drop_slot(server: PostgresServer, slot: str) -> None:
    """Drop the connector's slot once nothing holds it (a slot pins WAL until dropped)."""
    view = PgView(server)
    with contextlib.suppress(AssertionError):
        _wait_for(lambda: not any(name == slot and active
                                  for name, _plugin, active in view.replication_slots()),
                  f"replication slot {slot} released", timeout_s=30.0)
    with server.superuser() as conn:
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                     "WHERE slot_name = %s AND NOT active", (slot,))


def _wait_for(ready: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {timeout_s}s")
        time.sleep(0.1)


# -- the source side alone ---------------------------------------------------------------------


def test_a_row_inserted_updated_and_deleted_arrives_as_debezium_events(
    source: CdcSource
) -> None:
    with source.server.connect() as conn:
        table = sql.Identifier(source.table)
        conn.execute(sql.SQL("INSERT INTO {} VALUES (7, 'created', 12.50)").format(table))
        conn.execute(sql.SQL("UPDATE {} SET status = 'paid', amount = 13 WHERE id = 7")
                     .format(table))
        conn.execute(sql.SQL("DELETE FROM {} WHERE id = 7").format(table))
    _wait_for(lambda: len(source.events()) >= 4, "four events on the topic", DELIVERY_TIMEOUT_S)
    events = source.events()
    assert [(e.key, e.op, e.after) for e in events] == [
        (7, "c", (7, "created", Decimal("12.50"))),
        (7, "u", (7, "paid", Decimal("13.00"))),
        (7, "d", None),
        (7, None, None),  # the delete's tombstone: the key, a null value
    ]
    assert len({e.partition for e in events}) == 1, "one key's events in one partition"
    lsns = [e.lsn or 0 for e in events[:3]]
    assert lsns == sorted(lsns) and len(set(lsns)) == 3, f"LSNs not increasing: {lsns}"
    delete = json.loads(source.broker.read(source.topic)[2].value)
    assert delete["before"]["id"] == 7 and delete["source"]["table"] == source.table


# -- end to end --------------------------------------------------------------------------------


@dataclass
class Workload:
    """Changes of ``keys`` keys of the source table, one statement or small transaction
    about every ``pace_s``, until stopped: inserts of absent keys (again after a delete: a
    re-insert), updates (several in one transaction too), deletes, and deletes followed by a
    re-insert in one transaction."""

    source: CdcSource
    keys: int
    pace_s: float = 0.04
    seed: int = 61
    counts: Counter[str] = field(default_factory=Counter)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _error: BaseException | None = None

    def __enter__(self) -> Workload:
        self._thread = threading.Thread(target=self._run, name="workload", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise AssertionError(f"the workload failed: {self._error!r}") from self._error

    def _run(self) -> None:
        rng = random.Random(self.seed)
        present: set[int] = set()
        deleted: set[int] = set()
        try:
            with self.source.server.connect() as conn:
                while not self._stop.is_set():
                    self._step(conn, rng, present, deleted)
                    time.sleep(self.pace_s)
        except BaseException as error:  # reported by stop()
            self._error = error

    def _step(self, conn: psycopg.Connection[Any], rng: random.Random, present: set[int],
              deleted: set[int]) -> None:
        table = sql.Identifier(self.source.table)
        key = rng.randrange(1, self.keys + 1)
        insert = sql.SQL("INSERT INTO {} VALUES (%s, %s, %s)").format(table)
        update = sql.SQL("UPDATE {} SET status = %s, amount = %s WHERE id = %s").format(table)
        delete = sql.SQL("DELETE FROM {} WHERE id = %s").format(table)
        if key not in present:
            conn.execute(insert, (key, rng.choice(STATUSES), _amount(rng)))
            self.counts["reinsert" if key in deleted else "insert"] += 1
            present.add(key)
            return
        roll = rng.random()
        if roll < 0.65:
            conn.execute(update, (rng.choice(STATUSES), _amount(rng), key))
            self.counts["update"] += 1
        elif roll < 0.75:
            with conn.transaction():
                for _ in range(rng.randrange(2, 5)):
                    conn.execute(update, (rng.choice(STATUSES), _amount(rng), key))
                    self.counts["update"] += 1
        elif roll < 0.9:
            conn.execute(delete, (key,))
            self.counts["delete"] += 1
            present.discard(key)
            deleted.add(key)
        else:
            with conn.transaction():
                conn.execute(delete, (key,))
                conn.execute(insert, (key, rng.choice(STATUSES), _amount(rng)))
            self.counts["delete"] += 1
            self.counts["reinsert"] += 1


def _amount(rng: random.Random) -> Decimal | None:
    """Cents up to 10,000.00, NULL now and then."""
    return None if rng.random() < 0.05 else Decimal(rng.randrange(0, 1_000_000)) / 100


@dataclass(frozen=True)
class Mirror:
    """The pipeline's targets: a MariaDB table and a PostgreSQL table, and their servers."""

    db: Db
    mariadb: MariaDBServer
    mysql_table: str
    pg: PgView
    pg_table: str

    def mysql_rows(self) -> list[Row]:
        return [(int(i), str(s), a) for i, s, a in self.db.query(
            f"SELECT id, status, amount FROM `{self.mysql_table}` ORDER BY id")]

    def pg_rows(self) -> list[Row]:
        return [(int(i), str(s), a) for i, s, a in self.pg.query(
            sql.SQL("SELECT id, status, amount FROM {} ORDER BY id").format(
                sql.Identifier(self.pg_table)))]

    def versions(self) -> tuple[dict[int, int], dict[int, int]]:
        """Each row's ``version``, in MariaDB and in PostgreSQL."""
        mysql = dict(self.db.query(f"SELECT id, version FROM `{self.mysql_table}`"))
        pg = dict(self.pg.query(sql.SQL("SELECT id, version FROM {}").format(
            sql.Identifier(self.pg_table))))
        return ({int(k): int(v) for k, v in mysql.items()},
                {int(k): int(v) for k, v in pg.items()})


@pytest.fixture
def mirror(db: Db, mariadb: MariaDBServer, pg: PgView) -> Mirror:
    return Mirror(db, mariadb, db.new_table(MYSQL_DDL, prefix="mirror_"), pg,
                  pg.new_table(PG_DDL, prefix="mirror_"))


@dataclass(frozen=True)
class PipelineRun:
    returncode: int
    crashed: bool
    log: Path
    seconds: float

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def run_pipeline(source: CdcSource, mirror: Mirror, workdir: Path, *,
                 crash_at: str | None = None, available_now: bool = False,
                 max_offsets_per_trigger: int = 100) -> PipelineRun:
    """``examples/debezium_pipeline.py`` from the topic into both targets, in a process
    session of its own (armed at ``crash_at``), until it ends or dies; its checkpoint in
    ``workdir/ckpt``."""
    mysql, pg = mirror.mariadb.params, mirror.pg.server.params
    conf = {**SPARK_CONF, "spark.master": "local[2]",
            "spark.local.dir": str(workdir / "tmp")}
    command = [sys.executable, str(EXAMPLE), "--bootstrap", source.broker.bootstrap_servers,
               "--topic", source.topic, "--checkpoint", str(workdir / "ckpt"),
               "--columns", COLUMNS, "--key", "id",
               "--mysql-host", mysql.host, "--mysql-port", str(mysql.port),
               "--mysql-user", mysql.user, "--mysql-database", mysql.database,
               "--mysql-table", mirror.mysql_table, "--mysql-tls", mysql.tls,
               "--pg-host", pg.host, "--pg-port", str(pg.port), "--pg-user", pg.user,
               "--pg-database", pg.database, "--pg-table", mirror.pg_table,
               "--pg-tls", TLS_OF_SSLMODE[pg.sslmode], "--jars", ",".join(spark_kafka_jars()),
               "--max-offsets-per-trigger", str(max_offsets_per_trigger),
               *(["--available-now"] if available_now else ["--trigger-interval", "1 second"]),
               *[f"--conf={key}={value}" for key, value in conf.items()]]
    env = driver_environment(workdir, [REPO])
    env |= {"MYSQL_PASSWORD": mysql.password, "PGPASSWORD": pg.password}
    if crash_at:
        env[CRASH_ENV] = crash_at
    log = workdir / "driver.log"
    started = time.monotonic()
    with log.open("a") as out:
        out.write(f"\n=== run, crash point {crash_at or 'none'} ===\n")
        out.flush()
        process = subprocess.Popen(command, cwd=workdir, env=env, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            returncode = process.wait(DRIVER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            kill_session(process.pid)  # what is left: a JVM whose Python parent died, say
    run = PipelineRun(process.wait() if returncode is None else returncode,
                      returncode == -signal.SIGKILL, log, time.monotonic() - started)
    assert returncode is not None, f"the driver ran over {DRIVER_TIMEOUT_S}s: {run.tail()}"
    return run


def kill_worker_with_unsent_offsets(source: CdcSource) -> int:
    """SIGKILL the Connect worker at a moment when the topic holds records of the connector
    that its committed offset does not cover (frozen while looking, so that it commits
    nothing meanwhile): Debezium must send them again. Returns how many it holds."""
    worker = source.worker
    for _ in range(KILL_ATTEMPTS):
        worker.freeze()
        try:
            committed = worker.committed_offsets(source.connector)
            done = -1 if committed is None else int(committed["lsn"])
            unsent = sum(1 for event in source.events()
                         if event.lsn is not None and event.lsn > done)
            if unsent:
                worker.kill()
                return unsent
        finally:
            if worker.running:
                worker.thaw()
        time.sleep(POLL_S)
    raise AssertionError(f"the worker committed every record it sent, {KILL_ATTEMPTS} times: "
                         "is the workload running?")


def mirror_through_crashes(source: CdcSource, mirror: Mirror, workdir: Path, *,
                           driver_kills: Sequence[str], worker_kills_after: Sequence[int],
                           keys: int) -> None:
    """The workload runs while the driver is killed at each of ``driver_kills`` in turn (the
    k-th at batch k) and the worker after the driver kills numbered in
    ``worker_kills_after``; then the last run drains the topic and the mirror is checked."""
    timings: dict[str, float] = {}
    with Workload(source, keys) as workload:
        _wait_for(lambda: len(source.events()) >= 20, "20 events on the topic",
                  DELIVERY_TIMEOUT_S)
        for number, point in enumerate(driver_kills, start=1):
            run = run_pipeline(source, mirror, workdir, crash_at=f"{point}@{number}")
            timings[f"driver run {number} ({point})"] = run.seconds
            assert run.crashed, f"the driver did not die at {point}@{number}: {run.tail()}"
            if number in worker_kills_after:
                started = time.monotonic()
                assert kill_worker_with_unsent_offsets(source) > 0
                source.worker.start()
                source.worker.wait_running(source.connector)
                timings[f"worker restart after driver run {number}"] = (time.monotonic()
                                                                        - started)
                time.sleep(2.0)  # changes streamed by the restarted worker
    assert workload.counts["delete"] and workload.counts["reinsert"], workload.counts
    assert workload.counts["update"] > 2 * keys, workload.counts
    events = source.wait_delivered()
    assert duplicates(events) > 0, "the worker's restart sent nothing again"
    final = run_pipeline(source, mirror, workdir, available_now=True,
                         max_offsets_per_trigger=1000)
    timings["last run (availableNow)"] = final.seconds
    assert final.returncode == 0, f"the last run failed: {final.tail()}"

    expected = source.rows()
    assert expected, "the workload left the source table empty"
    assert mirror.mysql_rows() == expected, "MariaDB's table differs from the source"
    assert mirror.pg_rows() == expected, "PostgreSQL's table differs from the source"
    newest = {key: event.lsn for key, event in newest_by_key(events).items()
              if event.op != "d"}
    assert mirror.versions() == (newest, newest), "a row's version is not its newest LSN"
    assert mirror.db.xa_recover() == [], "XA branches left prepared in MariaDB"
    assert mirror.pg.prepared() == [], "transactions left prepared in PostgreSQL"
    state = StateStore.for_checkpoint(str(workdir / "ckpt")).read()
    assert state is not None and state.pending == (), "decided batches left pending"
    print(f"\n{source.topic}: {len(events)} events ({duplicates(events)} sent again), "
          f"workload {dict(workload.counts)}, {len(expected)} rows; "
          + ", ".join(f"{name} {seconds:.1f}s" for name, seconds in timings.items()))


@pytest.mark.crash
def test_the_mirror_equals_the_source_after_a_driver_and_a_worker_kill(
    source: CdcSource, mirror: Mirror, tmp_path: Path
) -> None:
    mirror_through_crashes(source, mirror, tmp_path, driver_kills=[BETWEEN_MEMBERS],
                           worker_kills_after=[1], keys=20)


@pytest.mark.crash
@pytest.mark.long
def test_the_mirror_equals_the_source_after_a_driver_kill_at_every_point(
    source: CdcSource, mirror: Mirror, tmp_path: Path
) -> None:
    mirror_through_crashes(source, mirror, tmp_path, driver_kills=GROUP_CRASH_POINTS,
                           worker_kills_after=[2, 4], keys=30)
