"""Debezium's change events as keyed rows: :func:`debezium_changes`.

A database table mirrored through Debezium -> Kafka -> Spark's Kafka source -> twophase: the
Kafka source gives one row per record (``key``, ``value``, ``topic``, ``partition``,
``offset``, ...), :func:`debezium_changes` turns the records' Debezium JSON into the table's
rows, a version and a delete marker, in Spark SQL alone (no Python per row), and a table sink
in ``mode="keyed"`` (:mod:`twophase._keyed`) keeps the newest state of each key exactly once.

The recipe
==========

1. The Debezium connector (Kafka Connect), besides its database settings::

       key.converter=org.apache.kafka.connect.json.JsonConverter
       value.converter=org.apache.kafka.connect.json.JsonConverter
       key.converter.schemas.enable=false     # or true: both shapes are read, even mixed
       value.converter.schemas.enable=false   # or true
       decimal.handling.mode=string           # exact; or double. Not precise (base64 bytes)
       time.precision.mode=isostring          # or any below: pass the same value here
       tombstones.on.delete=true              # the default; false works as well
       skipped.operations=t                   # the default: truncates are refused (see ops)

   and the topic keyed by the table's primary key (Debezium's default), its partition count
   never changed (see the versions). MySQL needs ``binlog_row_image=FULL`` (Debezium's own
   requirement); PostgreSQL sends unchanged TOASTed values as a placeholder
   (``__debezium_unavailable_value``) unless the table has ``REPLICA IDENTITY FULL``.

2. Spark reads the table's topic and writes the changes into a keyed sink::

       from twophase.debezium import debezium_changes
       from twophase.spark import write_stream
       from sinks.sqlite import SQLiteSink

       records = (spark.readStream.format("kafka")
                  .option("kafka.bootstrap.servers", "broker:9092")
                  .option("subscribe", "shop.public.customers")
                  .option("startingOffsets", "earliest")
                  .load())
       changes = debezium_changes(
           records, "id BIGINT, name STRING, balance DECIMAL(12,2), born DATE, seen TIMESTAMP",
           key=["id"], version="lsn", time_precision_mode="isostring")
       query = write_stream(
           changes,
           SQLiteSink("mirror.db", "customers", mode="keyed", key=("id",),
                      version="version", deleted="deleted"),
           checkpoint_location="/data/checkpoints/customers")

What each record becomes
========================

=============================  ===============================================================
record                         what happens
=============================  ===============================================================
``op`` ``c`` (create)          an upsert of ``after``
``op`` ``u`` (update)          an upsert of ``after`` (``before`` is not read)
``op`` ``r`` (snapshot read)   an upsert of ``after`` (``source.snapshot`` is not read); with
                               ``lsn``/``binlog`` versioned one below its source position
                               (see the versions)
``op`` ``d`` (delete)          a delete: the key columns from ``before``, the other columns
                               null, ``deleted`` true
tombstone (a null ``value``)   ``version="offset"``: a delete of the record key's key columns
                               at the tombstone's offset (a no-op after the delete event just
                               before it, and the delete itself when log compaction has
                               already removed that event). ``lsn``/``binlog``: dropped (it
                               has no source position; the delete event before it deleted)
``op`` ``t`` (truncate)        **refused**: the query fails, naming the record. A truncate
                               names no key, and dropping it would leave the mirror with
                               rows its source no longer has. Debezium sends none unless
                               ``skipped.operations`` leaves ``t`` out; to pass one, truncate
                               the target by hand and filter that record out of ``records``
                               (by its ``topic``, ``partition`` and ``offset``)
anything else                  **refused**: not JSON, a value whose fields do not fit
                               ``schema`` (a precise decimal's base64, a wrong type), no
                               ``op`` (a message without a payload: a heartbeat or schema
                               change topic subscribed by mistake), another ``op``, a create
                               without ``after``, a delete without ``before``, a null key
=============================  ===============================================================

A refusal is ``raise_error`` in Spark SQL: the task fails with ``debezium_changes: <what> at
topic <t>, partition <p>, offset <o>. Fix: <what to do>`` (coordinates, never the record's
contents), and the batch with it; nothing of it is committed.

The versions
============

``version=`` names where each change's version comes from (``version_column``, a BIGINT). A
change applies only if its version is newer than what the target holds for its key, so the
version must increase per key in the order the database made the changes:

==========  ===================================================================================
version     what it is, and what it assumes
==========  ===================================================================================
``offset``  the Kafka record's ``offset`` (any connector). Increases per key as long as every
            change of a key goes to one partition: the topic keyed by the primary key
            (Debezium's default; not ``message.key.columns`` other than ``key=``) and its
            partition count never changed (a new count sends a key elsewhere, where offsets
            are unrelated). A change Debezium re-delivers after a connector restart (at least
            once) gets a new, larger offset and applies again: the table can show an older
            state for a moment, until the re-delivered changes after it apply too
``lsn``     ``source.lsn`` of the PostgreSQL connector: the change's position in the WAL.
            Per key it increases in commit order (a row's next writer waits for the previous
            one's commit), and a change Debezium delivers again is a no-op
``binlog``  the MySQL (or MariaDB) connector's binlog position as one BIGINT:
            ``file_number << 32 | (source.pos + source.row)``. The file's number comes from
            ``source.file`` (``mysql-bin.000003`` -> 3), at most 31 bits (MySQL's own limit:
            2^31 - 1); ``source.pos`` is the row event's position in its file and
            ``source.row`` the row's index in that event (rows of one event share its
            position). Every row takes at least one byte of its event, so ``pos + row`` stays
            below the next event's position, which is at most 2^32 - 1: the sum orders rows
            as the binlog does, in 32 bits. A value beyond these widths fails the query
            (``raise_error``). Assumes one server's binlog (after a failover to another server
            or ``RESET MASTER`` positions start over: write into a new target, or use
            ``offset``). *(inference, from Debezium's code)* With
            ``binlog_transaction_compression=ON`` the rows of a compressed transaction share
            its position, so two changes of one key in one compressed transaction tie: use
            ``offset`` then
==========  ===================================================================================

Snapshot reads (``r``) name the position where streaming starts after them, and the first
change streamed there can carry that very position (measured with PostgreSQL: an update right
after the snapshot had the LSN of the snapshot's rows). A snapshot holds the state *before*
its position, so with ``lsn`` and ``binlog`` its rows get the position minus one, and that
change wins. *(inference, from how logical decoding exports its snapshot)* One case remains
with ``lsn``: a transaction already writing when a PostgreSQL snapshot begins and committing
after it streams changes with LSNs below the snapshot's, which lose against its rows. Take a
snapshot while no transaction writing the table is open, or use ``offset``.

A record without its version (``lsn`` of a MySQL event, a file name without a number) is
refused with a fix, never passed on as null.

Types
=====

``schema`` is the table's row: the after-image's columns and their Spark types. JSON numbers
and strings are read into them as Spark's JSON reader does, strictly (a value that does not
fit is refused, not nulled); ``CHAR(n)``/``VARCHAR(n)`` are read as ``STRING``. Decimals:
``decimal.handling.mode=string`` into ``DECIMAL(p,s)`` is exact; ``double`` is read into
``DECIMAL`` (digits beyond its scale rounded half up) or ``DOUBLE``. Dates and timestamps are
converted from what Debezium sends:

========================  ===================================================================
column type               what is read
========================  ===================================================================
``DATE``                  days since 1970-01-01 (every mode but ``isostring``), or an ISO
                          date (``2024-01-05Z``, ``isostring``)
``TIMESTAMP``             an ISO instant: ``ZonedTimestamp`` (PostgreSQL ``timestamptz``,
                          MySQL ``TIMESTAMP``; every mode) and ``isostring`` timestamps; or
                          a number since the epoch in the unit ``time_precision_mode`` says
``TIMESTAMP_NTZ``         the same, as the wall clock in UTC (Debezium encodes a zone-less
                          ``timestamp``/``DATETIME`` as if it were UTC)
========================  ===================================================================

``time_precision_mode`` is the connector's ``time.precision.mode``: ``connect`` (numbers are
milliseconds), ``microseconds``, ``nanoseconds`` (truncated to Spark's microseconds) or
``isostring`` (strings; Debezium 3.1+). With ``adaptive`` (PostgreSQL's default) or
``adaptive_time_microseconds`` (MySQL's default) a zone-less timestamp's unit depends on the
column's precision (milliseconds up to 3 digits, microseconds up to 6), which a Spark type
cannot say: a number for a ``TIMESTAMP``/``TIMESTAMP_NTZ`` column is then refused; declare
such a column ``BIGINT`` (the wire value) or change the connector's mode. Dates and
timestamps inside a struct, array or map, and ``TIME`` columns, are not converted: declare
their wire types (``INT``, ``BIGINT``, ``STRING``).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from typing import Final, Literal, get_args

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F  # noqa: N812 - Spark's own spelling
from pyspark.sql.types import (
    ArrayType,
    CharType,
    DataType,
    DateType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
    VarcharType,
)

from twophase.errors import ConfigurationError

Version = Literal["lsn", "binlog", "offset"]
TimePrecisionMode = Literal["adaptive", "adaptive_time_microseconds", "connect", "microseconds",
                            "nanoseconds", "isostring"]

#: The places a version can come from (``version=``).
VERSIONS: Final[tuple[str, ...]] = get_args(Version)
#: The connector's ``time.precision.mode`` values read (``time_precision_mode=``).
TIME_PRECISION_MODES: Final[tuple[str, ...]] = get_args(TimePrecisionMode)
#: The ops that upsert their ``after``; :data:`DELETE_OP` deletes; :data:`TRUNCATE_OP` is refused.
UPSERT_OPS: Final = ("c", "u", "r")
SNAPSHOT_OP: Final = "r"
DELETE_OP: Final = "d"
TRUNCATE_OP: Final = "t"
#: ``version="binlog"``: bits of ``pos + row`` (the low part) and of the file's number.
BINLOG_POSITION_BITS: Final = 32
BINLOG_FILE_BITS: Final = 31
#: The Kafka source's columns this reads.
RECORD_COLUMNS: Final = ("key", "value", "topic", "partition", "offset")
#: Microseconds per unit of a number for a timestamp column, by ``time.precision.mode``
#: (nanoseconds: a negative divisor); absent: numbers are refused.
_MICROS_PER_UNIT: Final[dict[str, int]] = {"connect": 1000, "microseconds": 1, "nanoseconds": -1000}
_TEMPORAL: Final = (DateType, TimestampType, TimestampNTZType)
_CORRUPT: Final = "_twophase_corrupt_record"
_PARSED: Final = "_twophase_event"
_RECORD_KEY: Final = "_twophase_record_key"
_TOMBSTONE: Final = "_twophase_tombstone"
_COORDINATES: Final = ("topic", "partition", "offset")
#: The envelope's parts read, and their columns once either shape is unwrapped.
_ENVELOPE: Final = {part: f"_twophase_{part}" for part in ("op", "before", "after", "source")}
_WHO: Final = "debezium_changes"


def debezium_changes(
    records: DataFrame,
    schema: StructType | str,
    *,
    key: Sequence[str],
    version: Version = "offset",
    version_column: str = "version",
    deleted_column: str = "deleted",
    time_precision_mode: TimePrecisionMode = "adaptive",
) -> DataFrame:
    """The table's changes in the Kafka source's ``records`` of Debezium JSON change events:
    ``schema``'s columns, ``version_column`` (BIGINT) and ``deleted_column`` (BOOLEAN), ready
    for a keyed sink (``mode="keyed", key=key, version=version_column,
    deleted=deleted_column``). See the module's tables for what each record becomes.

    Args:
        records: the Kafka source's DataFrame (streaming or not) of ONE table's topic:
            ``key``, ``value`` (binary or string), ``topic``, ``partition``, ``offset``.
        schema: the table's row (the after-image's columns): a StructType or a DDL string
            (``"id BIGINT, name STRING"``).
        key: the key columns (the topic's record key, the target's unique key).
        version: where the version comes from: ``"offset"`` (the Kafka offset, any
            connector), ``"lsn"`` (PostgreSQL), ``"binlog"`` (MySQL, MariaDB).
        version_column: the name of the version column in the result.
        deleted_column: the name of the delete marker column in the result.
        time_precision_mode: the connector's ``time.precision.mode``: how numbers for
            TIMESTAMP and TIMESTAMP_NTZ columns are read.

    Returns:
        One row per change, in the records' order; for a delete, the key columns from
        ``before`` (a tombstone's from its record key) and the other columns null. Malformed
        or unsupported records fail the query when evaluated, naming the record.

    Raises:
        ConfigurationError: a wrong option, a ``schema`` that is not a struct, a key column
            not in it, or ``records`` without the Kafka source's columns.
    """
    row = _row_schema(schema)
    keys = _checked_options(row, key, version=version, version_column=version_column,
                            deleted_column=deleted_column, time_precision_mode=time_precision_mode)
    _check_records(records)
    wire = StructType([StructField(f.name, StringType()) if isinstance(f.dataType, _TEMPORAL)
                       else f for f in row.fields])
    event = _Event(row.fieldNames(), keys, tombstones=version == "offset")
    # one step a projection: each column is computed once and read by name after it
    parsed = records.select(
        F.col("value").isNull().alias(_TOMBSTONE), *_COORDINATES,
        F.from_json(F.col("value").cast("string"), _event_schema(wire),
                    {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT}).alias(_PARSED),
        *([_record_key(wire, keys).alias(_RECORD_KEY)] if event.tombstones else []))
    if not event.tombstones:
        parsed = parsed.where(~F.col(_TOMBSTONE))  # tombstones: see the module
    envelope = parsed.select(
        _TOMBSTONE, *_COORDINATES, *([_RECORD_KEY] if event.tombstones else []),
        F.col(_PARSED)[_CORRUPT].alias(_CORRUPT),
        *(F.coalesce(F.col(_PARSED)["payload"][part], F.col(_PARSED)[part]).alias(name)
          for part, name in _ENVELOPE.items()))
    received = envelope.select("*", *(event.raw(name).alias(event.raw_name(name))
                                      for name in row.fieldNames()))
    values = (_converted(F.col(event.raw_name(f.name)), f, time_precision_mode, event.where)
              for f in row.fields)
    return received.select(
        *(value.alias(f.name) for value, f in zip(values, row.fields, strict=True)),
        event.checked(_version(event, version)).alias(version_column),
        event.deleted.alias(deleted_column))


class _Event:
    """The columns of one record, step by step: the envelope in either shape (the payload of
    ``{"schema", "payload"}`` or the bare one), the record key, each column's value as
    received, and the checks the record must pass."""

    def __init__(self, columns: Sequence[str], keys: tuple[str, ...], *,
                 tombstones: bool) -> None:
        self.columns = tuple(columns)
        self.keys = keys
        self.tombstones = tombstones
        self.op, self.before, self.after, self.source = (F.col(name)
                                                         for name in _ENVELOPE.values())
        self.corrupt = F.col(_CORRUPT)
        self.tombstone = F.col(_TOMBSTONE)
        self.where = F.format_string(" at topic %s, partition %s, offset %s", *_COORDINATES)

    def raw_name(self, name: str) -> str:
        return f"_twophase_received_{self.columns.index(name)}"

    def raw(self, name: str) -> Column:
        """A column's value as received (a string for a date or timestamp column)."""
        if name not in self.keys:
            return F.when(self.op != DELETE_OP, self.after[name])
        value = F.when(self.op == DELETE_OP, self.before[name]).otherwise(self.after[name])
        if self.tombstones:
            value = F.when(self.tombstone, F.col(_RECORD_KEY)[name]).otherwise(value)
        return value

    @property
    def deleted(self) -> Column:
        return self.tombstone | (self.op == DELETE_OP)

    def refuse(self, cause: str, fix: str) -> Column:
        """Fail the task: ``cause`` at this record's coordinates, and the fix."""
        return F.raise_error(F.concat(F.lit(f"{_WHO}: {cause}"), self.where,
                                      F.lit(f". Fix: {fix}")))

    def checked(self, version: Column) -> Column:
        """``version``, unless the record is not a change this reads (then the task fails):
        the record's checks ride on its version, the one column a keyed sink always reads."""
        null_key = functools.reduce(operator.or_, (F.col(self.raw_name(k)).isNull()
                                                   for k in self.keys))
        names = ", ".join(self.keys)
        event = (
            F.when(self.corrupt.isNotNull(), self.refuse(
                "a record that is not a Debezium JSON change event of this schema (not JSON, "
                "or a value that does not fit its column's type)",
                "subscribe to the table's topic only, with value.converter=JsonConverter and "
                "decimal.handling.mode=string or double; declare the columns' types as the "
                "events carry them"))
            .when(self.op.isNull(), self.refuse(
                "a record without a change event (no op: a message without a payload)",
                "subscribe to the table's topic only (not the connector's schema change, "
                "heartbeat or transaction topics)"))
            .when(self.op == TRUNCATE_OP, self.refuse(
                "a truncate (op 't'), which names no key: the keyed mirror cannot apply it",
                "set skipped.operations=t on the connector (Debezium's default); to pass "
                "this one, truncate the target by hand and filter this record out of the "
                "records (by topic, partition and offset)"))
            .when(~self.op.isin(*UPSERT_OPS, DELETE_OP), self.refuse(
                "a record with an op other than c, u, r, d",
                "subscribe to the table's topic only"))
            .when((self.op == DELETE_OP) & self.before.isNull(), self.refuse(
                "a delete without its before image",
                "give the table a primary key or REPLICA IDENTITY (PostgreSQL)"))
            .when((self.op != DELETE_OP) & self.after.isNull(), self.refuse(
                "a change without its after image", "subscribe to the table's topic only"))
            .when(null_key, self.refuse(
                f"a change whose key ({names}) is null",
                "name the table's primary key in key=, as the topic's record key has it"))
            .otherwise(version))
        if not self.tombstones:
            return event
        tombstone = F.when(null_key, self.refuse(
            f"a tombstone (a null value) whose record key has no {names}",
            "key the topic by the table's primary key (Debezium's default), as key= names "
            "it, with key.converter=JsonConverter"))
        return F.when(self.tombstone, tombstone.otherwise(version)).otherwise(event)


def _version(event: _Event, version: str) -> Column:
    if version == "offset":
        return F.col("offset").cast(LongType())
    if version == "lsn":
        lsn = event.source["lsn"]
        position = F.when(lsn.isNull(), event.refuse(
            "a change without source.lsn, which version='lsn' reads (PostgreSQL's connector)",
            "pass version='binlog' for MySQL or MariaDB, or version='offset' for any "
            "connector")).otherwise(lsn)
    else:
        position = _binlog_position(event)
    # a snapshot read is the state just before the position it names, where streaming starts
    return F.when(event.op == SNAPSHOT_OP, position - 1).otherwise(position)


def _binlog_position(event: _Event) -> Column:
    """``file_number << 32 | (pos + row)``, refused beyond the widths (see the module)."""
    file_number = F.regexp_extract(event.source["file"], r"\.([0-9]{1,18})$", 1).try_cast(
        LongType())
    pos, row = event.source["pos"], F.coalesce(event.source["row"], F.lit(0))
    low_limit = 1 << BINLOG_POSITION_BITS
    return (
        F.when(file_number.isNull() | pos.isNull(), event.refuse(
            "a change without source.file (with a number after its last dot) and "
            "source.pos, which version='binlog' reads (MySQL's and MariaDB's connectors)",
            "pass version='lsn' for PostgreSQL, or version='offset' for any connector"))
        .when((file_number >= 1 << BINLOG_FILE_BITS) | (pos < 0) | (row < 0)
              | (pos >= low_limit) | (row >= low_limit) | (pos + row >= low_limit), event.refuse(
            f"a binlog position beyond version='binlog''s widths (file number < "
            f"2^{BINLOG_FILE_BITS}, pos + row < 2^{BINLOG_POSITION_BITS})",
            "use version='offset' (in a new target: the versions do not compare)"))
        .otherwise(F.shiftleft(file_number, BINLOG_POSITION_BITS) + pos + row))


def _converted(raw: Column, field: StructField, mode: str, where: Column) -> Column:
    """A column's value in its type: dates and timestamps from what Debezium sends (see the
    module), refused if a value is present but cannot be read; the rest as parsed."""
    kind = field.dataType
    if not isinstance(kind, _TEMPORAL):
        return raw
    number = raw.rlike(r"^-?[0-9]+$")
    value: Column
    if isinstance(kind, DateType):
        value = F.when(number, F.date_from_unix_date(raw.try_cast("int"))).otherwise(
            F.regexp_extract(raw, r"^([0-9]{4}-[0-9]{2}-[0-9]{2})", 1).try_cast(DateType()))
        expected = "days since 1970-01-01 or an ISO date"
    else:
        micros = _epoch_micros(raw, mode)
        if isinstance(kind, TimestampNTZType):
            from_number = F.timestamp_add("MICROSECOND", micros,
                                          F.lit("1970-01-01 00:00:00").cast(TimestampNTZType()))
            from_string = raw.try_cast(TimestampNTZType())
        else:
            zoned = raw.rlike(r"(Z|[+-][0-9]{2}:?[0-9]{2})$")
            from_number = F.timestamp_micros(micros)
            from_string = F.when(zoned, raw).otherwise(F.concat(raw, F.lit("Z"))).try_cast(
                TimestampType())
        value = F.when(number, from_number).otherwise(from_string)
        unit = _unit_name(mode)
        expected = f"an ISO timestamp{f' or {unit} since the epoch' if unit else ''}"
    fix = (f"declare {field.name!r} as the events carry it (BIGINT, STRING), or pass the "
           "connector's time.precision.mode in time_precision_mode= (connect, microseconds "
           "or isostring for timestamps)")
    refused = F.raise_error(F.concat(
        F.lit(f"{_WHO}: a value of column {field.name!r} ({kind.simpleString()}) that is not "
              f"{expected} (time_precision_mode={mode!r})"), where, F.lit(f". Fix: {fix}")))
    return F.coalesce(value, F.when(raw.isNotNull(), refused))


def _epoch_micros(raw: Column, mode: str) -> Column:
    """Microseconds since the epoch of a number in the mode's unit (null: no unit known, or
    beyond a long)."""
    per_unit = _MICROS_PER_UNIT.get(mode)
    number = raw.try_cast(LongType())
    if per_unit is None:
        return F.lit(None).cast(LongType())
    if per_unit > 0:
        return F.try_multiply(number, F.lit(per_unit))
    # floor division, exact: a long through DOUBLE would lose digits
    return F.floor(number.cast("decimal(20,0)") / F.lit(-per_unit)).cast(LongType())


def _unit_name(mode: str) -> str | None:
    return {"connect": "milliseconds", "microseconds": "microseconds",
            "nanoseconds": "nanoseconds"}.get(mode)


def _record_key(wire: StructType, keys: tuple[str, ...]) -> Column:
    """The key columns of the record key (``{"id": 1}`` or ``{"schema", "payload"}``); only
    a tombstone's is read."""
    key_row = StructType([wire[name] for name in keys])
    text = F.col("key").cast("string")
    wrapped = F.from_json(text, StructType([StructField("payload", key_row)]))["payload"]
    return F.when(F.col("value").isNull(),
                  F.coalesce(wrapped, F.from_json(text, key_row)))


def _event_schema(wire: StructType) -> StructType:
    """Both envelopes in one: the bare event's fields and ``payload`` holding the same, so one
    parse reads either shape (only one of them is present in a record)."""
    source = StructType([StructField("lsn", LongType()), StructField("file", StringType()),
                         StructField("pos", LongType()), StructField("row", LongType())])
    envelope = [StructField("before", wire), StructField("after", wire),
                StructField("op", StringType()), StructField("source", source)]
    return StructType([*envelope, StructField("payload", StructType(envelope)),
                       StructField(_CORRUPT, StringType())])


# -- the options --------------------------------------------------------------------------------

def _row_schema(schema: StructType | str) -> StructType:
    parsed: object = schema
    if isinstance(schema, str):
        try:
            parsed = DataType.fromDDL(schema)
        except Exception as exc:  # Spark's parse errors differ by client (classic, Connect)
            first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ConfigurationError(
                f"{_WHO}: schema={schema!r} is not a DDL string Spark can read ({first_line}).",
                fix="pass the table's columns, e.g. schema='id BIGINT, name STRING', or a "
                    "StructType") from exc
    if not isinstance(parsed, StructType) or not parsed.fields:
        shown = parsed.simpleString() if isinstance(parsed, DataType) else repr(parsed)
        raise ConfigurationError(
            f"{_WHO}: schema must be the table's row (a struct of its columns), not {shown}.",
            fix="pass the after-image's columns, e.g. schema='id BIGINT, name STRING', or a "
                "StructType of StructFields")
    for field in parsed.fields:
        _check_type(field.name, field.dataType, top=True)
    return StructType([StructField(f.name, _as_strings(f.dataType), f.nullable, f.metadata)
                       for f in parsed.fields])


def _as_strings(kind: DataType) -> DataType:
    """``kind`` with every CHAR(n) and VARCHAR(n) a STRING: what they are outside a table's
    schema (from_json refuses them)."""
    if isinstance(kind, CharType | VarcharType):
        return StringType()
    if isinstance(kind, StructType):
        return StructType([StructField(f.name, _as_strings(f.dataType), f.nullable, f.metadata)
                           for f in kind.fields])
    if isinstance(kind, ArrayType):
        return ArrayType(_as_strings(kind.elementType), kind.containsNull)
    if isinstance(kind, MapType):
        return MapType(_as_strings(kind.keyType), _as_strings(kind.valueType),
                       kind.valueContainsNull)
    return kind


def _check_type(name: str, kind: DataType, *, top: bool) -> None:
    """Refuse the temporal types this does not convert: nested ones, and TIME."""
    if kind.typeName() == "time" or (not top and isinstance(kind, _TEMPORAL)):
        inside = "" if top else " inside a struct, array or map"
        raise ConfigurationError(
            f"{_WHO}: column {name!r} is a {kind.simpleString()}{inside}, which is not "
            "converted from what Debezium sends.",
            fix="declare its wire type (INT days, BIGINT since the epoch or midnight, "
                "STRING for isostring) and convert it after debezium_changes")
    children: list[tuple[str, DataType]] = []
    if isinstance(kind, StructType):
        children = [(f"{name}.{f.name}", f.dataType) for f in kind.fields]
    elif isinstance(kind, ArrayType):
        children = [(f"{name}[]", kind.elementType)]
    elif isinstance(kind, MapType):
        children = [(f"{name}{{key}}", kind.keyType), (f"{name}{{value}}", kind.valueType)]
    for child, child_kind in children:
        _check_type(child, child_kind, top=False)


def _checked_options(row: StructType, key: Sequence[str], *, version: str, version_column: str,
                     deleted_column: str, time_precision_mode: str) -> tuple[str, ...]:
    columns = row.fieldNames()
    if version not in VERSIONS:
        raise ConfigurationError(
            f"{_WHO}: version={version!r} is not one of {', '.join(VERSIONS)}.",
            fix="pass version='lsn' (PostgreSQL), 'binlog' (MySQL, MariaDB) or 'offset' "
                "(the Kafka offset, any connector)")
    if time_precision_mode not in TIME_PRECISION_MODES:
        raise ConfigurationError(
            f"{_WHO}: time_precision_mode={time_precision_mode!r} is not one of "
            f"{', '.join(TIME_PRECISION_MODES)}.",
            fix="pass the connector's time.precision.mode (structured is not read: set "
                "isostring on the connector)")
    if isinstance(key, str) or not key:
        raise ConfigurationError(
            f"{_WHO}: key={key!r} must be a non-empty sequence of column names.",
            fix="pass the table's primary key columns, e.g. key=('id',)")
    if missing := [name for name in key if name not in columns]:
        raise ConfigurationError(
            f"{_WHO}: key column {', '.join(map(repr, missing))} is not in the schema "
            f"(its columns: {', '.join(columns)}).",
            fix="name the primary key's columns as the schema spells them, or add them to "
                "the schema")
    for option, name in (("version_column", version_column), ("deleted_column", deleted_column)):
        if not name or name in columns:
            why = "is a column of the table" if name else "is empty"
            raise ConfigurationError(
                f"{_WHO}: {option}={name!r} {why}.",
                fix=f"pass another name in {option}= (the result adds it to the table's columns)")
    if version_column == deleted_column:
        raise ConfigurationError(
            f"{_WHO}: version_column and deleted_column are both {version_column!r}.",
            fix="name two different columns")
    return tuple(key)


def _check_records(records: DataFrame) -> None:
    columns = records.columns
    if missing := [name for name in RECORD_COLUMNS if name not in columns]:
        raise ConfigurationError(
            f"{_WHO}: records lack the Kafka source's column "
            f"{', '.join(map(repr, missing))} (their columns: {', '.join(columns)}).",
            fix="pass the DataFrame of spark.readStream.format('kafka')...load() (or "
                "spark.read) as it is, before selecting from it")


__all__ = ["TIME_PRECISION_MODES", "VERSIONS", "TimePrecisionMode", "Version",
           "debezium_changes"]
