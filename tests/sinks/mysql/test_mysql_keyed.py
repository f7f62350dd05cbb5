"""MySQLXASink in ``mode="keyed"`` against the private MariaDB: the keyed contract
(:mod:`twophase.testing.keyed`: newest version wins in a task and across batches, late and
repeated changes are no-ops, deletes keep tombstones, a boolean or Debezium's ``op`` marks them,
rows and Arrow, the options), then what only XA branches under row locks show: tasks writing
neighbouring keys never wait for each other's prepared branches, composite keys, the tombstone
table and its purge, the schema checks, and one Spark job whose rows of a key arrive in two
partitions.

Every assertion about data is made on MariaDB's own view; every test ends with no prepared XA
branch left on the server (the ``db`` fixture checks).
"""

from __future__ import annotations

import random
import re
import secrets
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from setups.servers.mariadb import Db, MariaDBServer
from sinks.mysql import MySQLXASink
from sinks.mysql.schema import Table
from tests.sinks.mysql.mysql_table import new_query_id
from twophase import Column, ConfigurationError, Handle, RetryableError, SchemaMismatchError
from twophase.kit.sql import tombstone_table_name
from twophase.testing.contract import context, prepare
from twophase.testing.keyed import (
    KEYED_COLUMNS,
    KeyedContract,
    KeyedTarget,
    State,
    change,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KEYED_DDL = ("CREATE TABLE `{table}` (order_id BIGINT NOT NULL PRIMARY KEY, "
             "status VARCHAR(32), version BIGINT NOT NULL) ENGINE=InnoDB")
#: Every lock wait of the tests' sinks ends after this long (a test that waits fails fast).
LOCK_WAIT_S = 5


class MySQLKeyedTarget(KeyedTarget):
    """A fresh keyed table (no ``op`` column: the marker is read, never written) with a marker
    table of its own (the keyed contract reuses transaction ids from test to test)."""

    def __init__(self, server: MariaDBServer, db: Db, ddl: str = KEYED_DDL) -> None:
        self.server, self.db = server, db
        self.table = db.new_table(ddl, prefix="keyed_")

    def sink(self, **options: Any) -> MySQLXASink:
        chosen = {"mode": "keyed", "key": ("order_id",), "version": "version", "deleted": "op",
                  "marker_table": f"m_{self.table}", "lock_wait_timeout_s": LOCK_WAIT_S,
                  **options}
        return MySQLXASink(**{**self.server.params.kwargs(), "table": self.table, **chosen})

    @property
    def tombstone_table(self) -> str:
        return tombstone_table_name(self.table, 64)

    def state(self) -> State:
        return {order_id: (status, version) for order_id, status, version in self.db.query(
            f"SELECT order_id, status, version FROM `{self.table}`")}

    def tombstones(self) -> dict[int, int]:
        return dict(self.db.query(f"SELECT order_id, version FROM `{self.tombstone_table}`"))


class TestMySQLKeyed(KeyedContract):
    @pytest.fixture
    def keyed_target(self, mariadb: MariaDBServer, db: Db) -> MySQLKeyedTarget:
        return MySQLKeyedTarget(mariadb, db)


@pytest.fixture
def target(mariadb: MariaDBServer, db: Db) -> MySQLKeyedTarget:
    return MySQLKeyedTarget(mariadb, db)


@pytest.fixture
def sink(target: MySQLKeyedTarget) -> MySQLXASink:
    created = target.sink()
    created.check_schema(KEYED_COLUMNS)
    return created


def prepared(sink: MySQLXASink, rows: Sequence[Sequence[Any]], query_id: str, *,
             batch: int = 0, partition: int = 0,
             columns: Sequence[Column] = KEYED_COLUMNS) -> Handle:
    """A task's begin, write and pre-commit of ``rows``."""
    return prepare(sink, rows, query_id=query_id, batch=batch, partition=partition,
                   columns=columns)


def committed(sink: MySQLXASink, *handles: Handle) -> None:
    with sink.committer() as committer:
        for handle in handles:
            committer.commit(handle)


def applied(sink: MySQLXASink, query_id: str, *tasks: Sequence[Sequence[Any]], batch: int = 0,
            columns: Sequence[Column] = KEYED_COLUMNS) -> None:
    """One batch: each of ``tasks`` prepared by a task of its own, then all committed."""
    committed(sink, *(prepared(sink, rows, query_id, batch=batch, partition=partition,
                               columns=columns)
                      for partition, rows in enumerate(tasks)))


# -- locks: what only prepared branches under row locks show -----------------------------------

def test_two_tasks_writing_neighbouring_keys_never_wait_for_each_other(
        sink: MySQLXASink, target: MySQLKeyedTarget) -> None:
    """Task 0 updates keys 1..10 and deletes the absent key 25, task 1 updates 11..20 and
    inserts 21..24, the two writing at the same time. Under REPEATABLE READ task 0's locking
    read of key 25 locks the gap above 20 (until its branch is prepared on MariaDB, until the
    decision on MySQL 8), so task 1's inserts wait for it until the lock wait times out:
    measured, this test fails so when the branches run REPEATABLE READ."""
    query = new_query_id()
    applied(sink, query, [change(key, 1, "placed") for key in range(1, 21)])
    first = [change(key, 2, "paid") for key in range(1, 11)] + [change(25, 2, op="d")]
    second = ([change(key, 2, "paid") for key in range(11, 21)]
              + [change(key, 2, "placed", "c") for key in range(21, 25)])
    tasks = [sink.begin_transaction(context(query_id=query, batch=1, partition=partition,
                                            columns=KEYED_COLUMNS)) for partition in (0, 1)]
    try:
        sink.write(tasks[0], first)
        started = time.monotonic()
        sink.write(tasks[1], second)
        assert time.monotonic() - started < LOCK_WAIT_S / 2
        handles = [sink.pre_commit(task) for task in tasks]
    except BaseException:
        for task in tasks:
            sink.discard(task)
        raise
    committed(sink, *handles)

    assert target.state() == {**{key: ("paid", 2) for key in range(1, 21)},
                              **{key: ("placed", 2) for key in range(21, 25)}}
    assert target.tombstones() == {25: 2}


def test_a_prepared_branch_keeps_its_keys_until_the_decision(
        sink: MySQLXASink, target: MySQLKeyedTarget) -> None:
    """What routing by key avoids: a second task writing a key of a prepared branch waits for
    it, and gives up after the lock wait (retryable, the fix naming the routing)."""
    query = new_query_id()
    holder = prepared(sink, [change(7, 1, "placed")], query)
    with pytest.raises(RetryableError, match=r"\[1205\].*Fix: .*route_by_key="):
        prepared(sink, [change(7, 2, "paid")], query, partition=1)
    committed(sink, holder)
    assert target.state() == {7: ("placed", 1)}


def test_a_server_logging_statements_is_named_with_its_fix(
        mariadb: MariaDBServer, sink: MySQLXASink, target: MySQLKeyedTarget) -> None:
    with mariadb.global_variable("binlog_format", "'STATEMENT'"), pytest.raises(
            ConfigurationError, match=r"\[1665\].*Fix: .*binlog_format = 'ROW'"):
        prepared(sink, [change(1, 1)], new_query_id())
    assert target.state() == {}


# -- values and keys ---------------------------------------------------------------------------

def test_a_composite_key_of_text_keeps_the_newest_per_key(mariadb: MariaDBServer,
                                                          db: Db) -> None:
    composite = MySQLKeyedTarget(mariadb, db, (
        "CREATE TABLE `{table}` (tenant VARCHAR(8) NOT NULL, order_id BIGINT NOT NULL, "
        "status VARCHAR(32), version BIGINT NOT NULL, PRIMARY KEY (tenant, order_id)) "
        "ENGINE=InnoDB"))
    columns = (Column("tenant", "string", False), *KEYED_COLUMNS)
    sink = composite.sink(key=("tenant", "order_id"))
    sink.check_schema(columns)
    query = new_query_id()
    applied(sink, query, [("eu", 1, "placed", 1, "c"), ("us", 1, "placed", 1, "c"),
                          ("eu", 2, "placed", 1, "c")], columns=columns)
    applied(sink, query, [("eu", 1, "paid", 3, "u"), ("eu", 1, "stale", 2, "u"),
                          ("us", 1, None, 2, "d"), ("eu", 2, "late", 0, "u")], batch=1,
            columns=columns)
    applied(sink, query, [("us", 1, "resurrected", 1, "u")], batch=2, columns=columns)

    assert sorted(db.query(f"SELECT tenant, order_id, status, version FROM `{composite.table}`")
                  ) == [("eu", 1, "paid", 3), ("eu", 2, "placed", 1)]
    assert db.query(f"SELECT tenant, order_id, version FROM `{composite.tombstone_table}`"
                    ) == [("us", 1, 2)]


def test_one_keys_changes_in_several_chunks_of_a_task_keep_the_newest(
        target: MySQLKeyedTarget) -> None:
    """Chunks of two rows: a later chunk of the branch reads what an earlier one wrote."""
    sink = target.sink(chunk_size=2)
    sink.check_schema(KEYED_COLUMNS)
    applied(sink, new_query_id(), [
        change(1, 3, "shipped"), change(2, 5, op="d"),  # chunk 1
        change(1, 2, "paid"), change(2, 4, "late"),  # chunk 2: older, no-ops
        change(2, 6, "placed again", "c"), change(3, 1, op="d"),  # chunk 3
        change(3, 2, "placed"), change(1, 4, op="d")])  # chunk 4
    assert target.state() == {2: ("placed again", 6), 3: ("placed", 2)}
    assert target.tombstones() == {1: 4}


def test_the_delete_marker_is_read_never_written(mariadb: MariaDBServer, db: Db) -> None:
    """The table may even have a column of the marker's name: it is left alone."""
    with_op = MySQLKeyedTarget(mariadb, db, KEYED_DDL.replace(
        ") ENGINE", ", op VARCHAR(1) DEFAULT 'x') ENGINE"))
    sink = with_op.sink()
    sink.check_schema(KEYED_COLUMNS)
    applied(sink, new_query_id(), [change(1, 1, op="c"), change(2, 1, op="u")])
    assert db.query(f"SELECT order_id, op FROM `{with_op.table}` ORDER BY 1") == [
        (1, "x"), (2, "x")]


def test_the_tombstone_table_takes_the_targets_key_and_version_types(
        sink: MySQLXASink, target: MySQLKeyedTarget, db: Db) -> None:
    types = db.query("SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE FROM "
                     "information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND "
                     "TABLE_NAME = %s ORDER BY COLUMN_NAME", (target.tombstone_table,))
    assert types == [("deleted_at", "datetime(6)", "NO"), ("order_id", "bigint(20)", "NO"),
                     ("version", "bigint(20)", "NO")]
    assert sink.route_key() == ("order_id",)


# -- tombstones --------------------------------------------------------------------------------

def test_the_purge_leaves_a_tombstone_a_prepared_branch_holds(
        sink: MySQLXASink, target: MySQLKeyedTarget, db: Db) -> None:
    query = new_query_id()
    applied(sink, query, [change(1, 1, op="d"), change(2, 1, op="d")])
    reinserted = prepared(sink, [change(1, 2, "placed again", "c")], query, batch=1)
    later = datetime.now(UTC) + timedelta(seconds=1)
    with sink.committer() as committer:
        started = time.monotonic()
        assert committer.purge_tombstones(later) == 1  # key 2; key 1's waits for the decision
        assert time.monotonic() - started < LOCK_WAIT_S
        committer.commit(reinserted)
        assert committer.tombstones() == (0, None)
    assert target.state() == {1: ("placed again", 2)}


def test_tombstones_older_than_the_cutoff_only_are_purged(
        sink: MySQLXASink, target: MySQLKeyedTarget, db: Db) -> None:
    applied(sink, new_query_id(), [change(key, 1, op="d") for key in range(5)])
    db.query(f"UPDATE `{target.tombstone_table}` SET deleted_at = deleted_at - INTERVAL 2 DAY "
             "WHERE order_id < 3")
    with sink.committer() as committer:
        count, oldest = committer.tombstones()
        assert count == 5 and oldest is not None
        assert timedelta(days=2) - timedelta(minutes=1) < datetime.now(UTC) - oldest
        assert committer.purge_tombstones(datetime.now(UTC) - timedelta(days=1)) == 3
    assert target.tombstones() == {3: 1, 4: 1}


# -- the schema and the options ----------------------------------------------------------------

def test_the_key_must_be_a_unique_key_and_the_version_a_column_of_the_table(
        target: MySQLKeyedTarget, db: Db) -> None:
    with pytest.raises(SchemaMismatchError, match=r"the upsert key \['status'\] is not a "
                                                  r"PRIMARY or UNIQUE key"):
        target.sink(key=("status",)).check_schema(KEYED_COLUMNS)
    renamed = (KEYED_COLUMNS[0], KEYED_COLUMNS[1], Column("lsn", "bigint"), KEYED_COLUMNS[3])
    with pytest.raises(SchemaMismatchError, match=r"has no column 'lsn'"):
        target.sink(version="lsn").check_schema(renamed)
    with pytest.raises(SchemaMismatchError, match=r"reads column 'op', which the rows do not"):
        target.sink().check_schema(KEYED_COLUMNS[:3])


def test_a_tombstone_table_of_another_key_is_refused(target: MySQLKeyedTarget,
                                                      db: Db) -> None:
    db.query(f"CREATE TABLE `{target.tombstone_table}` (order_id BIGINT NOT NULL PRIMARY KEY, "
             "lsn BIGINT NOT NULL, deleted_at DATETIME(6) NOT NULL) ENGINE=InnoDB")
    with pytest.raises(SchemaMismatchError, match=r"tombstone table .* has no column 'version'"):
        target.sink().check_schema(KEYED_COLUMNS)


def test_the_privileges_of_the_keyed_mode_are_named(
        mariadb: MariaDBServer, sink: MySQLXASink, target: MySQLKeyedTarget) -> None:
    database = mariadb.params.database
    user, password = f"keyed_{secrets.token_hex(3)}", secrets.token_hex(12)
    tombstones = Table(database, target.tombstone_table)
    markers = f"SELECT, INSERT, UPDATE, DELETE ON `{database}`.`m_{target.table}`"
    temporary = f"CREATE TEMPORARY TABLES ON `{database}`.*"
    for lacking, missing in ((target.table, f"DELETE ON `{database}`.`{target.table}`"),
                             (target.tombstone_table, f"DELETE ON {tombstones}"),
                             (temporary, temporary)):
        mariadb.create_user(user, password, [markers, *(
            f"SELECT, INSERT, UPDATE{'' if name == lacking else ', DELETE'} "
            f"ON `{database}`.`{name}`" for name in (target.table, target.tombstone_table)),
            *(() if lacking == temporary else (temporary,))])
        with pytest.raises(ConfigurationError, match=rf"lacks {re.escape(missing)}[.\s]"):
            target.sink(user=user, password=password).check_schema(KEYED_COLUMNS)
    mariadb.create_user(user, password, [markers, temporary, *(
        f"SELECT, INSERT, UPDATE, DELETE ON `{database}`.`{name}`"
        for name in (target.table, target.tombstone_table))])
    target.sink(user=user, password=password, bulk="load_data").check_schema(KEYED_COLUMNS)


@pytest.mark.parametrize(("options", "message"), [
    ({"mode": "insert"}, "belong to mode='keyed', not mode='insert'"),
    ({"deleted": None, "mode": "upsert"}, "belong to mode='keyed', not mode='upsert'"),
    ({"version": None}, "needs the key columns and a version column"),
    ({"key": ()}, "mode='keyed' needs the key columns"),
])
def test_keyed_options_are_checked(target: MySQLKeyedTarget, options: dict[str, Any],
                                   message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        target.sink(**options)


def test_upsert_takes_an_optional_key_and_routes_nothing(target: MySQLKeyedTarget) -> None:
    written = KEYED_COLUMNS[:3]
    upsert = target.sink(mode="upsert", version=None, deleted=None)
    upsert.check_schema(written)
    assert upsert.route_key() is None and upsert.keyed is None
    target.sink(mode="upsert", version=None, deleted=None, key=("order_id",)
                ).check_schema(written)
    with pytest.raises(SchemaMismatchError, match=r"the upsert key \['status'\]"):
        target.sink(mode="upsert", version=None, deleted=None, key=("status",)
                    ).check_schema(written)


# -- Spark: rows of one key in two partitions, routed by key -----------------------------------

@pytest.mark.spark
def test_spark_routes_the_rows_of_a_key_from_two_partitions_into_one_task(
        spark: SparkSession, target: MySQLKeyedTarget, tmp_path: Path) -> None:
    from pyspark.sql.functions import spark_partition_id  # noqa: PLC0415 - pyspark only here

    from twophase.spark import write  # noqa: PLC0415

    feed = [change(i % 5, i, f"status {i}", "d" if i % 7 == 3 else "u") for i in range(40)]
    random.Random(47).shuffle(feed)
    df = spark.createDataFrame(feed, "order_id long, status string, version long, op string")
    spread = df.repartition(2)  # round-robin: every key's rows in both partitions
    placed = spread.select("order_id", spark_partition_id().alias("p")).distinct()
    assert [row["count"] for row in placed.groupBy("order_id").count().collect()] == [2] * 5

    write(spread, target.sink(), state_location=str(tmp_path / "state"), route_by_key=2)

    newest = {key: max(row[2] for row in feed if row[0] == key) for key in range(5)}
    assert target.state() == {key: (f"status {version}", version)
                              for key, version in newest.items() if version % 7 != 3}
    assert target.tombstones() == {key: v for key, v in newest.items() if v % 7 == 3}


def test_tasks_routed_by_key_never_wait_for_each_others_prepared_branch(
        sink: MySQLXASink, target: MySQLKeyedTarget) -> None:
    """Batches of updates, deletes, re-inserts and new keys, their keys split between two
    tasks as routing splits them (interleaved): the second task writes while the first one's
    branch is prepared, and never waits for it. Over 1,000 keys per task: MariaDB reads a
    longer IN list as a join that scans the key's index and waits for the other branch's rows
    (measured: this test waited out the lock timeout before the reads were paged)."""
    query = new_query_id()
    keys = 2000
    applied(sink, query, [change(key, 0, "placed", "d" if key % 5 == 0 else "c")
                          for key in range(keys)])
    for batch in (1, 2):
        feed = [change((v * 7919) % (keys + 50), batch * 100000 + v, f"s{v}",
                       "d" if v % 10 == 0 else "u") for v in range(5000)]
        tasks = [[row for row in feed if row[0] % 2 == partition] for partition in (0, 1)]
        first = prepared(sink, tasks[0], query, batch=batch, partition=0)
        started = time.monotonic()
        try:
            second = prepared(sink, tasks[1], query, batch=batch, partition=1)
        finally:
            waited = time.monotonic() - started
        committed(sink, first, second)
        assert waited < LOCK_WAIT_S / 2
