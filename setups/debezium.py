"""The real Debezium pipeline's parts, as the tests and the chaos rounds take them.

The pipeline: PostgreSQL (a cluster with ``wal_level=logical``,
:func:`~setups.servers.postgres.logical_server`) -> Debezium's PostgreSQL connector on a Kafka
Connect worker (:mod:`setups.servers.kafka_connect`) -> a Kafka broker
(:mod:`setups.servers.kafka`) -> ``examples/debezium_pipeline.py``, a Spark driver run as a user
runs it -> a sink group of a keyed MariaDB table and a keyed PostgreSQL table.

* :func:`fresh_source`: a fresh source table captured by its own connector (slot,
  publication, least-privileged role) into its own topic, as a :class:`CdcSource`, which
  reads the table (:meth:`~CdcSource.rows`) and the topic (:meth:`~CdcSource.events`, as
  :class:`Event`); :func:`newest_rows`, :func:`newest_versions` and :func:`duplicates` say
  what the events describe and how many were sent again.
* :class:`Workload`: inserts, many updates per key (several in one transaction too), deletes
  and re-inserts of the source table's keys, in a thread, until stopped or after a number of
  changes.
* :class:`Mirror`: the pipeline's target tables (:meth:`Mirror.create`), read back sorted,
  with each row's ``version``; :func:`differing_keys` compares them with the source.
* :func:`run_pipeline`: one driver run from the topic into the mirror, in a process session
  of its own, armed at a crash point or not, until it ends, dies, or the caller's hook ends it.
* :func:`kill_worker_with_unsent_offsets`: SIGKILL the Connect worker while the topic holds
  records its committed offset does not cover (Debezium sends them again).

``tests/spark/test_debezium_pipeline.py`` and ``chaos/debezium.py`` take them from here; the
pytest fixtures over them are in the test module. Assertions here are the pipeline's checks
(``tests`` has pytest rewrite them).

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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from setups.delta import delta_scan
from setups.delta import reader as delta_reader
from setups.iceberg import IcebergSetup, iceberg_scan
from setups.iceberg import reader as iceberg_reader
from setups.servers.kafka import KafkaBroker, spark_kafka_jars
from setups.servers.kafka_connect import ConnectWorker, debezium_postgres_config
from setups.servers.mariadb import Db, MariaDBServer
from setups.servers.postgres import PgView, PostgresServer
from sinks.kafka.changelog import CLEANUP_POLICY, COMPACT, VERSION_HEADER
from sinks.postgres.connection import TLS_OF_SSLMODE
from twophase.testing.crash_points import CRASH_ENV, kill_session
from twophase.testing.driver import SPARK_CONF, driver_environment

REPO = Path(__file__).resolve().parents[1]
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
#: How long a connector's replication slot may take to be held, or released.
SLOT_TIMEOUT_S = 60.0
SLOT_RELEASE_TIMEOUT_S = 30.0
KILL_ATTEMPTS = 50
POLL_S = 0.5
#: How a driver run's part of the round's driver log starts.
RUN_HEADER = "=== run, crash point "

Row = tuple[int, str, Decimal | None]


def wait_for(ready: Callable[[], object], what: str, timeout_s: float = 60.0) -> None:
    """Poll ``ready`` until it is true; AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {timeout_s}s")
        time.sleep(0.1)


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
    publication, role) into its own topic (:func:`fresh_source` makes one)."""

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


@contextlib.contextmanager
def fresh_source(server: PostgresServer, broker: KafkaBroker, worker: ConnectWorker, *,
                 partitions: int = TOPIC_PARTITIONS) -> Iterator[CdcSource]:
    """A fresh source table of ``server`` (:data:`SOURCE_DDL`) and its connector on
    ``worker``, running (``snapshot.mode=no_data``: every change after the slot's creation)
    as a role holding only what Debezium needs, its topic of ``partitions`` on ``broker``.
    The connector is deleted and its slot dropped on exit."""
    view = PgView(server)
    table = view.new_table(SOURCE_DDL, prefix="src")
    user, password = f"dbz_{table}", secrets.token_hex(12)
    server.create_replication_user(user, password, [table])
    params = server.params
    source = CdcSource(server, broker, worker, table)
    worker.put_connector(source.connector, debezium_postgres_config(
        host=params.host, port=params.port, database=params.database, user=user,
        password=password, topic_prefix=table, tables=[f"public.{table}"], slot=table,
        snapshot_mode="no_data", partitions=partitions))
    try:
        worker.wait_running(source.connector)
        wait_for(lambda: any(name == table and active
                             for name, _plugin, active in view.replication_slots()),
                 f"replication slot {table} active", SLOT_TIMEOUT_S)
        yield source
    finally:
        worker.delete_connector(source.connector)
        drop_slot(server, table)


def drop_slot(server: PostgresServer, slot: str) -> None:
    """Drop a connector's slot once nothing holds it (a slot pins WAL until dropped)."""
    view = PgView(server)
    with contextlib.suppress(AssertionError):
        wait_for(lambda: not any(name == slot and active
                                 for name, _plugin, active in view.replication_slots()),
                 f"replication slot {slot} released", SLOT_RELEASE_TIMEOUT_S)
    with server.superuser() as conn:
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                     "WHERE slot_name = %s AND NOT active", (slot,))


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


def newest_versions(events: Sequence[Event]) -> dict[int, int | None]:
    """The ``version`` each row of the mirror must have: its key's newest LSN (deleted keys
    left out)."""
    return {key: event.lsn for key, event in newest_by_key(events).items() if event.op != "d"}


def duplicates(events: Sequence[Event]) -> int:
    """Events sent more than once (the same key and LSN again): Debezium's at least once."""
    counts = Counter((event.key, event.lsn) for event in events if event.lsn is not None)
    return sum(count - 1 for count in counts.values())


# -- the workload ------------------------------------------------------------------------------


@dataclass
class Workload:
    """Changes of ``keys`` keys of the source table, one statement or small transaction
    about every ``pace_s``, until stopped (or, given ``changes``, until it made that many):
    inserts of absent keys (again after a delete: a re-insert), updates (several in one
    transaction too), deletes, and deletes followed by a re-insert in one transaction.
    ``counts`` are its changes by kind: each one row changed, an event on the topic."""

    source: CdcSource
    keys: int
    pace_s: float = 0.04
    seed: int = 61
    changes: int | None = None
    counts: Counter[str] = field(default_factory=Counter)
    _stop: threading.Event = field(default_factory=threading.Event)
    _ended: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _error: BaseException | None = None

    def __enter__(self) -> Workload:
        self._thread = threading.Thread(target=self._run, name="workload", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def made(self) -> int:
        """The changes made so far."""
        return sum(self.counts.values())

    @property
    def done(self) -> bool:
        """Whether it has ended: its ``changes`` made, stopped, or failed."""
        return self._ended.is_set()

    def stop(self) -> None:
        """Stop (if it still runs) and wait for it; AssertionError if it failed."""
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
                while not self._stop.is_set() and (self.changes is None
                                                   or self.made < self.changes):
                    self._step(conn, rng, present, deleted)
                    time.sleep(self.pace_s)
        except BaseException as error:  # reported by stop()
            self._error = error
        finally:
            self._ended.set()

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


# -- the targets -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mirror:
    """The pipeline's targets: a MariaDB table and a PostgreSQL table, and their servers."""

    db: Db
    mariadb: MariaDBServer
    mysql_table: str
    pg: PgView
    pg_table: str
    #: The lake targets (None: the databases only).
    lake: LakeMirror | None = None

    @classmethod
    def create(cls, db: Db, pg: PgView, lake: LakeMirror | None = None) -> Mirror:
        """Fresh target tables (:data:`MYSQL_DDL`, :data:`PG_DDL`) on both servers, and the
        lake's if given."""
        return cls(db, db.server, db.new_table(MYSQL_DDL, prefix="mirror_"), pg,
                   pg.new_table(PG_DDL, prefix="mirror_"), lake)

    def mysql_rows(self) -> list[Row]:
        """MariaDB's table, sorted by key."""
        return [(int(i), str(s), a) for i, s, a in self.db.query(
            f"SELECT id, status, amount FROM `{self.mysql_table}` ORDER BY id")]

    def pg_rows(self) -> list[Row]:
        """PostgreSQL's table, sorted by key."""
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


@dataclass(frozen=True)
class LakeMirror:
    """The pipeline's lake targets, created by the driver's first start, a Delta table and an
    Iceberg table (the SQL catalog on SQLite), both read by DuckDB; and a compacted topic of
    the broker, read by a consumer."""

    delta_uri: str
    iceberg: IcebergSetup
    iceberg_options: dict[str, Any]
    broker: KafkaBroker
    changelog_topic: str

    @classmethod
    def create(cls, scratch: Path, broker: KafkaBroker) -> LakeMirror:
        iceberg = IcebergSetup(scratch / "iceberg")
        topic = broker.new_topic("changelog", TOPIC_PARTITIONS, {CLEANUP_POLICY: COMPACT})
        return cls(str(scratch / "delta" / "mirror"), iceberg, iceberg.target_options(),
                   broker, topic)

    def arguments(self) -> list[str]:
        """The driver's options that name the lake targets and the changelog."""
        options = self.iceberg_options
        return ["--delta-table", self.delta_uri, "--iceberg-table", options["table"],
                "--iceberg-catalog", json.dumps(options["catalog"]),
                "--iceberg-catalog-name", options["catalog_name"],
                "--changelog-topic", self.changelog_topic]

    def changelog(self) -> dict[int, tuple[Row, int]]:
        """The topic as compaction leaves it (each key's last record; a tombstone drops the
        key): each key's row and version (its header)."""
        state: dict[int, tuple[Row, int]] = {}
        for record in self.broker.read(self.changelog_topic):
            key = int(record.key)
            if record.value is None:
                state.pop(key, None)
                continue
            row = json.loads(record.value)
            amount = None if row["amount"] is None else Decimal(row["amount"])
            state[key] = ((int(row["id"]), str(row["status"]), amount),
                          int(dict(record.headers)[VERSION_HEADER]))
        return state

    def changelog_rows(self) -> list[Row]:
        """The changelog's rows, sorted by key."""
        return [row for _, (row, _) in sorted(self.changelog().items())]

    def delta_rows(self) -> list[Row]:
        """The Delta table, sorted by key (none: not created yet)."""
        return [(int(i), str(st), a) for i, st, a in self._delta("id, status, amount")]

    def iceberg_rows(self) -> list[Row]:
        """The Iceberg table, sorted by key (none: not created yet)."""
        return [(int(i), str(st), a) for i, st, a in self._iceberg("id, status, amount")]

    def versions(self) -> tuple[dict[int, int], dict[int, int], dict[int, int]]:
        """Each row's ``version``: in the Delta table, in the Iceberg table, in the changelog."""
        return ({int(i): int(v) for i, v in self._delta("id, version")},
                {int(i): int(v) for i, v in self._iceberg("id, version")},
                {key: version for key, (_, version) in self.changelog().items()})

    def _delta(self, columns: str) -> list[Any]:
        if not (Path(self.delta_uri) / "_delta_log").is_dir():
            return []
        with contextlib.closing(delta_reader()) as duck:
            return duck.execute(f"SELECT {columns} FROM {delta_scan(self.delta_uri)} "
                                "ORDER BY id").fetchall()

    def _iceberg(self, columns: str) -> list[Any]:
        catalog = self.iceberg.catalog()
        identifier = self.iceberg_options["table"]
        if not catalog.table_exists(identifier):
            return []
        table = catalog.load_table(identifier)
        if table.current_snapshot() is None:
            return []
        with contextlib.closing(iceberg_reader()) as duck:
            return duck.execute(f"SELECT {columns} FROM {iceberg_scan(table)} "
                                "ORDER BY id").fetchall()


def differing_keys(expected: Sequence[Row], actual: Sequence[Row]) -> list[int]:
    """The keys whose row differs between two tables read whole (:meth:`CdcSource.rows`,
    :meth:`Mirror.mysql_rows`): missing from either, or with other values."""
    want = {row[0]: row for row in expected}
    have = {row[0]: row for row in actual}
    return sorted(key for key in want.keys() | have.keys() if want.get(key) != have.get(key))


# -- the driver --------------------------------------------------------------------------------


@dataclass(frozen=True)
class PipelineRun:
    """How a driver run ended: ``crashed`` at its crash point (SIGKILLed by itself),
    ``killed`` by its caller's ``kill_when`` (a SIGKILL at no named point), or by itself with
    ``returncode``."""

    returncode: int
    crashed: bool
    log: Path
    seconds: float
    killed: bool = False

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def last_line(self) -> str:
        """The last line this run wrote (the runs of a workdir write one log)."""
        run = self.log.read_text(errors="replace").rsplit(RUN_HEADER, 1)[-1]
        lines = [line for line in run.splitlines()[1:] if line.strip()]
        return lines[-1] if lines else "(nothing)"


def run_pipeline(source: CdcSource, mirror: Mirror, workdir: Path, *,
                 crash_at: str | None = None, available_now: bool = False,
                 max_offsets_per_trigger: int = 100, timeout_s: float = DRIVER_TIMEOUT_S,
                 kill_when: Callable[[], bool] | None = None) -> PipelineRun:
    """``examples/debezium_pipeline.py`` from the topic into both targets, in a process
    session of its own (armed at ``crash_at``), until it ends or dies; its checkpoint in
    ``workdir/ckpt``, its log ``workdir/driver.log``. ``kill_when`` is called about every
    :data:`POLL_S` while it runs: once it returns True the driver's session is SIGKILLed.
    A driver still running after ``timeout_s`` is killed and raises TimeoutError."""
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
               "--pg-tls", TLS_OF_SSLMODE[pg.sslmode],
               *(mirror.lake.arguments() if mirror.lake is not None else []),
               "--jars", ",".join(spark_kafka_jars()),
               "--max-offsets-per-trigger", str(max_offsets_per_trigger),
               *(["--available-now"] if available_now else ["--trigger-interval", "1 second"]),
               *[f"--conf={key}={value}" for key, value in conf.items()]]
    env = driver_environment(workdir, [REPO])
    env |= {"MYSQL_PASSWORD": mysql.password, "PGPASSWORD": pg.password}
    if crash_at:
        env[CRASH_ENV] = crash_at
    log = workdir / "driver.log"
    started = time.monotonic()
    killed = timed_out = False
    with log.open("a") as out:
        out.write(f"\n{RUN_HEADER}{crash_at or 'none'} ===\n")
        out.flush()
        process = subprocess.Popen(command, cwd=workdir, env=env, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while process.poll() is None:
                if time.monotonic() - started > timeout_s:
                    timed_out = True
                    break
                if kill_when is not None and kill_when():
                    killed = process.poll() is None
                    break
                time.sleep(POLL_S)
        finally:
            kill_session(process.pid)  # what is left: a JVM whose Python parent died, say
    returncode = process.wait()
    run = PipelineRun(returncode, returncode == -signal.SIGKILL and not (killed or timed_out),
                      log, time.monotonic() - started, killed)
    if timed_out:
        raise TimeoutError(f"the driver ran over {timeout_s}s: {run.tail()}")
    return run


def kill_worker_with_unsent_offsets(source: CdcSource, attempts: int = KILL_ATTEMPTS) -> int:
    """SIGKILL the Connect worker at a moment when the topic holds records of the connector
    that its committed offset does not cover (frozen while looking, so that it commits
    nothing meanwhile): Debezium must send them again. Returns how many it holds; raises
    :class:`NothingUnsentError` if there were none, ``attempts`` times."""
    worker = source.worker
    for _ in range(attempts):
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
    raise NothingUnsentError(f"the worker committed every record it sent, {attempts} times: "
                             "is the workload running?")


class NothingUnsentError(AssertionError):
    """The Connect worker had committed every record it sent, each time it was looked at."""
