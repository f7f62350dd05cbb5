"""The real Debezium pipeline, with real parts and no mocks.

PostgreSQL (a private cluster with ``wal_level=logical``) -> Debezium's PostgreSQL connector
(``pgoutput``, a least-privileged replication role) on a Kafka Connect worker (Apache Kafka's
own runtime, the broker's version, distributed: its connector and offsets in the broker) -> the
session's Kafka broker -> Spark's Kafka source -> :func:`twophase.debezium.debezium_changes` ->
a sink group of a keyed :class:`~sinks.mysql.MySQLXASink` (MariaDB), a keyed
:class:`~sinks.postgres.PostgresSink` (the session's PostgreSQL), a keyed
:class:`~sinks.delta.DeltaSink` and a keyed :class:`~sinks.iceberg.IcebergSink` (the SQL
catalog on SQLite) and a keyed :class:`~sinks.kafka.KafkaSink` (a compacted topic),
committed in that order.
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
  (both read as sorted lists of tuples; the lake tables by DuckDB), every row's ``version``
  is its key's newest LSN on the topic, nothing is in doubt (``XA RECOVER``,
  ``pg_prepared_xacts``) and the state file has nothing pending. In CI three driver kills
  (either side of the decision, and between the members' commits) and one worker kill;
  ``-m long``: a driver kill at each of the group's six points and two worker kills.

The pipeline's parts (the source and its connector, the workload, the mirror, a driver run,
a worker kill) are in :mod:`setups.debezium`, which ``scripts/chaos-debezium``
(:mod:`chaos.debezium`) also plays, in rounds of many faults; the fixtures over them are here.
The connector runs with ``snapshot.mode=no_data`` (why: :mod:`setups.debezium`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from decimal import Decimal
from pathlib import Path

import pytest
from psycopg import sql

from setups.debezium import (
    DELIVERY_TIMEOUT_S,
    CdcSource,
    LakeMirror,
    Mirror,
    Workload,
    duplicates,
    fresh_source,
    kill_worker_with_unsent_offsets,
    newest_versions,
    run_pipeline,
    wait_for,
)
from setups.servers.kafka import KafkaBroker
from setups.servers.kafka_connect import ConnectWorker, start_worker
from setups.servers.mariadb import Db
from setups.servers.postgres import PgView, PostgresServer, logical_server
from tests.fixtures import starts_server
from twophase._state import StateStore
from twophase.testing.crash_points import (
    AFTER_DECISION,
    BEFORE_DECISION,
    BETWEEN_MEMBERS,
    GROUP_CRASH_POINTS,
)

pytestmark = [pytest.mark.spark]


@pytest.fixture(scope="module")
@starts_server
def cdc_postgres() -> Iterator[PostgresServer]:
    """A private PostgreSQL with ``wal_level=logical`` for this module's source tables."""
    with logical_server() as server:
        yield server


@pytest.fixture(scope="module")
@starts_server
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
    with fresh_source(cdc_postgres, kafka_broker, connect) as cdc:
        yield cdc


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
    wait_for(lambda: len(source.events()) >= 4, "four events on the topic", DELIVERY_TIMEOUT_S)
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


@pytest.fixture
def mirror(db: Db, pg: PgView, kafka_broker: KafkaBroker, tmp_path: Path) -> Mirror:
    """Fresh target tables on the session's MariaDB and PostgreSQL, a Delta and an Iceberg
    table (created by the driver's first start) and a compacted topic."""
    return Mirror.create(db, pg, LakeMirror.create(tmp_path / "lake", kafka_broker))


def mirror_through_crashes(source: CdcSource, mirror: Mirror, workdir: Path, *,
                           driver_kills: Sequence[str], worker_kills_after: Sequence[int],
                           keys: int) -> None:
    """The workload runs while the driver is killed at each of ``driver_kills`` in turn (the
    k-th at batch k) and the worker after the driver kills numbered in
    ``worker_kills_after``; then the last run drains the topic and the mirror is checked."""
    timings: dict[str, float] = {}
    with Workload(source, keys) as workload:
        wait_for(lambda: len(source.events()) >= 20, "20 events on the topic",
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
    newest = newest_versions(events)
    assert mirror.versions() == (newest, newest), "a row's version is not its newest LSN"
    if mirror.lake is not None:
        assert mirror.lake.delta_rows() == expected, "the Delta table differs from the source"
        assert mirror.lake.iceberg_rows() == expected, \
            "the Iceberg table differs from the source"
        assert mirror.lake.changelog_rows() == expected, \
            "the compacted topic differs from the source"
        assert mirror.lake.versions() == (newest, newest, newest), \
            "a lake row's or record's version is not its newest LSN"
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
    mirror_through_crashes(source, mirror, tmp_path,
                           driver_kills=[BEFORE_DECISION, AFTER_DECISION, BETWEEN_MEMBERS],
                           worker_kills_after=[1], keys=20)


@pytest.mark.crash
@pytest.mark.long
def test_the_mirror_equals_the_source_after_a_driver_kill_at_every_point(
    source: CdcSource, mirror: Mirror, tmp_path: Path
) -> None:
    mirror_through_crashes(source, mirror, tmp_path, driver_kills=GROUP_CRASH_POINTS,
                           worker_kills_after=[2, 4], keys=30)
