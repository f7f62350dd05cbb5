"""MySQLXASink against a real, private MariaDB: outcomes, crashes, bad input, fencing.

Every assertion about data is made on MariaDB's own view (SELECT, XA RECOVER), and every test
ends with no prepared XA branch left on the server (checked by the ``db`` fixture).

The module is also the program of the child processes that the crash tests SIGKILL:
``python -m tests.test_mysql_sink <role> <json>`` (see ``_child_main``).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
import zoneinfo
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pymysql
import pytest

from setups.servers.mariadb import ConnectionParams, Db, MariaDBServer
from sinks.mysql import MARKER_TABLE_DDL, MySQLXASink, xa
from sinks.mysql.arrow import CHUNKS_AHEAD, ArrowChunk, chunks_ahead, chunks_of, encode_batch
from sinks.mysql.connection import WRITER_IDLE_TIMEOUT_S, Server
from sinks.mysql.encoding import encode_tsv
from sinks.mysql.errors import classify
from sinks.mysql.sink import MySQLBranch
from tests.on_setup import MySQLTarget
from twophase import (
    AbortOutcome,
    Column,
    CommitOutcome,
    ConfigurationError,
    FatalError,
    FencedError,
    Handle,
    RetryableError,
    RetryPolicy,
    SchemaMismatchError,
    TransactionContext,
    TxnId,
)
from twophase._coordinator import Coordinator
from twophase._crash import CRASH_ENV
from twophase._handle import query_key
from twophase._state import StateStore
from twophase.testing.contract import SinkContract

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "orders"
COLUMNS = (Column("id", "bigint", False), Column("name", "string"), Column("amount", "double"))
TABLE_DDL = ("CREATE TABLE {table} (id BIGINT NOT NULL PRIMARY KEY, name VARCHAR(16), "
             "amount DOUBLE, CONSTRAINT positive CHECK (amount IS NULL OR amount >= 0)) "
             "ENGINE=InnoDB")
PASSWORD_ENV = "TWOPHASE_TEST_MYSQL_PASSWORD"
CHILD_TIMEOUT_S = 60
FAST_RETRY = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.05)


def new_query_id() -> str:
    return str(uuid.uuid4())


def rows_for(batch: int, partition: int, count: int) -> list[tuple[Any, ...]]:
    first = batch * 1_000_000 + partition * 10_000
    return [(first + i, f"n{first + i}", i * 0.5) for i in range(count)]


def ids_of(*row_sets: Sequence[tuple[Any, ...]]) -> list[int]:
    return sorted(row[0] for rows in row_sets for row in rows)


def make_sink(params: ConnectionParams, table: str, **options: Any) -> MySQLXASink:
    return MySQLXASink(host=params.host, port=params.port, user=params.user,
                       password=params.password, database=params.database, table=table,
                       **options)


def prepare(sink: MySQLXASink, query_id: str, rows: Sequence[Sequence[Any]], *,
            batch: int = 0, partition: int = 0, attempt: int = 0, epoch: int = 1,
            namespace: str = NAMESPACE, columns: Sequence[Column] = COLUMNS,
            path: str = "rows", batches: Sequence[pa.RecordBatch] | None = None) -> Handle:
    """begin + write + pre-commit, as an executor does for one partition.

    ``path="arrow"``: the rows go through ``write_arrow`` as record batches (see
    :func:`record_batches`), as on Spark's data source path; ``batches``: these instead.
    """
    txn_id = TxnId.open(namespace=namespace, query_id=query_id, epoch=epoch, batch=batch,
                        partition=partition, attempt=attempt)
    txn = sink.begin_transaction(TransactionContext(txn_id, tuple(columns)))
    deliver(sink, txn, rows, path, columns, batches)
    return sink.pre_commit(txn)


def deliver(sink: MySQLXASink, txn: MySQLBranch, rows: Sequence[Sequence[Any]], path: str,
            columns: Sequence[Column] = COLUMNS,
            batches: Sequence[pa.RecordBatch] | None = None) -> None:
    """``write`` the rows, or ``write_arrow`` them (or ``batches``) for ``path="arrow"``."""
    if batches is None and path == "rows":
        sink.write(txn, rows)
    else:
        sink.write_arrow(txn, record_batches(rows, arrow_schema(columns)) if batches is None
                         else batches)


# -- the Arrow path ----------------------------------------------------------------------------

PATHS = ("rows", "arrow")
ARROW_TYPES = {"bigint": pa.int64(), "string": pa.string(), "double": pa.float64(),
               "binary": pa.binary(), "decimal(12,3)": pa.decimal128(12, 3),
               "timestamp": pa.timestamp("us", tz="UTC"), "timestamp_ntz": pa.timestamp("us"),
               "date": pa.date32(), "boolean": pa.bool_()}


def arrow_schema(columns: Sequence[Column]) -> pa.Schema:
    """What Spark's Arrow writer sends for these columns (TIMESTAMP in UTC)."""
    return pa.schema([pa.field(c.name, ARROW_TYPES[c.type], c.nullable) for c in columns])


def record_batches(rows: Sequence[Sequence[Any]], schema: pa.Schema,
                   rows_per_batch: int = 2) -> list[pa.RecordBatch]:
    """The rows as record batches of ``rows_per_batch`` rows (so chunks slice across them)."""
    return [pa.RecordBatch.from_pylist([dict(zip(schema.names, row, strict=True))
                                        for row in rows[start:start + rows_per_batch]],
                                       schema=schema)
            for start in range(0, len(rows), rows_per_batch)]


# -- fixtures ----------------------------------------------------------------------------------

@pytest.fixture
def table(db: Db) -> str:
    return db.new_table(TABLE_DDL)


@pytest.fixture
def sink(mariadb: MariaDBServer, table: str) -> MySQLXASink:
    created = make_sink(mariadb.params, table)
    created.check_schema(COLUMNS)
    return created


# -- the shared contract (commit, abort, loss, empty, reuse, namespaces, processes, purge) ----

class TestMySQLContract(MySQLTarget, SinkContract):
    target_options: ClassVar[Mapping[str, Any]] = {"fencing": False}


# -- outcomes ----------------------------------------------------------------------------------

def test_upsert_updates_rows_by_key(mariadb: MariaDBServer, db: Db, table: str) -> None:
    db.query(f"INSERT INTO `{table}` VALUES (1, 'old', 1.0), (2, 'keep', 2.0)")
    upsert = make_sink(mariadb.params, table, mode="upsert")
    upsert.check_schema(COLUMNS)

    handle = prepare(upsert, new_query_id(), [(1, "new", 10.0), (3, "added", 3.0)])
    assert db.query(f"SELECT name FROM `{table}` WHERE id = 1") == [("old",)]
    assert upsert.commit(handle) is CommitOutcome.COMMITTED

    assert db.query(f"SELECT id, name, amount FROM `{table}` ORDER BY id") == [
        (1, "new", 10.0), (2, "keep", 2.0), (3, "added", 3.0)]


AWKWARD_COLUMNS = (Column("id", "bigint", False), Column("s", "string"), Column("b", "binary"),
                   Column("d", "decimal(12,3)"), Column("ts", "timestamp"), Column("day", "date"),
                   Column("flag", "boolean"), Column("x", "double"))
AWKWARD_ROWS = [
    (1, "tab\there\nnewline\\back\\slash \\N\rcr\r\n", bytes(range(256)),
     decimal.Decimal("-12.345"),
     dt.datetime(2024, 2, 29, 23, 59, 58, 123456), dt.date(1999, 12, 31), True, 1e-300),
    (2, "\\N", b"\\N\t\n", decimal.Decimal("1E+3"), dt.datetime(2024, 1, 1), dt.date(2024, 1, 1),
     False, -0.0),
    (3, None, None, None, None, None, None, None),
    (4, "nul\x00 and ünïcødé ✓ 😀", b"", decimal.Decimal("0"), dt.datetime(1970, 1, 1, 0, 0, 1),
     dt.date(1970, 1, 1), True, 3.141592653589793),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("bulk", ["load_data", "insert"])
def test_values_round_trip(mariadb: MariaDBServer, db: Db, bulk: str, path: str) -> None:
    table = db.new_table("CREATE TABLE `{table}` (id BIGINT PRIMARY KEY, s VARCHAR(64), b BLOB, "
                         "d DECIMAL(12,3), ts DATETIME(6), day DATE, flag BOOLEAN, x DOUBLE) "
                         "ENGINE=InnoDB CHARACTER SET utf8mb4")
    writer = make_sink(mariadb.params, table, bulk=bulk, chunk_size=3)
    writer.check_schema(AWKWARD_COLUMNS)

    handle = prepare(writer, new_query_id(), AWKWARD_ROWS, columns=AWKWARD_COLUMNS, path=path)
    assert writer.commit(handle) is CommitOutcome.COMMITTED

    stored = db.query(f"SELECT * FROM `{table}` ORDER BY id")
    expected = [(i, s, None if b is None else bytes(b), d, ts, day,
                 None if flag is None else int(flag), x)
                for i, s, b, d, ts, day, flag, x in AWKWARD_ROWS]
    assert stored == expected


def test_arrow_text_is_the_row_text() -> None:
    """Escapes, NULLs, binary, booleans and integers: the same LOAD DATA bytes on both paths."""
    columns = (Column("id", "bigint"), Column("s", "string"), Column("b", "binary"),
               Column("flag", "boolean"))
    rows = [(1, "\\ \t \n \r \x00 \\N ü", b"\\\t\n\r\x00\xff", True),
            (None, None, None, None),
            (-(2 ** 63), "", b"", False),
            (2 ** 63 - 1, "\\N", b"\\N", None)]
    batches = record_batches(rows, arrow_schema(columns), rows_per_batch=3)
    arrow_text = b"".join(encode_batch(batch).to_pybytes() for batch in batches)
    assert arrow_text == encode_tsv(rows, [c.name for c in columns])
    assert arrow_text.count(b"\n") == len(rows)  # every newline in a value is escaped
    assert b"\\r \\0" in arrow_text and b"\\N\t\\N" in arrow_text


def test_arrow_chunks_slice_batches_to_chunk_size() -> None:
    batch = record_batches(rows_for(0, 0, 5), arrow_schema(COLUMNS), rows_per_batch=5)[0]
    chunks = list(chunks_of([batch, batch.slice(0, 0), batch.slice(0, 2)], 3))
    assert [[piece.num_rows for piece in chunk] for chunk in chunks] == [[3], [2, 1], [1]]
    assert [row for chunk in chunks for row in ArrowChunk(chunk).rows()] == [
        *rows_for(0, 0, 5), *rows_for(0, 0, 2)]


def test_chunks_ahead_encodes_ahead_and_reads_nothing_once_closed() -> None:
    """The helper thread reads and encodes at most CHUNKS_AHEAD chunks ahead of the loader;
    once the generator is closed it has ended, and the batches are read no further."""
    batch = record_batches(rows_for(0, 0, 2), arrow_schema(COLUMNS), rows_per_batch=2)[0]
    taken: list[int] = []

    def spark_batches() -> Iterator[pa.RecordBatch]:
        for number in range(10):
            taken.append(number)
            yield batch

    ahead = chunks_ahead(spark_batches(), 2, encode=True)
    first = next(ahead)
    assert first.text is not None and list(first.tsv()) == [encode_batch(batch)]
    ahead.close()
    assert not [t for t in threading.enumerate() if t.name == "mysql-chunks-ahead"]
    assert len(taken) <= 1 + CHUNKS_AHEAD + 1  # the loaded chunk, the queued one, the last put


def test_chunks_ahead_raises_the_error_of_the_batches_in_the_loader() -> None:
    batch = record_batches(rows_for(0, 0, 2), arrow_schema(COLUMNS), rows_per_batch=2)[0]

    def failing_batches() -> Iterator[pa.RecordBatch]:
        yield batch
        raise ConnectionResetError("the executor's socket closed")

    ahead = chunks_ahead(failing_batches(), 2, encode=False)
    assert next(ahead).text is None  # not encoded: the INSERT path needs no text
    with pytest.raises(ConnectionResetError, match="socket closed"):
        next(ahead)


def test_arrow_nested_column_goes_through_the_row_encoder(sink: MySQLXASink, db: Db,
                                                          table: str) -> None:
    """A type without an Arrow kernel is encoded value by value: its NULLs are written."""
    nested = pa.schema([("id", pa.int64()), ("name", pa.list_(pa.string())),
                        ("amount", pa.float64())])
    rows = [(1, None, 1.0), (2, None, None)]
    handle = prepare(sink, new_query_id(), rows, batches=record_batches(rows, nested))
    assert sink.commit(handle) is CommitOutcome.COMMITTED
    assert db.query(f"SELECT id, name, amount FROM `{table}` ORDER BY id") == rows


# -- time zones --------------------------------------------------------------------------------

SERVER_ZONE = "'+05:30'"  # the server's global time_zone during these tests
CLIENT_TZ = "America/New_York"  # this process's TZ during these tests
UTC_SESSION = "SET time_zone = '+00:00'"
TOKYO = dt.timezone(dt.timedelta(hours=9))
NEW_YORK = zoneinfo.ZoneInfo(CLIENT_TZ)
EPOCH = dt.datetime(1970, 1, 1)
TZ_COLUMNS = (Column("id", "bigint", False), Column("ts", "timestamp"), Column("wall", "timestamp"))
TZ_TABLE_DDL = ("CREATE TABLE `{table}` (id BIGINT PRIMARY KEY, ts TIMESTAMP(6) NULL, "
                "wall DATETIME(6) NULL) ENGINE=InnoDB")
TZ_VALUES: list[dt.datetime | None] = [
    dt.datetime(2024, 3, 10, 7, 30, 0, 123456, tzinfo=dt.UTC),  # New York: 03:30 EDT, after
    dt.datetime(2024, 11, 3, 15, 30, 0, 654321, tzinfo=TOKYO),  # 06:30 UTC = 01:30 EST, the 2nd
    dt.datetime(2024, 11, 3, 1, 30, 0, 500000, tzinfo=NEW_YORK, fold=0),  # 01:30 EDT, the 1st
    dt.datetime(2024, 12, 31, 20, 0, 0, 1, tzinfo=dt.timezone(dt.timedelta(hours=-8))),
    dt.datetime(2024, 3, 10, 2, 30, 0, 999999),  # naive, a wall clock New York skips
    dt.datetime(2024, 11, 3, 1, 30, 0, 1),  # naive, a wall clock New York has twice
    None,
]


def utc_wall_clock(value: dt.datetime) -> dt.datetime:
    """What a DATETIME column must hold: an instant's UTC wall clock, a wall clock unchanged."""
    return value if value.tzinfo is None else value.astimezone(dt.UTC).replace(tzinfo=None)


def unix_time(value: dt.datetime) -> decimal.Decimal:
    """UNIX_TIMESTAMP() of a TIMESTAMP(6) column holding ``value`` (a wall clock read as UTC)."""
    micros = (utc_wall_clock(value) - EPOCH) // dt.timedelta(microseconds=1)
    return decimal.Decimal(micros).scaleb(-6)


@pytest.fixture
def foreign_zones(mariadb: MariaDBServer, db: Db,
                  monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """New server sessions start in +05:30 and this process's local time is New York's."""
    monkeypatch.setenv("TZ", CLIENT_TZ)
    time.tzset()
    try:
        with mariadb.global_variable("time_zone", SERVER_ZONE):
            assert db.query("SELECT @@SESSION.time_zone") == [("+05:30",)]
            assert time.localtime(1_710_055_800).tm_zone == "EDT"  # 2024-03-10 07:30 UTC
            yield
    finally:
        monkeypatch.undo()
        time.tzset()


def tz_batches(rows: Sequence[tuple[Any, ...]]) -> list[pa.RecordBatch]:
    """TZ rows as record batches: instants in a zoned column (New York's zone, to show that
    only the instant counts), wall clocks in an NTZ one (Spark's TIMESTAMP_NTZ)."""
    def schema(zone: str | None) -> pa.Schema:
        kind = pa.timestamp("us", tz=zone)
        return pa.schema([("id", pa.int64()), ("ts", kind), ("wall", kind)])

    return [record_batches([row], schema(None if row[1] is None or row[1].tzinfo is None
                                         else CLIENT_TZ))[0] for row in rows]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("mode", "bulk"),
                         [("insert", "load_data"), ("insert", "insert"), ("upsert", "insert")])
@pytest.mark.usefixtures("foreign_zones")
def test_timestamps_are_stored_in_utc(mariadb: MariaDBServer, db: Db, mode: str,
                                      bulk: str, path: str) -> None:
    """Aware datetimes are instants (TIMESTAMP right, DATETIME in UTC); naive ones wall clocks."""
    table = db.new_table(TZ_TABLE_DDL)
    writer = make_sink(mariadb.params, table, mode=mode, bulk=bulk)
    writer.check_schema(TZ_COLUMNS)
    rows = [(i, value, value) for i, value in enumerate(TZ_VALUES)]
    batches = tz_batches(rows) if path == "arrow" else None

    assert writer.commit(prepare(writer, new_query_id(), rows, columns=TZ_COLUMNS,
                                 batches=batches)) is CommitOutcome.COMMITTED

    instants = db.query(f"SELECT id, UNIX_TIMESTAMP(ts) FROM `{table}` ORDER BY id")
    assert instants == [(i, None if v is None else unix_time(v)) for i, v in enumerate(TZ_VALUES)]
    in_utc = db.query(f"SELECT id, ts, wall FROM `{table}` ORDER BY id", init_command=UTC_SESSION)
    expected = [None if v is None else utc_wall_clock(v) for v in TZ_VALUES]
    assert in_utc == [(i, v, v) for i, v in enumerate(expected)]
    naive = [(i, v) for i, v in enumerate(TZ_VALUES) if v is not None and v.tzinfo is None]
    assert [(i, stored) for i, _ts, stored in in_utc if i in dict(naive)] == naive  # unchanged


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("bulk", ["load_data", "insert"])
def test_aware_datetime_out_of_range_in_utc_is_a_schema_error(mariadb: MariaDBServer, db: Db,
                                                              bulk: str, path: str) -> None:
    table = db.new_table(TZ_TABLE_DDL)
    writer = make_sink(mariadb.params, table, bulk=bulk)
    too_early = dt.datetime(1, 1, 1, tzinfo=TOKYO)  # 0000-12-31 in UTC: no such datetime
    micros = (too_early - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
    instants = pa.array([micros], pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    batch = pa.RecordBatch.from_arrays([pa.array([1]), pa.nulls(1, instants.type), instants],
                                       names=["id", "ts", "wall"])
    with pytest.raises(SchemaMismatchError, match="cannot be sent to MySQL"):
        prepare(writer, new_query_id(), [(1, None, too_early)], columns=TZ_COLUMNS,
                batches=[batch] if path == "arrow" else None)
    assert db.query(f"SELECT COUNT(*) FROM `{table}`") == [(0,)]


@pytest.mark.usefixtures("foreign_zones")
def test_every_sink_session_is_strict_and_utc(sink: MySQLXASink) -> None:
    for options in ({}, {"local_infile": True}, {"idle_timeout_s": 30}):
        conn = sink.server.connect(**options)
        try:
            with conn.cursor() as cursor:
                cursor.execute("SELECT @@SESSION.time_zone, @@SESSION.sql_mode")
                zone, sql_mode = cursor.fetchone()
        finally:
            conn.close()
        assert zone == "+00:00" and "STRICT_TRANS_TABLES" in sql_mode.split(","), options


@pytest.mark.usefixtures("foreign_zones")
def test_own_times_and_purge_cutoff_are_utc(sink: MySQLXASink, db: Db) -> None:
    """Marker times are UTC; a naive purge cutoff is a UTC wall clock, not local time."""
    namespace = "purge-tz"
    before = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    handle = prepare(sink, new_query_id(), rows_for(0, 0, 1), namespace=namespace)
    sink.commit(handle)
    after = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    [(created, prepared, committed)] = db.query(
        "SELECT created_at, prepared_at, committed_at FROM _twophase_xa_markers "
        "WHERE txn_id = %s", (str(handle.txn_id),))
    assert created == dt.datetime.fromtimestamp(handle.txn_id.created, dt.UTC).replace(
        tzinfo=None)
    slack = dt.timedelta(seconds=5)
    assert before - slack <= created <= prepared <= committed <= after + slack

    hour = dt.timedelta(hours=1)
    assert sink.purge_commit_records(namespace, before - hour) == 0  # naive: UTC, not New York
    assert sink.purge_commit_records(namespace, (after - hour).replace(tzinfo=dt.UTC)
                                     .astimezone(TOKYO)) == 0
    assert db.marker(handle) is not None
    assert sink.purge_commit_records(namespace, after + hour) == 1
    assert db.marker(handle) is None


# -- visibility, listing, purge ----------------------------------------------------------------

def test_prepared_rows_invisible_to_read_committed(sink: MySQLXASink, db: Db, table: str) -> None:
    reader = db.server.connect()
    try:
        with reader.cursor() as cursor:
            cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            handle = prepare(sink, new_query_id(), rows_for(0, 0, 100))
            cursor.execute(f"SELECT COUNT(*) FROM `{table}`")
            assert cursor.fetchone() == (0,)
            sink.commit(handle)
            cursor.execute(f"SELECT COUNT(*) FROM `{table}`")
            assert cursor.fetchone() == (100,)
    finally:
        reader.close()


def test_list_in_doubt_filters_by_namespace(sink: MySQLXASink, db: Db) -> None:
    query = new_query_id()
    mine = {prepare(sink, query, rows_for(0, p, 2), partition=p).txn_id for p in range(2)}
    other = prepare(sink, query, rows_for(1, 0, 2), batch=1, namespace="orders-eu")
    prefix_only = prepare(sink, query, rows_for(2, 0, 2), batch=2, namespace="orders_x")
    foreign = ["'tph.orders.not-a-twophase-id','x'",  # our prefix, not our id format
               "X'00ff7470682e','b',7"]  # another application's binary xid
    for xid in foreign:
        db.prepare_foreign(xid)

    in_doubt = sink.list_in_doubt(NAMESPACE)
    assert {h.txn_id for h in in_doubt} == mine  # round trip of every TxnId field
    assert all(h.sink == "mysql" and h.data["gtrid"].startswith("tph.orders.") for h in in_doubt)
    assert [h.txn_id for h in sink.list_in_doubt("orders-eu")] == [other.txn_id]
    assert [h.txn_id for h in sink.list_in_doubt("orders_x")] == [prefix_only.txn_id]

    for handle in [*in_doubt, other, prefix_only]:
        assert sink.abort(handle) is AbortOutcome.ABORTED
    for xid in foreign:
        db.query(f"XA ROLLBACK {xid}")


def test_purge_commit_records(sink: MySQLXASink, db: Db) -> None:
    query, namespace = new_query_id(), "purged"
    old, recent = (prepare(sink, query, rows_for(b, 0, 1), batch=b, namespace=namespace)
                   for b in (0, 1))
    sink.commit(old)
    sink.commit(recent)
    db.query("UPDATE _twophase_xa_markers SET committed_at = UTC_TIMESTAMP(6) - INTERVAL 2 DAY "
             "WHERE txn_id = %s", (str(old.txn_id),))
    pending = prepare(sink, query, rows_for(2, 0, 1), batch=2, namespace=namespace)
    now = dt.datetime.now(dt.UTC)

    assert sink.purge_commit_records(namespace, now - dt.timedelta(days=1)) == 1
    assert db.marker(old) is None and db.marker(recent) is not None
    started = time.monotonic()
    assert sink.purge_commit_records(namespace, now + dt.timedelta(days=1)) == 1
    assert time.monotonic() - started < 2  # never waits for the prepared marker's row lock
    assert sink.purge_commit_records("other", now + dt.timedelta(days=1)) == 0

    assert sink.commit(pending) is CommitOutcome.COMMITTED
    assert db.marker(pending) is not None


# -- crashes -----------------------------------------------------------------------------------

def _child_env(params: ConnectionParams, **extra: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name != CRASH_ENV}
    return {**env, PASSWORD_ENV: params.password, **extra}


def _child_args(params: ConnectionParams, table: str, **job: Any) -> list[str]:
    spec = {"host": params.host, "port": params.port, "user": params.user,
            "database": params.database, "table": table, **job}
    return [sys.executable, "-m", "tests.test_mysql_sink", json.dumps(spec)]


def _run_killed_child(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT_S, start_new_session=True, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr
    return done.stdout


def test_prepared_branches_survive_writer_and_server_kill(
        mariadb: MariaDBServer, sink: MySQLXASink, db: Db, table: str) -> None:
    query = new_query_id()
    out = _run_killed_child(_child_args(mariadb.params, table, role="writer", query=query,
                                        partitions=3, rows=200), _child_env(mariadb.params))
    handles = [Handle.loads(line) for line in out.splitlines()]
    assert len(handles) == 3 and sorted(db.xa_recover()) == sorted(
        (h.data["gtrid"], h.data["bqual"]) for h in handles)  # not the unfinished 4th

    mariadb.restart_after_kill()
    assert len(db.xa_recover()) == 3 and db.ids(table) == []

    assert [sink.commit(h) for h in handles] == [CommitOutcome.COMMITTED] * 3
    assert [sink.commit(h) for h in handles] == [CommitOutcome.ALREADY_COMMITTED] * 3
    assert db.ids(table) == ids_of(*(rows_for(0, p, 200) for p in range(3)))
    assert db.xa_recover() == []
    assert mariadb.root_sql("SELECT COUNT(*) FROM information_schema.INNODB_TRX").strip() == "0"


@pytest.mark.parametrize("crash_at", ["after_decision", "mid_commit"])
def test_coordinator_recovers_across_driver_and_server_kill(
        mariadb: MariaDBServer, sink: MySQLXASink, db: Db, table: str, tmp_path: Path,
        crash_at: str) -> None:
    """Run 1 commits batch 0, decides batch 1 and dies (driver and server, kill -9).

    Run 2 recovers batch 1, then batch 2 sweeps the orphans of run 1: a failed attempt of
    batch 1 (aborted by run 1 before it died) and a batch-2 branch of run 1.
    """
    query = new_query_id()
    _run_killed_child(
        _child_args(mariadb.params, table, role="driver", query=query, state=str(tmp_path)),
        _child_env(mariadb.params, **{CRASH_ENV: f"{crash_at}@1"}))
    store = StateStore(tmp_path)
    crashed = store.read()
    assert crashed is not None and [d.batch for d in crashed.pending] == [1]
    committed_by_run_1 = ids_of(rows_for(0, 0, 30), rows_for(0, 1, 30))
    if crash_at == "mid_commit":
        committed_by_run_1 += ids_of(rows_for(1, 0, 30))
    assert db.ids(table) == sorted(committed_by_run_1)
    assert len(db.xa_recover()) == (3 if crash_at == "after_decision" else 2)

    mariadb.restart_after_kill()
    state = store.start_run(NAMESPACE, {})
    coordinator = Coordinator(sink, store, namespace=NAMESPACE, epoch=state.epoch,
                              retry=FAST_RETRY)
    coordinator.recover()
    batch_2 = [prepare(sink, query, rows_for(2, p, 30), batch=2, partition=p, epoch=state.epoch)
               for p in range(2)]
    coordinator.commit_batch(2, query, batch_2)

    assert db.ids(table) == ids_of(*(rows_for(b, p, 30) for b in range(3) for p in range(2)))
    assert db.xa_recover() == []
    final = store.read()
    assert final is not None and final.pending == () and final.last_done_batch == 2
    recovered = next(r for r in final.history if r.batch == 1)
    assert recovered.already_committed == (1 if crash_at == "mid_commit" else 0)


def test_a_writer_session_ends_on_the_server_after_its_idle_timeout(
        sink: MySQLXASink, db: Db) -> None:
    """A writer whose host vanished leaves a half-open connection the server never hears
    closed: the session's own wait_timeout ends it (and rolls its branch back)."""
    txn_id = TxnId.open(namespace=NAMESPACE, query_id=new_query_id(), epoch=1, batch=0,
                        partition=0, attempt=0)
    txn = sink.begin_transaction(TransactionContext(txn_id, COLUMNS))
    try:
        assert txn.conn is not None
        with txn.conn.cursor() as cursor:
            cursor.execute("SELECT @@SESSION.wait_timeout")
            assert cursor.fetchone() == (WRITER_IDLE_TIMEOUT_S,)
    finally:
        sink.discard(txn)
    assert db.xa_recover() == []


def test_lost_connection_before_prepare_is_retryable_and_leaves_nothing(
        mariadb: MariaDBServer, sink: MySQLXASink, db: Db, table: str) -> None:
    txn_id = TxnId.open(namespace=NAMESPACE, query_id=new_query_id(), epoch=1, batch=0,
                        partition=0, attempt=0)
    txn = sink.begin_transaction(TransactionContext(txn_id, COLUMNS))
    sink.write(txn, rows_for(0, 0, 20))
    mariadb.restart_after_kill()

    with pytest.raises(RetryableError) as lost:
        sink.write(txn, rows_for(0, 1, 20))
    assert mariadb.params.host in str(lost.value) and str(mariadb.port) in str(lost.value)
    assert "never committed" in str(lost.value)
    with pytest.raises(FatalError, match="already prepared or discarded"):
        sink.pre_commit(txn)
    assert db.ids(table) == [] and db.xa_recover() == []


# -- bad input and configuration ---------------------------------------------------------------

@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("bulk", ["load_data", "insert"])
@pytest.mark.parametrize(("rows", "expected"), [
    ([(1, "a", 1.0), (1, "again", 2.0)], "Duplicate"),
    ([(1, None, 1.0), (2, "x" * 17, 1.0)], "'name'"),
    ([(1, "a", -5.0)], "positive"),
], ids=["duplicate-key", "data-too-long", "check-constraint"])
def test_rejected_rows_fail_cleanly(mariadb: MariaDBServer, db: Db, table: str, bulk: str,
                                    rows: list[tuple[Any, ...]], expected: str,
                                    path: str) -> None:
    writer = make_sink(mariadb.params, table, bulk=bulk)
    good = rows_for(0, 1, 5)
    txn_id = TxnId.open(namespace=NAMESPACE, query_id=new_query_id(), epoch=1, batch=0,
                        partition=0, attempt=0)
    txn = writer.begin_transaction(TransactionContext(txn_id, COLUMNS))
    deliver(writer, txn, good, path)

    with pytest.raises(SchemaMismatchError) as rejected:
        deliver(writer, txn, rows, path)
    assert expected in str(rejected.value) and "Fix:" in str(rejected.value)
    assert db.ids(table) == [] and db.xa_recover() == []


def test_null_into_not_null_names_the_column(sink: MySQLXASink, db: Db, table: str) -> None:
    with pytest.raises(SchemaMismatchError, match="'id'"):
        prepare(sink, new_query_id(), [(None, "a", 1.0)])
    assert db.ids(table) == [] and db.xa_recover() == []


@pytest.mark.parametrize("path", PATHS)
def test_unsupported_value_type_names_the_column(sink: MySQLXASink, db: Db, path: str) -> None:
    nested = pa.schema([("id", pa.int64()), ("name", pa.struct([("nested", pa.int64())])),
                        ("amount", pa.float64())])
    rows = [(1, {"nested": 1}, 1.0)]
    with pytest.raises(SchemaMismatchError, match="column 'name' holds a dict"):
        prepare(sink, new_query_id(), rows,
                batches=record_batches(rows, nested) if path == "arrow" else None)
    assert db.xa_recover() == []


def test_check_schema_names_missing_column_and_table(mariadb: MariaDBServer, db: Db,
                                                     table: str) -> None:
    writer = make_sink(mariadb.params, table)
    with pytest.raises(SchemaMismatchError) as missing_column:
        writer.check_schema([*COLUMNS, Column("colour", "string")])
    assert "'colour'" in str(missing_column.value) and "ADD COLUMN" in str(missing_column.value)

    with pytest.raises(SchemaMismatchError, match="`no_such_table` does not exist"):
        make_sink(mariadb.params, "no_such_table").check_schema(COLUMNS)
    with pytest.raises(SchemaMismatchError, match="requires column 'id'"):
        writer.check_schema([Column("name", "string")])
    db.query("CREATE TABLE keyless (id BIGINT AUTO_INCREMENT PRIMARY KEY, name VARCHAR(16), "
             "amount DOUBLE) ENGINE=InnoDB")
    with pytest.raises(SchemaMismatchError, match="PRIMARY or UNIQUE key"):
        make_sink(mariadb.params, "keyless", mode="upsert").check_schema(COLUMNS[1:])

    db.query("CREATE TABLE myisam_t (id INT) ENGINE=MyISAM")
    with pytest.raises(SchemaMismatchError, match="ENGINE=InnoDB"):
        make_sink(mariadb.params, "myisam_t").check_schema([Column("id", "int")])


def test_wrong_password_is_a_clear_configuration_error(mariadb: MariaDBServer, db: Db,
                                                       table: str) -> None:
    params = mariadb.params
    wrong = MySQLXASink(host=params.host, port=params.port, user=params.user,
                        password="not-the-password", database=params.database, table=table)
    txn_id = TxnId.open(namespace=NAMESPACE, query_id=new_query_id(), epoch=1, batch=0,
                        partition=0, attempt=0)
    with pytest.raises(ConfigurationError) as denied:
        wrong.begin_transaction(TransactionContext(txn_id, COLUMNS))
    message = str(denied.value)
    assert "1045" in message and f"{params.host}:{params.port}" in message
    assert "not-the-password" not in message and "password" in message.lower()
    assert db.xa_recover() == []


def test_unreachable_server_names_host_and_port(table: str) -> None:
    with socket.socket() as probe:  # a port with nothing listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    nowhere = MySQLXASink(host="127.0.0.1", port=port, user="u", password="secret-pw",
                          database="d", table=table, connect_timeout_s=2)
    txn_id = TxnId.open(namespace=NAMESPACE, query_id=new_query_id(), epoch=1, batch=0,
                        partition=0, attempt=0)
    with pytest.raises(RetryableError) as unreachable:
        nowhere.begin_transaction(TransactionContext(txn_id, COLUMNS))
    assert f"127.0.0.1:{port}" in str(unreachable.value) and "2003" in str(unreachable.value)
    assert "secret-pw" not in str(unreachable.value)


def test_lock_wait_on_prepared_rows_is_retryable(mariadb: MariaDBServer, sink: MySQLXASink,
                                                 db: Db, table: str) -> None:
    query = new_query_id()
    holder = prepare(sink, query, [(7, "held", 1.0)])
    impatient = make_sink(mariadb.params, table, mode="upsert", lock_wait_timeout_s=1)
    with pytest.raises(RetryableError, match=r"\[1205\].*XA RECOVER"):
        prepare(impatient, query, [(7, "other", 2.0)], attempt=1)
    assert sink.commit(holder) is CommitOutcome.COMMITTED
    assert db.query(f"SELECT name FROM `{table}`") == [("held",)]


def test_server_refusing_local_loads(mariadb: MariaDBServer, db: Db, table: str) -> None:
    """bulk='auto' falls back to INSERT (MySQL 8's default); bulk='load_data' says what to do."""
    mariadb.root_sql("SET GLOBAL local_infile = 0")
    try:
        auto = make_sink(mariadb.params, table)
        auto.check_schema(COLUMNS)
        assert auto.commit(prepare(auto, new_query_id(), rows_for(0, 0, 25))) is (
            CommitOutcome.COMMITTED)
        insisting = make_sink(mariadb.params, table, bulk="load_data")
        with pytest.raises(ConfigurationError, match="local_infile=1"):
            insisting.check_schema(COLUMNS)
        with pytest.raises(ConfigurationError, match="local_infile=1"):
            prepare(insisting, new_query_id(), rows_for(0, 1, 5))
    finally:
        mariadb.root_sql("SET GLOBAL local_infile = 1")
    assert db.ids(table) == ids_of(rows_for(0, 0, 25)) and db.xa_recover() == []


def test_branch_still_attached_to_its_writer_is_retryable(sink: MySQLXASink, db: Db) -> None:
    """MariaDB cannot resolve a prepared branch from elsewhere while its session lives."""
    txn_id = TxnId.open(namespace=NAMESPACE, query_id=new_query_id(), epoch=1, batch=0,
                        partition=0, attempt=0)
    handle = sink.handle(txn_id, rows=1)
    xid = f"'tph.{txn_id.global_part}','{txn_id.branch_part}'"
    writer = db.server.connect()  # a writer that did not close its connection after PREPARE
    with writer.cursor() as cursor:
        for statement in (f"XA START {xid}", "INSERT INTO _twophase_xa_markers VALUES "
                          f"('{txn_id}', 'orders', 't', 1, NOW(), NOW(), NULL)",
                          f"XA END {xid}", f"XA PREPARE {xid}"):
            cursor.execute(statement)
    with pytest.raises(RetryableError, match="still attached"):
        sink.commit(handle)
    writer.close()
    assert sink.commit(handle) is CommitOutcome.COMMITTED
    assert db.marker(handle) is not None


def test_configuration_and_repr(mariadb: MariaDBServer) -> None:
    params = mariadb.params
    sink = make_sink(params, "My Orders.2024`table")
    assert params.password not in repr(sink) and "password='***'" in repr(sink)
    assert sink.default_namespace() == "My_Orders_2024_table"
    assert make_sink(params, "x" * 40).default_namespace() == "x" * 24
    with pytest.raises(ConfigurationError, match="LOAD DATA cannot update"):
        make_sink(params, "t", mode="upsert", bulk="load_data")
    with pytest.raises(ConfigurationError, match="connect_args"):
        make_sink(params, "t", connect_args={"autocommit": False})
    with pytest.raises(ConfigurationError, match="chunk_size=0"):
        make_sink(params, "t", chunk_size=0)
    with pytest.raises(TypeError, match="batch_size"):  # renamed: a batch is a micro-batch
        make_sink(params, "t", batch_size=10)
    assert "CREATE TABLE IF NOT EXISTS" in MARKER_TABLE_DDL
    shipped = pickle.loads(pickle.dumps(sink))  # what Spark does to send it to executors
    assert repr(shipped) == repr(sink) and shipped.server == sink.server


def test_non_strict_server_still_refuses_truncation(mariadb: MariaDBServer, db: Db,
                                                    table: str) -> None:
    """The sink's sessions are strict even if the server's sql_mode is not."""
    mariadb.root_sql("SET GLOBAL sql_mode = ''")
    try:
        loose = make_sink(mariadb.params, table, bulk="insert")
        with pytest.raises(SchemaMismatchError, match="1406"):
            prepare(loose, new_query_id(), [(1, "x" * 40, 1.0)])
    finally:
        mariadb.root_sql("SET GLOBAL sql_mode = DEFAULT")
    assert db.ids(table) == [] and db.xa_recover() == []


# -- fencing -----------------------------------------------------------------------------------

def test_fencing_stops_a_zombie_run(mariadb: MariaDBServer, db: Db, table: str) -> None:
    """Fencing goes through committers: the epoch a committer claimed guards its commits."""
    query = new_query_id()
    zombie_sink = make_sink(mariadb.params, table, fencing=True)
    zombie_sink.check_schema(COLUMNS)
    newer_sink = make_sink(mariadb.params, table, fencing=True)
    with zombie_sink.committer() as zombie, newer_sink.committer() as newer:
        zombie.fence(NAMESPACE, query, 1)
        handle = prepare(zombie_sink, query, rows_for(0, 0, 10))

        newer.fence(NAMESPACE, query, 2)
        with pytest.raises(FencedError, match=r"epoch 1 .* is at epoch 2"):
            zombie.commit(handle)
        with pytest.raises(FencedError):
            zombie.abort(handle)
        with pytest.raises(FencedError):
            zombie.fence(NAMESPACE, query, 1)
        assert db.ids(table) == [] and len(db.xa_recover()) == 1

        assert newer.commit(handle) is CommitOutcome.COMMITTED  # the newer run finishes it
        assert db.ids(table) == ids_of(rows_for(0, 0, 10))
        newer.fence(NAMESPACE, query, 2)  # the same epoch again (cleanup joining) is fine
        assert newer.commit(handle) is CommitOutcome.ALREADY_COMMITTED

    orphan = prepare(zombie_sink, query, rows_for(1, 0, 3), batch=1)
    with newer_sink.committer() as unclaimed:
        with pytest.raises(ConfigurationError, match=r"never claimed an epoch"):
            unclaimed.commit(orphan)  # committing needs a claimed epoch
        assert unclaimed.abort(orphan) is AbortOutcome.ABORTED  # cleanup may abort orphans
    assert db.ids(table) == ids_of(rows_for(0, 0, 10))


def test_a_fence_claim_lives_in_its_committer_only(mariadb: MariaDBServer, db: Db,
                                                   table: str) -> None:
    """sink.fence claims the epoch on the server but keeps nothing: the pickled sink holds no
    per-process state, so sink.commit (a short-lived committer) is refused with fencing on."""
    query = new_query_id()
    sink = make_sink(mariadb.params, table, fencing=True)
    sink.check_schema(COLUMNS)
    sink.fence(NAMESPACE, query, 3)
    assert db.query("SELECT epoch FROM _twophase_xa_fence WHERE query = %s",
                    (query_key(query),)) == [(3,)]
    handle = prepare(sink, query, rows_for(0, 0, 2), epoch=3)
    with pytest.raises(ConfigurationError, match=r"never claimed.*Fix: commit through "
                                                 r"sink.committer\(\) after committer.fence"):
        sink.commit(handle)
    shipped = pickle.dumps(sink)
    with sink.committer() as committer:
        with pytest.raises(FencedError):
            committer.fence(NAMESPACE, query, 2)
        committer.fence(NAMESPACE, query, 3)
        assert committer.commit(handle) is CommitOutcome.COMMITTED
    assert pickle.dumps(sink) == shipped  # the claim lived in the committer only
    assert db.ids(table) == ids_of(rows_for(0, 0, 2))


def test_fence_waits_for_a_commit_past_its_check(mariadb: MariaDBServer, db: Db,
                                                 table: str) -> None:
    """A zombie between its fence check and XA COMMIT holds the row: the takeover waits."""
    query = new_query_id()
    old = make_sink(mariadb.params, table, fencing=True)
    old.check_schema(COLUMNS)
    old.fence(NAMESPACE, query, 1)
    holder = mariadb.connect(autocommit=False)  # what _fenced holds during XA COMMIT
    with holder.cursor() as cursor:
        cursor.execute("SELECT epoch FROM _twophase_xa_fence WHERE namespace = %s "
                       "AND query = %s LOCK IN SHARE MODE", (NAMESPACE, query_key(query)))
    newer = make_sink(mariadb.params, table, fencing=True, lock_wait_timeout_s=1)
    with pytest.raises(RetryableError, match="1205"):
        newer.fence(NAMESPACE, query, 2)

    release = threading.Timer(0.5, holder.commit)
    release.start()
    patient = make_sink(mariadb.params, table, fencing=True, lock_wait_timeout_s=10)
    patient.fence(NAMESPACE, query, 2)  # returns once the "commit" released the row
    release.join()
    holder.close()
    assert db.query("SELECT epoch FROM _twophase_xa_fence WHERE query = %s",
                    (query_key(query),)) == [(2,)]


# -- the committer -----------------------------------------------------------------------------

@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every connection the sink opens from now on, in order."""
    connections: list[Any] = []
    connect = Server.connect

    def counted(server: Server, **options: Any) -> Any:
        connections.append(connect(server, **options))
        return connections[-1]

    monkeypatch.setattr(Server, "connect", counted)
    return connections


def test_a_committer_reuses_its_connections_across_handles_and_threads(
        sink: MySQLXASink, db: Db, table: str, opened: list[Any]) -> None:
    parts = [rows_for(0, p, 4) for p in range(12)]
    handles = [prepare(sink, new_query_id(), rows, partition=p) for p, rows in enumerate(parts)]
    opened.clear()
    with sink.committer() as committer, ThreadPoolExecutor(max_workers=3) as threads:
        assert list(threads.map(committer.commit, handles)) == [CommitOutcome.COMMITTED] * 12
        assert list(threads.map(committer.commit, handles)) == [
            CommitOutcome.ALREADY_COMMITTED] * 12
        assert 1 <= len(opened) <= 3 and all(conn.open for conn in opened)  # one per thread
    assert not any(conn.open for conn in opened)  # close() closed them
    assert db.ids(table) == ids_of(*parts) and db.xa_recover() == []


def test_a_committer_replaces_a_connection_the_server_ended(
        sink: MySQLXASink, db: Db, opened: list[Any]) -> None:
    query = new_query_id()
    first, second = (prepare(sink, query, rows_for(0, p, 3), partition=p) for p in range(2))
    opened.clear()
    with sink.committer() as committer:
        assert committer.commit(first) is CommitOutcome.COMMITTED
        [pooled] = opened
        db.query(f"KILL CONNECTION {pooled.thread_id()}")
        with pytest.raises(RetryableError):  # the statement died with the connection
            committer.commit(second)
        assert committer.commit(second) is CommitOutcome.COMMITTED  # the retry: a new one
    assert len(opened) == 2 and not opened[1].open


# -- errors without an error code --------------------------------------------------------------

@pytest.mark.parametrize(("error", "kind"), [
    (pymysql.err.InterfaceError(0, ""), RetryableError),
    (pymysql.err.InternalError("Packet sequence number wrong - got 5 expected 1"), FatalError),
    (pymysql.err.OperationalError("received unknown auth switch request"), FatalError),
    (pymysql.err.ProgrammingError("Cursor closed"), FatalError),
    (pymysql.err.Error("Already closed"), FatalError),
], ids=["closed", "out-of-sync", "auth-packet", "cursor-closed", "already-closed"])
def test_an_error_without_a_code_is_classified_by_its_type(error: Exception,
                                                           kind: type[Exception]) -> None:
    classified = classify(error, "commit of x on MySQL server db:3306")
    assert type(classified) is kind
    message = str(classified)
    assert "commit of x on MySQL server db:3306" in message and "[0]" not in message
    if kind is RetryableError:
        assert "never sent" in message
    else:
        assert "without an error code" in message and "not retried" in message


@pytest.mark.parametrize("step", ["write", "pre_commit"])
def test_a_writer_connection_closed_before_prepare_is_retryable(sink: MySQLXASink, db: Db,
                                                                table: str, step: str) -> None:
    """PyMySQL raises InterfaceError(0, '') on a closed connection: nothing was sent, and the
    server rolled the unprepared branch back with its session, so the task may run again."""
    txn_id = TxnId.open(namespace=NAMESPACE, query_id=new_query_id(), epoch=1, batch=0,
                        partition=0, attempt=0)
    txn = sink.begin_transaction(TransactionContext(txn_id, COLUMNS))
    sink.write(txn, rows_for(0, 0, 5))
    assert txn.conn is not None
    txn.conn.close()
    with pytest.raises(RetryableError) as closed:
        if step == "write":
            sink.write(txn, rows_for(0, 1, 5))
        else:
            sink.pre_commit(txn)
    assert "never sent" in str(closed.value) and "never committed" in str(closed.value)
    assert txn.conn is None and db.ids(table) == [] and db.xa_recover() == []


def test_a_commit_error_without_a_code_is_not_retried_blindly(
        sink: MySQLXASink, db: Db, table: str, monkeypatch: pytest.MonkeyPatch) -> None:
    handle = prepare(sink, new_query_id(), rows_for(0, 0, 3))
    attempts: list[str] = []

    def failing(error: Exception) -> Any:
        def resolve(conn: Any, verb: str, xid: Any, *, where: str) -> bool:
            attempts.append(verb)
            if len(attempts) == 1:
                raise error
            return xa.resolve(conn, verb, xid, where=where)
        return resolve

    monkeypatch.setattr("sinks.mysql.committer.resolve", failing(
        pymysql.err.InternalError("Packet sequence number wrong - got 7 expected 1")))
    with sink.committer() as committer, pytest.raises(FatalError) as fatal:
        FAST_RETRY.call(lambda: committer.commit(handle), what="commit")
    assert attempts == ["COMMIT"] and "without an error code" in str(fatal.value)
    assert len(db.xa_recover()) == 1  # still prepared: recovery decides, not a blind retry

    attempts.clear()
    monkeypatch.setattr("sinks.mysql.committer.resolve",
                        failing(pymysql.err.InterfaceError(0, "")))
    with sink.committer() as committer:
        outcome = FAST_RETRY.call(lambda: committer.commit(handle), what="commit")
    assert outcome is CommitOutcome.COMMITTED and attempts == ["COMMIT", "COMMIT"]
    assert db.ids(table) == ids_of(rows_for(0, 0, 3))


# -- child processes ---------------------------------------------------------------------------

def _child_sink(spec: dict[str, Any]) -> MySQLXASink:
    return MySQLXASink(host=spec["host"], port=spec["port"], user=spec["user"],
                       password=os.environ[PASSWORD_ENV], database=spec["database"],
                       table=spec["table"])


def _writer(spec: dict[str, Any]) -> None:
    """Prepare partitions, print their handles, then die like a killed executor, in the middle
    of writing one more partition (whose branch the server must roll back)."""
    sink = _child_sink(spec)
    for partition in range(spec["partitions"]):
        handle = prepare(sink, spec["query"], rows_for(0, partition, spec["rows"]),
                         partition=partition)
        print(handle.dumps(), flush=True)
    unfinished = TxnId.open(namespace=NAMESPACE, query_id=spec["query"], epoch=1, batch=0,
                            partition=spec["partitions"], attempt=0)
    txn = sink.begin_transaction(TransactionContext(unfinished, COLUMNS))
    sink.write(txn, rows_for(0, spec["partitions"], spec["rows"]))
    os.kill(os.getpid(), signal.SIGKILL)


def _driver(spec: dict[str, Any]) -> None:
    """Run 1 of a query: batch 0 done, batch 1 decided, then the armed crash point kills it."""
    sink, query = _child_sink(spec), spec["query"]
    store = StateStore(spec["state"])
    epoch = store.start_run(NAMESPACE, {}).epoch
    coordinator = Coordinator(sink, store, namespace=NAMESPACE, epoch=epoch, retry=FAST_RETRY)

    def batch(number: int, *, attempt: int = 0) -> list[Handle]:
        return [prepare(sink, query, rows_for(number, p, 30), batch=number, partition=p,
                        attempt=attempt, epoch=epoch) for p in range(2)]

    coordinator.commit_batch(0, query, batch(0))
    prepare(sink, query, [(-1, "failed attempt", 0.0)], batch=1, partition=0, attempt=9,
            epoch=epoch)  # an orphan: run 1's sweep aborts it before deciding batch 1
    prepare(sink, query, [(-2, "next batch", 0.0)], batch=2, partition=0, attempt=0,
            epoch=epoch)  # a branch of batch 2 that run 1 never decides
    coordinator.commit_batch(1, query, batch(1))
    raise SystemExit("the crash point did not fire")


def _child_main(argv: list[str]) -> None:
    spec = json.loads(argv[0])
    {"writer": _writer, "driver": _driver}[spec["role"]](spec)


if __name__ == "__main__":
    _child_main(sys.argv[1:])
