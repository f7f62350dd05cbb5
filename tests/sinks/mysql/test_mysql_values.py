"""MySQLXASink against a real, private MariaDB: what rows become in the table, on both write
paths (rows, Arrow record batches) and both bulk statements (LOAD DATA, INSERT): values and
their encodings, time zones, rows and schemas the table refuses.

Every assertion about data is made on MariaDB's own view (SELECT), and every test ends with no
prepared XA branch left on the server (checked by the ``db`` fixture). XA outcomes, recovery
and fencing: tests/sinks/mysql/test_mysql_sink.py.
"""

from __future__ import annotations

import datetime as dt
import decimal
import threading
import time
import zoneinfo
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pytest

from setups.servers.mariadb import Db, MariaDBServer
from sinks.mysql import MySQLXASink
from sinks.mysql.arrow import CHUNKS_AHEAD, ArrowChunk, chunks_ahead, encode_batch
from sinks.mysql.encoding import encode_tsv
from sinks.mysql.sink import MySQLBranch
from tests.sinks.mysql.mysql_table import (
    COLUMNS,
    checked_sink,  # noqa: F401 - the sink fixture
    fresh_table,  # noqa: F401 - the table fixture
    ids_of,
    make_sink,
    new_query_id,
    prepare,
    rows_for,
)
from twophase import Column, CommitOutcome, ConfigurationError, SchemaMismatchError
from twophase.kit import batch_chunks
from twophase.testing.arrow import record_batches
from twophase.testing.contract import commit, context, purge_commit_records

PATHS = ("rows", "arrow")


def batch_of(rows: Sequence[Sequence[Any]], schema: pa.Schema) -> pa.RecordBatch:
    """``rows`` as one record batch of ``schema``: one that :mod:`twophase.testing.arrow` does
    not build from Spark's column types (nested types, a zone other than UTC)."""
    return pa.RecordBatch.from_pylist([dict(zip(schema.names, row, strict=True))
                                       for row in rows], schema=schema)


def deliver(sink: MySQLXASink, txn: MySQLBranch, rows: Sequence[Sequence[Any]],
            path: str) -> None:
    """``write`` the rows, or ``write_arrow`` them as record batches of two rows for
    ``path="arrow"``."""
    if path == "rows":
        sink.write(txn, rows)
    else:
        sink.write_arrow(txn, record_batches(rows, COLUMNS, rows_per_batch=2))


# -- outcomes ----------------------------------------------------------------------------------

def test_upsert_updates_rows_by_key(mariadb: MariaDBServer, db: Db, table: str) -> None:
    db.query(f"INSERT INTO `{table}` VALUES (1, 'old', 1.0), (2, 'keep', 2.0)")
    upsert = make_sink(mariadb.params, table, mode="upsert")
    upsert.check_schema(COLUMNS)

    handle = prepare(upsert, new_query_id(), [(1, "new", 10.0), (3, "added", 3.0)])
    assert db.query(f"SELECT name FROM `{table}` WHERE id = 1") == [("old",)]
    assert commit(upsert, handle) is CommitOutcome.COMMITTED

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

    handle = prepare(writer, new_query_id(), AWKWARD_ROWS, columns=AWKWARD_COLUMNS,
                     arrow=path == "arrow")
    assert commit(writer, handle) is CommitOutcome.COMMITTED

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
    batches = record_batches(rows, columns, rows_per_batch=3)
    arrow_text = b"".join(encode_batch(batch).to_pybytes() for batch in batches)
    assert arrow_text == encode_tsv(rows, [c.name for c in columns])
    assert arrow_text.count(b"\n") == len(rows)  # every newline in a value is escaped
    assert b"\\r \\0" in arrow_text and b"\\N\t\\N" in arrow_text


def test_arrow_chunks_slice_batches_to_chunk_size() -> None:
    batch = record_batches(rows_for(0, 0, 5), COLUMNS, rows_per_batch=5)[0]
    chunks = list(batch_chunks([batch, batch.slice(0, 0), batch.slice(0, 2)], 3))
    assert [[piece.num_rows for piece in chunk] for chunk in chunks] == [[3], [2, 1], [1]]
    assert [row for chunk in chunks for row in ArrowChunk(chunk).rows()] == [
        *rows_for(0, 0, 5), *rows_for(0, 0, 2)]


def test_chunks_ahead_encodes_ahead_and_reads_nothing_once_closed() -> None:
    """The helper thread reads and encodes at most CHUNKS_AHEAD chunks ahead of the loader;
    once the generator is closed it has ended, and the batches are read no further."""
    batch = record_batches(rows_for(0, 0, 2), COLUMNS, rows_per_batch=2)[0]
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
    batch = record_batches(rows_for(0, 0, 2), COLUMNS, rows_per_batch=2)[0]

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
    handle = prepare(sink, new_query_id(), rows, batches=[batch_of(rows, nested)])
    assert commit(sink, handle) is CommitOutcome.COMMITTED
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

    return [batch_of([row], schema(None if row[1] is None or row[1].tzinfo is None
                                   else CLIENT_TZ)) for row in rows]


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

    assert commit(writer, prepare(writer, new_query_id(), rows, columns=TZ_COLUMNS,
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
    commit(sink, handle)
    after = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    [(created, prepared, committed)] = db.query(
        "SELECT created_at, prepared_at, committed_at FROM _twophase_xa_markers "
        "WHERE txn_id = %s", (str(handle.txn_id),))
    assert created == dt.datetime.fromtimestamp(handle.txn_id.created, dt.UTC).replace(
        tzinfo=None)  # the id's opening time (fixed per test process by contract.context)
    slack = dt.timedelta(seconds=5)
    assert created <= prepared and before - slack <= prepared <= committed <= after + slack

    hour = dt.timedelta(hours=1)
    assert purge_commit_records(sink, namespace, before - hour) == 0  # naive: UTC, not New York
    assert purge_commit_records(sink, namespace, (after - hour).replace(tzinfo=dt.UTC)
                                .astimezone(TOKYO)) == 0
    assert db.marker(handle) is not None
    assert purge_commit_records(sink, namespace, after + hour) == 1
    assert db.marker(handle) is None


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
    txn = writer.begin_transaction(context(query_id=new_query_id(), columns=COLUMNS))
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
                batches=[batch_of(rows, nested)] if path == "arrow" else None)
    assert db.xa_recover() == []


def test_check_schema_names_missing_column_and_table(mariadb: MariaDBServer, db: Db,
                                                     table: str) -> None:
    writer = make_sink(mariadb.params, table)
    with pytest.raises(SchemaMismatchError) as missing_column:
        writer.check_schema([*COLUMNS, Column("colour", "string")])
    assert "'colour'" in str(missing_column.value) and "ADD COLUMN" in str(missing_column.value)

    with pytest.raises(SchemaMismatchError,
                       match=r"no_such_table' doesn't exist.*Fix: create the table"):
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


def test_server_refusing_local_loads(mariadb: MariaDBServer, db: Db, table: str) -> None:
    """bulk='auto' falls back to INSERT (MySQL 8's default); bulk='load_data' says what to do."""
    mariadb.root_sql("SET GLOBAL local_infile = 0")
    try:
        auto = make_sink(mariadb.params, table)
        auto.check_schema(COLUMNS)
        assert commit(auto, prepare(auto, new_query_id(), rows_for(0, 0, 25))) is (
            CommitOutcome.COMMITTED)
        insisting = make_sink(mariadb.params, table, bulk="load_data")
        with pytest.raises(ConfigurationError, match="local_infile=1"):
            insisting.check_schema(COLUMNS)
        with pytest.raises(ConfigurationError, match="local_infile=1"):
            prepare(insisting, new_query_id(), rows_for(0, 1, 5))
    finally:
        mariadb.root_sql("SET GLOBAL local_infile = 1")
    assert db.ids(table) == ids_of(rows_for(0, 0, 25)) and db.xa_recover() == []


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

