"""PostgresSink in the keyed mode against the private PostgreSQL, in both publish modes: the
keyed contract (:mod:`twophase.testing.keyed`), then what only PostgreSQL needs: the staged
mode's reduce across tasks, chunk by chunk, NOT NULL columns a delete leaves empty, the lock
wait bounded and its holder named, the options, and one Spark job routed by key.

Every assertion about data is made on PostgreSQL's own view; every test ends with no prepared
transaction left (checked by the ``pg`` fixture).
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from psycopg import sql

from setups.servers.postgres import PgView, PostgresServer
from sinks.postgres import PostgresSink
from sinks.postgres.connection import DEFAULT_LOCK_TIMEOUT_S
from twophase import (
    Column,
    ConfigurationError,
    FatalError,
    RetryableError,
    SchemaMismatchError,
)
from twophase.testing.contract import QUERY_ID, abort, commit, prepare, use_query_id
from twophase.testing.keyed import (
    KEYED_COLUMNS,
    KeyedContract,
    KeyedTarget,
    State,
    change,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PUBLISH_MODES = ("prepared", "staged")
KEYED_DDL = ("CREATE TABLE {table} (order_id bigint PRIMARY KEY, status text, "
             "version bigint NOT NULL)")
#: A short bound, so that a test of a lock wait takes seconds.
LOCK_TIMEOUT_S = 2.0


class PostgresKeyedTarget(KeyedTarget):
    """A fresh keyed table of the private server and the sinks over it, in one publish mode."""

    def __init__(self, pg: PgView, postgres: PostgresServer, publish: str,
                 ddl: str = KEYED_DDL) -> None:
        self.pg, self.publish = pg, publish
        self.table = pg.new_table(ddl, prefix="keyed_")
        self.options = {**postgres.params.sink_options(), "table": self.table}

    def sink(self, **options: Any) -> PostgresSink:
        chosen = {"mode": "keyed", "key": ("order_id",), "version": "version",
                  "deleted": "op", "publish": self.publish, **options}
        return PostgresSink(**{**self.options, **chosen})

    def checked(self, **options: Any) -> PostgresSink:
        sink = self.sink(**options)
        sink.check_schema(KEYED_COLUMNS)
        return sink

    def state(self) -> State:
        rows = self.pg.query(sql.SQL("SELECT order_id, status, version FROM {}").format(
            sql.Identifier(self.table)))
        return {order_id: (status, version) for order_id, status, version in rows}

    def tombstones(self) -> dict[int, int]:
        return dict(self.pg.query(sql.SQL("SELECT order_id, version FROM {}").format(
            sql.Identifier(f"_twophase_tombstones_{self.table}"))))


@pytest.fixture(params=PUBLISH_MODES)
def publish(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(autouse=True)
def own_query_id() -> Iterator[None]:
    """Every test under a query id of its own (gids are unique per cluster, marker rows per
    database)."""
    use_query_id(str(uuid.uuid4()))
    yield
    use_query_id(QUERY_ID)


@pytest.fixture
def keyed_table(pg: PgView, postgres: PostgresServer, publish: str) -> PostgresKeyedTarget:
    return PostgresKeyedTarget(pg, postgres, publish)


class TestPostgresKeyed(KeyedContract):
    """Every rule of the keyed mode, prepared (rows routed by key) and staged."""

    @pytest.fixture
    def keyed_target(self, keyed_table: PostgresKeyedTarget) -> PostgresKeyedTarget:
        return keyed_table


def committed(sink: PostgresSink, *tasks: list[tuple[Any, ...]], batch: int = 0) -> None:
    """One batch: each of ``tasks`` pre-committed by a task of its own, then committed."""
    handles = [prepare(sink, rows, batch=batch, partition=partition, columns=KEYED_COLUMNS)
               for partition, rows in enumerate(tasks)]
    for handle in handles:
        commit(sink, handle)


def test_staged_one_key_written_by_two_tasks_of_a_batch_ends_with_its_newest_version(
        pg: PgView, postgres: PostgresServer) -> None:
    target = PostgresKeyedTarget(pg, postgres, "staged")
    sink = target.checked()
    assert sink.route_key() is None  # staged, nothing is locked before the decision
    committed(sink, [change(1, 3, "shipped"), change(2, 1, "placed")],
              [change(1, 4, "delivered"), change(2, 2, op="d"), change(1, 2, "paid")])
    assert target.state() == {1: ("delivered", 4)}
    assert target.tombstones() == {2: 2}


def test_chunk_by_chunk_every_step_is_guarded_by_the_version(
        keyed_table: PostgresKeyedTarget) -> None:
    """A thousand shuffled changes to ten keys in chunks of seven rows leave the ten newest."""
    sink = keyed_table.checked(chunk_size=7)
    feed = [change(i % 10, i, f"status {i}", "d" if i % 3 == 0 else "u") for i in range(1000)]
    random.Random(7).shuffle(feed)
    committed(sink, feed)
    newest = {key: max(row[2] for row in feed if row[0] == key) for key in range(10)}
    assert keyed_table.state() == {key: (f"status {version}", version)
                                   for key, version in newest.items() if version % 3}
    assert keyed_table.tombstones() == {key: v for key, v in newest.items() if not v % 3}


def test_a_delete_needs_no_value_for_a_not_null_column_but_an_upsert_does(
        pg: PgView, postgres: PostgresServer, publish: str) -> None:
    target = PostgresKeyedTarget(pg, postgres, publish, ddl=(
        "CREATE TABLE {table} (order_id bigint PRIMARY KEY, status text NOT NULL, "
        "version bigint NOT NULL)"))
    sink = target.checked()
    committed(sink, [change(1, 1, "placed"), change(2, 1, "placed")])
    committed(sink, [change(1, 2, op="d")], batch=1)
    assert target.state() == {2: ("placed", 1)}
    with pytest.raises(SchemaMismatchError, match=r"\[23"):
        prepare(sink, [change(2, 3, None)], batch=2, columns=KEYED_COLUMNS)


def test_the_tombstone_table_has_the_targets_key_and_version_types(
        keyed_table: PostgresKeyedTarget) -> None:
    keyed_table.checked()
    rows = keyed_table.pg.query(
        "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
        "WHERE table_name = %s ORDER BY ordinal_position",
        (f"_twophase_tombstones_{keyed_table.table}",))
    assert rows == [("order_id", "bigint", "NO"), ("version", "bigint", "YES"),
                    ("deleted_at", "timestamp with time zone", "NO")]


@pytest.mark.parametrize("arrow", [False, True], ids=["rows", "arrow"])
def test_a_composite_key_of_other_types_and_a_boolean_marker(
        pg: PgView, postgres: PostgresServer, publish: str, arrow: bool) -> None:
    """Keys as strings into varchar and uuid columns (cast to the table's types, never cut to
    a shorter key), a boolean delete marker the table has no column for."""
    target = PostgresKeyedTarget(pg, postgres, publish, ddl=(
        "CREATE TABLE {table} (tenant varchar(4), id uuid, status text, version bigint, "
        "PRIMARY KEY (tenant, id))"))
    columns = (Column("tenant", "string", False), Column("id", "string", False),
               Column("status", "string", True), Column("version", "bigint", False),
               Column("gone", "boolean", True))
    sink = target.sink(key=("tenant", "id"), deleted="gone")
    sink.check_schema(columns)
    ids = [str(uuid.UUID(int=n)) for n in range(3)]
    batches: list[list[tuple[Any, ...]]] = [
        [("acme", ids[0], "placed", 1, False), ("acme", ids[1], "placed", 1, None),
         ("bee", ids[0], "placed", 1, False)],
        [("acme", ids[0], None, 2, True), ("acme", ids[1], "paid", 3, False),
         ("acme", ids[1], "late", 2, False), ("bee", ids[0], "late", 1, False)],
        [("acme", ids[0], "late", 1, False)]]
    for batch, rows in enumerate(batches):
        commit(sink, prepare(sink, rows, batch=batch, columns=columns, arrow=arrow))
    state = pg.query(sql.SQL("SELECT tenant, id::text, status, version FROM {} ORDER BY 1, 2"
                             ).format(sql.Identifier(target.table)))
    assert state == [("acme", ids[1], "paid", 3), ("bee", ids[0], "placed", 1)]
    with pytest.raises(SchemaMismatchError, match=r"\[22001\]"):  # too long: refused, not cut
        prepare(sink, [("acme-corp", ids[0], "new", 9, False)], batch=3, columns=columns)


# -- the lock wait: bounded, its holder named --------------------------------------------------

@pytest.mark.parametrize("existing", [False, True], ids=["new-key", "existing-key"])
def test_two_prepared_tasks_of_a_batch_writing_one_key_fail_within_the_lock_timeout(
        pg: PgView, postgres: PostgresServer, existing: bool) -> None:
    """What routing by key prevents: task 1 waits on the lock of task 0's prepared transaction,
    which only the decision (waiting for task 1) would release. The wait is bounded and the
    error names the prepared transaction of this query and the fix."""
    target = PostgresKeyedTarget(pg, postgres, "prepared")
    sink = target.checked(lock_timeout_s=LOCK_TIMEOUT_S)
    if existing:
        committed(sink, [change(7, 1, "placed")])
    first = prepare(sink, [change(7, 2, "paid")], batch=1, partition=0, columns=KEYED_COLUMNS)
    started = time.monotonic()
    try:
        with pytest.raises(FatalError, match=(
                r"(?s)waited lock_timeout .*prepared transaction tph\.[^ ]*\.1\.0\.0\.[^ ]*, a "
                r"prepared transaction of this query \(batch 1, task 0\).*not routed by key"
                r".*Fix: let twophase.spark route the rows by key")):
            prepare(sink, [change(7, 3, "shipped")], batch=1, partition=1,
                    columns=KEYED_COLUMNS)
        assert time.monotonic() - started < LOCK_TIMEOUT_S + 8
    finally:
        abort(sink, first)
    assert target.state() == ({7: ("placed", 1)} if existing else {})


def test_a_lock_held_by_another_client_names_its_session(
        pg: PgView, postgres: PostgresServer) -> None:
    target = PostgresKeyedTarget(pg, postgres, "prepared")
    sink = target.checked(lock_timeout_s=LOCK_TIMEOUT_S)
    committed(sink, [change(7, 1, "placed")])
    with postgres.connect(autocommit=False, application_name="nightly-report") as other:
        other.execute(sql.SQL("SELECT 1 FROM {} WHERE order_id = 7 FOR UPDATE").format(
            sql.Identifier(target.table)))
        pid = other.info.backend_pid
        with pytest.raises(RetryableError, match=(
                rf"(?s)a lock held by session pid {pid} \(application_name 'nightly-report'"
                rf".*Fix: end that client's transaction \(SELECT pg_terminate_backend\({pid}")):
            prepare(sink, [change(7, 2, "paid")], batch=1, columns=KEYED_COLUMNS)
        other.rollback()
    assert target.state() == {7: ("placed", 1)}


def test_a_lock_wait_is_bounded_by_default_and_unbounded_only_when_asked(
        pg: PgView, postgres: PostgresServer) -> None:
    target = PostgresKeyedTarget(pg, postgres, "prepared")

    def lock_timeout(sink: PostgresSink) -> str:
        conn = sink.server.connect()
        try:
            row = conn.execute("SHOW lock_timeout").fetchone()
            return str(row[0]) if row else ""
        finally:
            conn.close()

    assert DEFAULT_LOCK_TIMEOUT_S == 50.0
    assert lock_timeout(target.sink()) == "50s"
    assert lock_timeout(target.sink(lock_timeout_s=0.25)) == "250ms"
    assert lock_timeout(target.sink(lock_timeout_s=None)) == "0"  # the server's: no limit
    for wrong in (0, -1.0, True):
        with pytest.raises(ConfigurationError, match=r"lock_timeout_s=.* must be positive"):
            target.sink(lock_timeout_s=wrong)


# -- options and schema ------------------------------------------------------------------------

def test_only_the_prepared_keyed_mode_routes_rows_by_key(
        pg: PgView, postgres: PostgresServer) -> None:
    target = PostgresKeyedTarget(pg, postgres, "prepared")
    assert target.sink().route_key() == ("order_id",)
    assert target.sink(publish="staged").route_key() is None
    assert target.sink(mode="upsert", version=None, deleted=None).route_key() is None


def test_keyed_options_and_schema_are_checked(
        pg: PgView, postgres: PostgresServer, publish: str) -> None:
    target = PostgresKeyedTarget(pg, postgres, publish)
    with pytest.raises(ConfigurationError, match="staged' takes mode='insert' or mode='keyed'"):
        target.sink(mode="upsert", version=None, deleted=None, publish="staged")
    with pytest.raises(ConfigurationError, match="tombstone_retention_s=0 must be positive"):
        target.sink(tombstone_retention_s=0)
    with pytest.raises(SchemaMismatchError, match=r"reads column 'op'.*Fix: select the key"):
        target.sink().check_schema(KEYED_COLUMNS[:3])
    with pytest.raises(SchemaMismatchError, match=r"key \['status'\] is not a PRIMARY"):
        target.sink(key=("status",)).check_schema(KEYED_COLUMNS)
    with pytest.raises(SchemaMismatchError, match="has no column 'seq'"):
        target.sink(version="seq").check_schema(
            [*KEYED_COLUMNS[:2], Column("seq", "bigint", False), KEYED_COLUMNS[3]])


def test_a_user_without_delete_is_told_what_to_grant(
        pg: PgView, postgres: PostgresServer) -> None:
    target = PostgresKeyedTarget(pg, postgres, "prepared")
    target.checked()  # the owner creates the marker and tombstone tables
    tombstones = f"_twophase_tombstones_{target.table}"
    with postgres.superuser(postgres.params.database) as admin:
        admin.execute("DROP ROLE IF EXISTS keyed_writer")
        admin.execute("CREATE ROLE keyed_writer LOGIN PASSWORD 'keyed'")
        for table in (target.table, "_twophase_markers", tombstones):
            admin.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE ON {} TO keyed_writer").format(
                sql.Identifier(table)))
    try:
        sink = target.sink(user="keyed_writer", password="keyed")
        with pytest.raises(ConfigurationError, match=(
                r"lacks DELETE ON .*Fix: GRANT DELETE ON \"public\".\"keyed_")):
            sink.check_schema(KEYED_COLUMNS)
    finally:
        with postgres.superuser(postgres.params.database) as admin:
            admin.execute("DROP OWNED BY keyed_writer")
            admin.execute("DROP ROLE keyed_writer")


def test_purged_tombstones_skip_those_a_prepared_writer_holds(
        pg: PgView, postgres: PostgresServer) -> None:
    """A purge never waits on a tombstone a prepared transaction locked: it leaves it (staged
    writers lock no tombstone before the decision)."""
    keyed_table = PostgresKeyedTarget(pg, postgres, "prepared")
    sink = keyed_table.checked(lock_timeout_s=LOCK_TIMEOUT_S)
    committed(sink, [change(1, 1, op="d"), change(2, 1, op="d")])
    held = prepare(sink, [change(1, 2, op="d")], batch=1, columns=KEYED_COLUMNS)
    try:
        with sink.committer() as committer:
            assert committer.purge_tombstones(datetime.now(UTC) + timedelta(seconds=1)) == 1
    finally:
        commit(sink, held)
    assert keyed_table.tombstones() == {1: 2}


# -- Spark -------------------------------------------------------------------------------------

@pytest.mark.spark
def test_a_spark_job_routed_by_key_ends_with_the_newest_version_of_each_key(
        spark: SparkSession, pg: PgView, postgres: PostgresServer, tmp_path: Path) -> None:
    """Each key's changes spread over two input partitions (round robin); ``route_by_key=2``
    brings every key to one task, so no task waits on another's prepared transaction."""
    from twophase.spark import write  # noqa: PLC0415 - pyspark only here

    target = PostgresKeyedTarget(pg, postgres, "prepared")
    sink = target.sink(lock_timeout_s=10.0)
    feed = [change(key, version, f"status {version}") for version in range(1, 6)
            for key in range(8)]
    random.Random(3).shuffle(feed)
    df = spark.createDataFrame(
        feed, "order_id long, status string, version long, op string").repartition(2)
    write(df, sink, state_location=str(tmp_path / "state"), route_by_key=2)
    assert target.state() == {key: ("status 5", 5) for key in range(8)}
