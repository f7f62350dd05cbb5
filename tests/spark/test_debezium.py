"""twophase.debezium through real PySpark: Debezium 3.x change events as the Kafka source gives
them, turned into keyed rows.

The events are shaped as Debezium 3.x documents them (``documentation/.../postgresql.adoc`` and
the MySQL/MariaDB connectors' shared page): the envelope ``before``, ``after``, ``source``,
``transaction``, ``op``, ``ts_ms``/``ts_us``/``ts_ns``, with or without the JSON converter's
``{"schema", "payload"}`` wrapper, keys likewise; a delete followed by its tombstone (a null
value). The records DataFrame has the Kafka source's columns. Spark runs in the session-wide
local session (:mod:`setups.servers.spark`), whose session time zone and workers' zone are
neither UTC nor equal: the dates and timestamps asserted here do not depend on either.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections.abc import Sequence
from datetime import date, datetime, timedelta
from decimal import Decimal
from functools import reduce
from typing import Any, ClassVar, cast

import pytest
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DateType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from twophase import ConfigurationError
from twophase._keyed import Keyed
from twophase.debezium import BINLOG_POSITION_BITS, debezium_changes

pytestmark = pytest.mark.spark

DEBEZIUM_VERSION = "3.0.7.Final"
TS_MS = 1_704_449_730_123
EPOCH = date(1970, 1, 1)

# -- Debezium's events, as documented ----------------------------------------------------------

Json = dict[str, Any]


def days(day: date) -> int:
    """``io.debezium.time.Date`` / Connect's ``Date``: days since the epoch."""
    return (day - EPOCH).days


def millis(wall: datetime) -> int:
    """Connect's ``Timestamp`` of a zone-less wall clock: milliseconds, as if it were UTC."""
    return (wall - datetime(1970, 1, 1)) // timedelta(milliseconds=1)


def micros(wall: datetime) -> int:
    return (wall - datetime(1970, 1, 1)) // timedelta(microseconds=1)


def envelope(op: str, before: Json | None, after: Json | None, source: Json) -> Json:
    return {"before": before, "after": after, "source": source, "transaction": None, "op": op,
            "ts_ms": TS_MS + 41, "ts_us": (TS_MS + 41) * 1000 + 517,
            "ts_ns": (TS_MS + 41) * 1_000_000 + 517_254}


def field(kind: str, name: str, *, optional: bool = True, semantic: str | None = None) -> Json:
    described: Json = {"type": kind, "optional": optional}
    if semantic:
        described |= {"name": semantic, "version": 1}
    return described | {"field": name}


def envelope_schema(topic: str, row: list[Json], source: list[Json], connector: str) -> Json:
    """The JSON converter's ``schema`` part of a change event's value (schemas.enable=true)."""
    image = {"type": "struct", "fields": row, "optional": True, "name": f"{topic}.Value"}
    return {"type": "struct", "fields": [
        image | {"field": "before"}, image | {"field": "after"},
        {"type": "struct", "fields": source, "optional": False,
         "name": f"io.debezium.connector.{connector}.Source", "field": "source"},
        {"type": "struct", "fields": [field("string", "id", optional=False),
                                      field("int64", "total_order", optional=False),
                                      field("int64", "data_collection_order", optional=False)],
         "optional": True, "name": "event.block", "version": 1, "field": "transaction"},
        field("string", "op", optional=False), field("int64", "ts_ms"), field("int64", "ts_us"),
        field("int64", "ts_ns")],
        "optional": False, "name": f"{topic}.Envelope", "version": 2}


def key_schema(topic: str, fields: list[Json]) -> Json:
    return {"type": "struct", "fields": fields, "optional": False, "name": f"{topic}.Key"}


SOURCE_COMMON = [field("string", "version", optional=False),
                 field("string", "connector", optional=False),
                 field("string", "name", optional=False), field("int64", "ts_ms", optional=False),
                 field("int64", "ts_us"), field("int64", "ts_ns"),
                 field("string", "snapshot", semantic="io.debezium.data.Enum"),
                 field("string", "db", optional=False), field("string", "sequence")]


class Postgres:
    """``public.customers`` of database ``shop`` (topic prefix ``shop``): ``id bigint PRIMARY
    KEY, name text, balance numeric(12,2), born date, seen timestamptz, updated timestamp``;
    the connector with ``decimal.handling.mode=string``, ``time.precision.mode=connect``."""

    topic = "shop.public.customers"
    columns = ("id BIGINT, name STRING, balance DECIMAL(12,2), born DATE, seen TIMESTAMP, "
               "updated TIMESTAMP_NTZ")
    row: ClassVar[list[Json]] = [
        field("int64", "id", optional=False), field("string", "name"),
        field("string", "balance"),
        field("int32", "born", semantic="org.apache.kafka.connect.data.Date"),
        field("string", "seen", semantic="io.debezium.time.ZonedTimestamp"),
        field("int64", "updated", semantic="org.apache.kafka.connect.data.Timestamp")]
    source: ClassVar[list[Json]] = [
        *SOURCE_COMMON, field("string", "schema", optional=False),
        field("string", "table", optional=False), field("int64", "txId"),
        field("int64", "lsn"), field("int64", "xmin")]

    @classmethod
    def source_of(cls, lsn: int, snapshot: str = "false", tx: int = 555) -> Json:
        return {"version": DEBEZIUM_VERSION, "connector": "postgresql", "name": "shop",
                "ts_ms": TS_MS, "ts_us": TS_MS * 1000, "ts_ns": TS_MS * 1_000_000,
                "snapshot": snapshot, "db": "shop",
                "sequence": json.dumps([str(lsn - 88), str(lsn)]), "schema": "public",
                "table": "customers", "txId": tx, "lsn": lsn, "xmin": None}

    @classmethod
    def value(cls, op: str, before: Json | None, after: Json | None, lsn: int, *,
              wrapped: bool = False, snapshot: str = "false") -> str:
        payload = envelope(op, before, after, cls.source_of(lsn, snapshot))
        if wrapped:
            payload = {"schema": envelope_schema(cls.topic, cls.row, cls.source, "postgresql"),
                       "payload": payload}
        return json.dumps(payload)

    @classmethod
    def key(cls, id_: int, *, wrapped: bool = False) -> str:
        if wrapped:
            return json.dumps({"schema": key_schema(cls.topic, cls.row[:1]),
                               "payload": {"id": id_}})
        return json.dumps({"id": id_})


class MySQL:
    """``inventory.order_lines`` (topic prefix ``inventory``): ``order_id INT, line INT, sku
    VARCHAR(32), qty INT, price DECIMAL(10,2), placed DATETIME(6)``, PRIMARY KEY (order_id,
    line); the connector with ``decimal.handling.mode=double``,
    ``time.precision.mode=microseconds``."""

    topic = "inventory.inventory.order_lines"
    columns = ("order_id INT, line INT, sku VARCHAR(32), qty INT, price DECIMAL(10,2), "
               "placed TIMESTAMP_NTZ")
    row: ClassVar[list[Json]] = [
        field("int32", "order_id", optional=False), field("int32", "line", optional=False),
        field("string", "sku"), field("int32", "qty"), field("double", "price"),
        field("int64", "placed", semantic="io.debezium.time.MicroTimestamp")]
    source: ClassVar[list[Json]] = [
        *SOURCE_COMMON, field("string", "table"), field("int64", "server_id", optional=False),
        field("string", "gtid"), field("string", "file", optional=False),
        field("int64", "pos", optional=False), field("int32", "row", optional=False),
        field("int64", "thread"), field("string", "query")]

    @classmethod
    def value(cls, op: str, before: Json | None, after: Json | None, file: str, pos: int,
              row: int = 0, *, wrapped: bool = False, snapshot: str = "false") -> str:
        source = {"version": DEBEZIUM_VERSION, "connector": "mysql", "name": "inventory",
                  "ts_ms": TS_MS, "ts_us": TS_MS * 1000, "ts_ns": TS_MS * 1_000_000,
                  "snapshot": snapshot, "db": "inventory", "sequence": None,
                  "table": "order_lines", "server_id": 223344, "gtid": None, "file": file,
                  "pos": pos, "row": row, "thread": 7, "query": None}
        payload = envelope(op, before, after, source)
        if wrapped:
            payload = {"schema": envelope_schema(cls.topic, cls.row, cls.source, "mysql"),
                       "payload": payload}
        return json.dumps(payload)

    @classmethod
    def key(cls, order_id: int, line: int, *, wrapped: bool = False) -> str:
        if wrapped:
            return json.dumps({"schema": key_schema(cls.topic, cls.row[:2]),
                               "payload": {"order_id": order_id, "line": line}})
        return json.dumps({"order_id": order_id, "line": line})


def kafka_records(spark: SparkSession, topic: str,
                  records: Sequence[tuple[str | None, str | None]]) -> DataFrame:
    """The Kafka source's rows of ``records`` (key, value), offsets from 0 in partition 0:
    made in the JVM (no Python worker reads them), in one task."""
    def nth(values: Sequence[str | None]) -> Column:
        return F.element_at(F.array(*(F.lit(v).cast("string") for v in values)),
                            (F.col("id") + 1).cast("int")).cast("binary")

    return spark.range(len(records), numPartitions=1).select(
        nth([key for key, _ in records]).alias("key"),
        nth([value for _, value in records]).alias("value"),
        F.lit(topic).alias("topic"), F.lit(0).alias("partition"), F.col("id").alias("offset"),
        F.lit(datetime(2024, 1, 5, 10, 15, 30)).alias("timestamp"),
        F.lit(0).alias("timestampType"))


def collected(changes: DataFrame) -> list[tuple[Any, ...]]:
    """The rows, an instant (TIMESTAMP) as microseconds since the epoch: what it is, whatever
    the zone of this process, the session or the workers."""
    return [tuple(row) for row in changes.select(*(
        F.unix_micros(F.col(f.name)).alias(f.name) if isinstance(f.dataType, TimestampType)
        else F.col(f.name) for f in changes.schema.fields)).collect()]


# -- the samples --------------------------------------------------------------------------------

BORN = date(1990, 5, 15)
SEEN = "2024-01-05T10:15:30.123456Z"
SEEN_MICROS = 1_704_449_730_123_456
UPDATED = datetime(2024, 1, 5, 10, 15, 30, 123000)
ANNE = {"id": 1, "name": "Anne", "balance": "10.50", "born": days(BORN), "seen": SEEN,
        "updated": millis(UPDATED)}
BOB = {"id": 2, "name": "Bob", "balance": "-0.01", "born": None, "seen": None, "updated": None}
SNAPSHOT_LSN = 24_023_128

#: PostgreSQL: the snapshot (two rows), an update streamed at the snapshot's very LSN, an
#: insert, a delete and its tombstone, an update, the deleted key inserted again.
PG_RECORDS = [
    (Postgres.key(1), Postgres.value("r", None, ANNE, SNAPSHOT_LSN, snapshot="first")),
    (Postgres.key(2, wrapped=True),
     Postgres.value("r", None, BOB, SNAPSHOT_LSN, snapshot="last", wrapped=True)),
    (Postgres.key(1, wrapped=True),
     Postgres.value("u", {"id": 1}, ANNE | {"name": "Anne Marie"}, SNAPSHOT_LSN, wrapped=True)),
    (Postgres.key(3), Postgres.value("c", None, {"id": 3, "name": "Cy", "balance": "0.00"},
                                     24_023_200)),
    (Postgres.key(2), Postgres.value("d", {"id": 2}, None, 24_023_312)),
    (Postgres.key(2), None),
    (Postgres.key(3), Postgres.value("u", {"id": 3}, {"id": 3, "name": "Cy",
                                                     "balance": "1234567890.12"}, 24_023_400)),
    (Postgres.key(2, wrapped=True),
     Postgres.value("c", None, BOB | {"name": "Bob again"}, 24_023_500, wrapped=True)),
]
ANNE_ROW = (1, "Anne", Decimal("10.50"), BORN, SEEN_MICROS, UPDATED)
BOB_ROW = (2, "Bob", Decimal("-0.01"), None, None, None)
CY_ROW = (3, "Cy", Decimal("0.00"), None, None, None)
DELETED_2 = (2, None, None, None, None, None)
#: What each record becomes, but its version.
PG_CHANGES = [(ANNE_ROW, False), (BOB_ROW, False), ((1, "Anne Marie", *ANNE_ROW[2:]), False),
              (CY_ROW, False), (DELETED_2, True), "tombstone",
              ((3, "Cy", Decimal("1234567890.12"), None, None, None), False),
              ((2, "Bob again", *BOB_ROW[2:]), False)]


@pytest.fixture(scope="module")
def pg_records(spark: SparkSession) -> DataFrame:
    return kafka_records(spark, Postgres.topic, PG_RECORDS)


def expected_rows(changes: list[Any], versions: Sequence[int | None]) -> list[tuple[Any, ...]]:
    """``changes`` with their versions (None: the record gives no row)."""
    return [(*change[0], stamp, change[1]) for change, stamp in zip(changes, versions,
                                                                    strict=True)
            if stamp is not None]


def newest(rows: list[tuple[Any, ...]], key: tuple[str, ...],
           columns: Sequence[str]) -> dict[tuple[Any, ...], tuple[Any, ...] | None]:
    """What a keyed sink ends with: the framework's reduce of the rows (newest version per key,
    a delete as None)."""
    keyed = Keyed(key, "version", "deleted")
    return {change.key: change.row for change in keyed.reduce(rows, columns)}


# -- PostgreSQL ---------------------------------------------------------------------------------

def test_postgres_events_in_both_envelopes_become_rows_versioned_by_their_lsn(
        pg_records: DataFrame) -> None:
    changes = debezium_changes(pg_records, Postgres.columns, key=["id"], version="lsn",
                               time_precision_mode="connect")
    assert changes.columns == ["id", "name", "balance", "born", "seen", "updated", "version",
                               "deleted"]
    assert changes.schema["version"].dataType == LongType()
    rows = collected(changes)
    # the snapshot's rows one below its LSN; the tombstone dropped (the delete did it)
    assert rows == expected_rows(PG_CHANGES, [
        SNAPSHOT_LSN - 1, SNAPSHOT_LSN - 1, SNAPSHOT_LSN, 24_023_200, 24_023_312, None,
        24_023_400, 24_023_500])
    # so the update streamed at the snapshot's LSN wins, and the re-inserted key comes back
    assert newest(rows, ("id",), changes.columns) == {
        (1,): (1, "Anne Marie", *ANNE_ROW[2:], SNAPSHOT_LSN),
        (2,): (2, "Bob again", *BOB_ROW[2:], 24_023_500),
        (3,): (3, "Cy", Decimal("1234567890.12"), None, None, None, 24_023_400)}


def test_with_offset_versions_a_tombstone_deletes_the_key_of_its_record_key(
        pg_records: DataFrame) -> None:
    changes = debezium_changes(pg_records, cast(StructType, StructType.fromDDL(Postgres.columns)),
                               key=("id",),
                               version="offset", version_column="kafka_offset",
                               deleted_column="gone", time_precision_mode="connect")
    assert changes.columns[-2:] == ["kafka_offset", "gone"]
    tombstone = PG_CHANGES.index("tombstone")
    changes_with_tombstone = [(DELETED_2, True) if i == tombstone else change
                              for i, change in enumerate(PG_CHANGES)]
    assert collected(changes) == expected_rows(changes_with_tombstone, range(len(PG_RECORDS)))


# -- MySQL: binlog positions --------------------------------------------------------------------

PLACED = datetime(2024, 1, 5, 10, 15, 30, 123456)
LINE_1_1 = {"order_id": 1, "line": 1, "sku": "A-1", "qty": 2, "price": 19.99,
            "placed": micros(PLACED)}
LINE_1_2 = {"order_id": 1, "line": 2, "sku": "B-7", "qty": 1, "price": 5.0, "placed": None}
LINE_2_1 = {"order_id": 2, "line": 1, "sku": "A-1", "qty": 1, "price": 19.99, "placed": None}
LINE_2_2 = {"order_id": 2, "line": 2, "sku": "C-3", "qty": 9, "price": 0.1, "placed": None}
FILE_3, FILE_4 = "mysql-bin.000003", "mysql-bin.000004"
#: (record, file number, pos, row, snapshot?) of the MySQL events in order: the snapshot at
#: one position, one insert event of two rows, an update, a delete (and its tombstone) past
#: 1 GiB into file 3, then an update in file 4 at a small position.
MYSQL_EVENTS: list[tuple[tuple[str | None, str | None], int, int, int]] = [
    ((MySQL.key(1, 1), MySQL.value("r", None, LINE_1_1, FILE_3, 154, snapshot="first")),
     3, 154, 0),
    ((MySQL.key(1, 2, wrapped=True),
      MySQL.value("r", None, LINE_1_2, FILE_3, 154, snapshot="last", wrapped=True)), 3, 154, 0),
    ((MySQL.key(2, 1), MySQL.value("c", None, LINE_2_1, FILE_3, 484, 0)), 3, 484, 0),
    ((MySQL.key(2, 2), MySQL.value("c", None, LINE_2_2, FILE_3, 484, 1)), 3, 484, 1),
    ((MySQL.key(1, 1, wrapped=True),
      MySQL.value("u", LINE_1_1, LINE_1_1 | {"qty": 3}, FILE_3, 805, wrapped=True)), 3, 805, 0),
    ((MySQL.key(1, 2), MySQL.value("d", LINE_1_2, None, FILE_3, 1_073_742_900)),
     3, 1_073_742_900, 0),
    ((MySQL.key(1, 2), None), 0, 0, 0),
    ((MySQL.key(2, 2), MySQL.value("u", LINE_2_2, LINE_2_2 | {"qty": 8}, FILE_4, 235)),
     4, 235, 0),
]


def test_mysql_binlog_positions_order_rows_of_one_event_and_across_files(
        spark: SparkSession) -> None:
    records = kafka_records(spark, MySQL.topic, [event[0] for event in MYSQL_EVENTS])
    changes = debezium_changes(records, MySQL.columns, key=["order_id", "line"],
                               version="binlog", time_precision_mode="microseconds")
    assert changes.schema["sku"].dataType == StringType()  # VARCHAR(n) outside a table
    rows = collected(changes)
    versions = [row[-2] for row in rows]
    assert versions == [(number << BINLOG_POSITION_BITS) + pos + row - (i < 2)
                        for i, (_, number, pos, row) in enumerate(MYSQL_EVENTS) if number]
    # the binlog's order: the snapshot's rows share its position, every change after is later
    assert versions == sorted(versions) and versions[0] == versions[1]
    assert all(earlier < later for earlier, later in itertools.pairwise(versions[1:]))
    assert versions[-1] > versions[-2]  # file 4 at pos 235 is after file 3 past 1 GiB
    assert rows[0][:-2] == (1, 1, "A-1", 2, Decimal("19.99"), PLACED)
    assert rows[5][:-2] == (1, 2, None, None, None, None) and rows[5][-1] is True
    assert newest(rows, ("order_id", "line"), changes.columns) == {
        (1, 1): (1, 1, "A-1", 3, Decimal("19.99"), PLACED, versions[4]),
        (1, 2): None,
        (2, 1): (2, 1, "A-1", 1, Decimal("19.99"), None, versions[2]),
        (2, 2): (2, 2, "C-3", 8, Decimal("0.10"), None, versions[6])}


# -- dates and timestamps -----------------------------------------------------------------------

TEMPORAL_COLUMNS = "id INT, d DATE, ts TIMESTAMP, ntz TIMESTAMP_NTZ"
WALL = datetime(2024, 1, 5, 10, 15, 30, 123456)
#: Per time.precision.mode: what Debezium sends for a DATE, an instant and a zone-less
#: timestamp (as many rows as values to try), and what each row becomes.
TEMPORAL: dict[str, list[tuple[Json, tuple[Any, ...]]]] = {
    "connect": [({"d": days(WALL.date()), "ts": SEEN, "ntz": millis(WALL)},
                 (WALL.date(), SEEN_MICROS, WALL.replace(microsecond=123000))),
                ({"d": -1, "ts": "2024-01-05T12:15:30.123456+02:00", "ntz": -1},
                 (date(1969, 12, 31), SEEN_MICROS, datetime(1969, 12, 31, 23, 59, 59, 999000)))],
    "microseconds": [({"d": days(WALL.date()), "ts": micros(WALL), "ntz": micros(WALL)},
                      (WALL.date(), SEEN_MICROS, WALL))],
    "nanoseconds": [({"d": None, "ts": micros(WALL) * 1000 + 789, "ntz": -1},
                     (None, SEEN_MICROS, datetime(1969, 12, 31, 23, 59, 59, 999999)))],
    "isostring": [({"d": "2024-01-05Z", "ts": "2024-01-05T10:15:30.123456Z",
                    "ntz": "2024-01-05T10:15:30.123456Z"},
                   (WALL.date(), SEEN_MICROS, WALL))],
    "adaptive": [({"d": days(WALL.date()), "ts": SEEN, "ntz": None},
                  (WALL.date(), SEEN_MICROS, None))],
}


def test_dates_and_timestamps_are_read_in_each_time_precision_mode(spark: SparkSession) -> None:
    modes = [(mode, values, result) for mode, samples in TEMPORAL.items()
             for values, result in samples]
    records = reduce(DataFrame.unionByName, [
        kafka_records(spark, mode, [(json.dumps({"id": i}), Postgres.value(
            "c", None, {"id": i} | values, 100 + i))]).withColumn("offset", F.lit(i))
        for i, (mode, values, _) in enumerate(modes)])
    changes = reduce(DataFrame.unionByName, [
        debezium_changes(records.where(F.col("topic") == mode), TEMPORAL_COLUMNS, key=["id"],
                         version="lsn", time_precision_mode=mode)  # type: ignore[arg-type]
        for mode in TEMPORAL])
    assert sorted(row[:4] for row in collected(changes)) == [
        (i, *result) for i, (_, _, result) in enumerate(modes)]


# -- refusals -----------------------------------------------------------------------------------

def pg_change(**after: Any) -> str:
    return Postgres.value("u", {"id": 1}, {"id": 1} | after, 24_023_600)


ORDER_LINES = {"schema": MySQL.columns, "key": ["order_id", "line"]}
#: A record, the options, and what the query's failure says.
REFUSED: dict[str, tuple[str | None, dict[str, Any], str]] = {
    "truncate": (json.dumps({"schema": {"type": "struct"}, "payload": envelope(
        "t", None, None, Postgres.source_of(24_023_700))}), {},
        r"a truncate \(op 't'\).* at topic shop\.public\.customers, partition 0, offset 0\. "
        r"Fix: set skipped\.operations=t"),
    "not json": ("Struct{id=1}", {}, r"not a Debezium JSON change event.*offset 0"),
    "precise decimal": (pg_change(balance="BBk="), {},
                        r"does not fit its column's type.*decimal\.handling\.mode=string"),
    "no payload": (json.dumps({"schema": {"type": "struct"}, "payload": None}), {},
                   r"without a change event \(no op"),
    "another op": (json.dumps(envelope("m", None, None, Postgres.source_of(1))), {},
                   r"an op other than c, u, r, d"),
    "lsn of mysql": (MySQL.value("c", None, LINE_2_1, FILE_3, 484),
                     {"version": "lsn", **ORDER_LINES},
                     r"without source\.lsn.*Fix: pass version='binlog'"),
    "binlog of postgres": (pg_change(), {"version": "binlog"},
                           r"without source\.file.*Fix: pass version='lsn'"),
    "binlog file number": (MySQL.value("c", None, LINE_2_1, "mysql-bin.2147483648", 4),
                           {"version": "binlog", **ORDER_LINES},
                           r"beyond version='binlog''s widths"),
    "binlog pos + row": (MySQL.value("c", None, LINE_2_1, FILE_3, 2**32 - 2, 2),
                         {"version": "binlog", **ORDER_LINES}, r"pos \+ row < 2\^32"),
    "adaptive timestamp": (pg_change(updated=millis(UPDATED)), {},
                           r"column 'updated' \(timestamp_ntz\) that is not an ISO timestamp "
                           r"\(time_precision_mode='adaptive'\).*offset 0"),
    "null key": (Postgres.value("c", None, {"name": "nobody"}, 1), {},
                 r"a change whose key \(id\) is null"),
    "tombstone without key": (None, {"version": "offset"},
                              r"a tombstone \(a null value\) whose record key has no id"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_records_that_are_no_change_of_the_table_fail_the_query_naming_the_record(
        spark: SparkSession, case: str) -> None:
    value, options, message = REFUSED[case]
    key = None if case == "tombstone without key" else Postgres.key(1)
    records = kafka_records(spark, Postgres.topic, [(key, value)])
    customers = {"schema": "id INT, name STRING, balance DECIMAL(12,2), updated TIMESTAMP_NTZ",
                 "key": ["id"]}
    changes = debezium_changes(records, **(customers | options))
    with pytest.raises(Exception, match=message) as failure:
        changes.collect()
    assert "USER_RAISED_EXCEPTION" in str(failure.value) or "raise_error" in str(failure.value)


def test_tombstones_are_dropped_when_the_version_comes_from_the_source(
        spark: SparkSession) -> None:
    records = kafka_records(spark, Postgres.topic, [(Postgres.key(1), None), (None, None)])
    assert debezium_changes(records, "id INT", key=["id"], version="lsn").collect() == []


# -- options ------------------------------------------------------------------------------------

NESTED_DATE = StructType([StructField("id", LongType()), StructField(
    "address", StructType([StructField("since", DateType())]))])
#: Options, and what the ConfigurationError says (its cause and its fix).
MISCONFIGURED: dict[str, tuple[dict[str, Any], str]] = {
    "version": ({"version": "scn"}, r"version='scn' is not one of lsn, binlog, offset.*"
                                    r"Fix: pass version='lsn' \(PostgreSQL\)"),
    "key not in schema": ({"key": ["id", "tenant"]}, r"key column 'tenant' is not in the "
                                                     r"schema \(its columns: id, name\)"),
    "key as a string": ({"key": "id"}, r"non-empty sequence.*Fix: .*key=\('id',\)"),
    "no key": ({"key": []}, r"non-empty sequence"),
    "not a struct": ({"schema": "array<int>"}, r"not array<int>.*Fix: pass the after-image"),
    "unreadable DDL": ({"schema": "id BIGINT,, name"}, r"not a DDL string Spark can read"),
    "nested date": ({"schema": NESTED_DATE, "key": ["id"]},
                    r"'address\.since' is a date inside a struct.*Fix: declare its wire type"),
    "version column in the table": ({"version_column": "name"},
                                    r"version_column='name' is a column of the table"),
    "one name for both": ({"version_column": "v", "deleted_column": "v"},
                          r"both 'v'.*Fix: name two different columns"),
    "time precision mode": ({"time_precision_mode": "structured"},
                            r"'structured' is not one of.*Fix: pass the connector's"),
}


@pytest.mark.parametrize("case", MISCONFIGURED)
def test_wrong_options_are_refused_before_anything_runs_with_a_fix(
        pg_records: DataFrame, case: str) -> None:
    options, message = MISCONFIGURED[case]
    arguments = {"schema": "id BIGINT, name STRING", "key": ["id"]} | options
    with pytest.raises(ConfigurationError, match=message) as refused:
        debezium_changes(pg_records, **arguments)
    assert refused.value.fix


def test_records_without_the_kafka_sources_columns_are_refused(pg_records: DataFrame) -> None:
    with pytest.raises(ConfigurationError, match=r"lack the Kafka source's column 'offset'"):
        debezium_changes(pg_records.drop("offset"), "id BIGINT", key=["id"])


# -- columnar -----------------------------------------------------------------------------------

def plan_of(changes: DataFrame, capsys: pytest.CaptureFixture[str]) -> str:
    changes.explain(mode="extended")
    return capsys.readouterr().out


def test_nothing_is_evaluated_in_python_per_row(
        spark: SparkSession, capsys: pytest.CaptureFixture[str]) -> None:
    """Records made in the JVM (no Python scan either): the plans have no Python at all."""
    records = kafka_records(spark, Postgres.topic, PG_RECORDS)
    for version in ("lsn", "binlog", "offset"):
        plan = plan_of(debezium_changes(records, Postgres.columns, key=["id"],
                                        version=version), capsys)
        assert "== Physical Plan ==" in plan and "from_json" in plan
        assert [python for python in ("EvalPython", "PythonUDF", "ExistingRDD", "Python")
                if python in plan] == []


def test_the_root_package_does_not_import_pyspark() -> None:
    check = ("import sys, twophase, twophase.kit, twophase.errors\n"
             "print('pyspark' in sys.modules, 'twophase.debezium' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                            check=True)
    assert result.stdout.split() == ["False", "False"]
