"""The table's schema against the query's columns, the features the sink refuses, and the
:class:`Layout` (file schema, partition columns, retention) the writers and the committer use.

Spark's ``Column.type`` (``DataType.simpleString()``) maps to Delta's primitive types by
:data:`SPARK_TO_DELTA`; a column of another type (``array<...>``, ``map<...>``, ``struct<...>``,
intervals) is refused: this milestone writes primitive columns only. A written column must
exist with exactly its Delta type (Delta has no implicit widening on write); a table column
the rows lack must be nullable.

Refused at the start, naming the feature (the sink appends plain Parquet files with an
``AddAction`` each, which cannot honour them):

==================================  ==========================================================
table property / protocol           why
==================================  ==========================================================
``delta.setTransactionRetention``   expires the app transaction ids that prove a commit: a
``Duration``                        late recommit would add a batch twice
``delta.enableDeletionVectors``,    an ``AddAction`` carries no deletion vector and no
writer feature ``deletionVectors``  ``baseRowId``
writer feature ``rowTracking``,     the same: rows written here would have no row ids
``delta.enableRowTracking``
``delta.columnMapping.mode``,       files must then carry field ids and physical names
writer feature ``columnMapping``
``delta.constraints.*``,            checked by the engine that writes; files written here
generated / identity columns,       bypass them
writer versions 3 to 6
any writer feature not in           unknown to this sink: refused rather than broken
:data:`SUPPORTED_WRITER_FEATURES`
==================================  ==========================================================
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, Field, Schema
from deltalake.schema import PrimitiveType

from sinks.delta.errors import SYSTEM
from twophase import Column, ConfigurationError, SchemaMismatchError
from twophase.kit import TableColumn
from twophase.kit import check_columns as kit_check_columns

#: Spark's simple type names and the Delta primitive type of each.
SPARK_TO_DELTA: Mapping[str, str] = {
    "boolean": "boolean", "tinyint": "byte", "smallint": "short", "int": "integer",
    "bigint": "long", "float": "float", "double": "double", "string": "string",
    "binary": "binary", "date": "date", "timestamp": "timestamp",
    "timestamp_ntz": "timestamp_ntz"}
DECIMAL = re.compile(r"decimal\(\d+,\s*\d+\)")
#: Partition columns the sink writes directories of (their values' text form is plain).
PARTITION_TYPES = frozenset({"boolean", "byte", "short", "integer", "long", "string", "date"})

RETENTION_PROPERTY = "delta.deletedFileRetentionDuration"
DEFAULT_RETENTION = "interval 7 days"
TXN_RETENTION_PROPERTY = "delta.setTransactionRetentionDuration"
#: Writer features a plain append of Parquet files honours.
SUPPORTED_WRITER_FEATURES = frozenset({
    "appendOnly", "invariants", "timestampNtz", "v2Checkpoint", "vacuumProtocolCheck",
    "domainMetadata", "inCommitTimestamp"})
#: Table properties whose "true" asks writers for what an AddAction cannot carry.
REFUSED_FLAGS = {"delta.enableDeletionVectors": "deletion vectors",
                 "delta.enableRowTracking": "row tracking"}
LEGACY_WRITER_VERSIONS = range(3, 7)
_SECONDS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 604800}
_INTERVAL = re.compile(r"^\s*interval\s+(\d+)\s+(second|minute|hour|day|week)s?\s*$",
                       re.IGNORECASE)


@dataclass(frozen=True)
class Layout:
    """What a writer needs of the table, read once on the driver (and again by a writer that
    has none): the table's Arrow schema, the Parquet schema of its files (the table's columns
    but the partition columns), and the partition columns."""

    table_schema: pa.Schema
    file_schema: pa.Schema
    partition_by: tuple[str, ...]

    @classmethod
    def of(cls, table: DeltaTable) -> Layout:
        schema = pa.schema(table.schema().to_arrow())
        partition_by = tuple(table.metadata().partition_columns)
        return cls(schema, pa.schema([field for field in schema
                                      if field.name not in partition_by]), partition_by)


def delta_type_of(column: Column) -> str:
    """The Delta primitive type of a Spark column, else SchemaMismatchError."""
    spark = column.type.lower()
    if spark in SPARK_TO_DELTA:
        return SPARK_TO_DELTA[spark]
    if DECIMAL.fullmatch(spark):
        return spark.replace(" ", "")
    raise SchemaMismatchError(
        f"{SYSTEM}: column {column.name!r} is of type {column.type}, which this sink does not "
        "write yet (primitive types only).",
        fix=f"cast it in the query (to_json({column.name}) for a nested value)")


def check_columns(table: DeltaTable, columns: Sequence[Column], where: str) -> None:
    """The kit's column checks (every written column exists, every NOT NULL one is written),
    then each written column's exact type."""
    fields = {field.name: field for field in table.schema().fields}
    kit_check_columns(where, [TableColumn(field.name, required=not field.nullable)
                              for field in table.schema().fields], columns)
    for column in columns:
        wanted, actual = delta_type_of(column), _delta_type(fields[column.name])
        if wanted != actual:
            raise SchemaMismatchError(
                f"{where}: column {column.name!r} is {actual} in the table, but the rows hold "
                f"{column.type} ({wanted}).",
                fix=f"cast {column.name!r} in the query to the table's type ({actual}), or "
                "change the table's column")


def check_partitioning(table: DeltaTable, where: str) -> None:
    """Refuse partition columns whose values the sink cannot name a directory by."""
    types = {field.name: _delta_type(field) for field in table.schema().fields}
    if unusable := [f"{name} ({types[name]})" for name in table.metadata().partition_columns
                    if types[name] not in PARTITION_TYPES]:
        raise ConfigurationError(
            f"{where} is partitioned by {', '.join(unusable)}: DeltaSink writes partitions of "
            f"{', '.join(sorted(PARTITION_TYPES))} columns only.",
            fix="write to a table partitioned by such columns (or unpartitioned)")


def check_features(table: DeltaTable, where: str) -> None:
    """Refuse a table whose protocol or properties ask for what the sink cannot honour."""
    config = table.metadata().configuration
    protocol = table.protocol()
    refused = [f"writer feature {feature!r}" for feature in protocol.writer_features or ()
               if feature not in SUPPORTED_WRITER_FEATURES]
    refused += [f"{what} ({flag}=true)" for flag, what in REFUSED_FLAGS.items()
                if str(config.get(flag, "false")).lower() == "true"]
    if config.get("delta.columnMapping.mode", "none") != "none":
        refused.append(f"column mapping (delta.columnMapping.mode="
                       f"{config['delta.columnMapping.mode']})")
    refused += [f"the CHECK constraint {key}" for key in config
                if key.startswith("delta.constraints.")]
    if protocol.writer_features is None and protocol.min_writer_version in \
            LEGACY_WRITER_VERSIONS:
        refused.append(f"writer protocol version {protocol.min_writer_version} (constraints, "
                       "generated or identity columns, column mapping)")
    if refused:
        raise ConfigurationError(f"{where} uses {', '.join(refused)}, which DeltaSink cannot "
                                 "honour when it appends files.", fix=_fix_features(refused))
    if TXN_RETENTION_PROPERTY in config:
        raise ConfigurationError(
            f"{where} sets {TXN_RETENTION_PROPERTY}={config[TXN_RETENTION_PROPERTY]}: Delta "
            "then forgets the app transaction ids that prove a batch committed, and a late "
            "recommit would add the batch twice.",
            fix=f"unset it (ALTER TABLE ... UNSET TBLPROPERTIES ('{TXN_RETENTION_PROPERTY}'))")


def _fix_features(refused: list[str]) -> str:
    return (f"write to a table without {refused[0]} (a new table, or one rewritten without "
            "it): DeltaSink appends plain Parquet files, one AddAction each")


def create_table(uri: str, columns: Sequence[Column], *, partition_by: Sequence[str],
                 storage_options: Mapping[str, str] | None,
                 configuration: Mapping[str, str] | None) -> DeltaTable:
    """A new table of the query's columns (``mode="error"``: never over an existing one)."""
    names = {column.name for column in columns}
    if unknown := [name for name in partition_by if name not in names]:
        raise ConfigurationError(f"{SYSTEM}: partition_by names {unknown}, which the rows lack.",
                                 fix="partition by columns of the DataFrame")
    for column in columns:
        if column.name in partition_by and delta_type_of(column) not in PARTITION_TYPES:
            raise ConfigurationError(
                f"{SYSTEM}: cannot partition by {column.name!r} of type {column.type}.",
                fix=f"partition by a column of type {', '.join(sorted(PARTITION_TYPES))}")
    schema = Schema([Field(column.name, PrimitiveType(delta_type_of(column)),
                           nullable=column.nullable) for column in columns])
    return DeltaTable.create(uri, schema=schema, mode="error", partition_by=list(partition_by),
                             storage_options=dict(storage_options or {}) or None,
                             configuration=dict(configuration or {}) or None)


def retention_s(configuration: Mapping[str, Any]) -> float:
    """``delta.deletedFileRetentionDuration`` in seconds (default 7 days)."""
    text = str(configuration.get(RETENTION_PROPERTY) or DEFAULT_RETENTION)
    match = _INTERVAL.match(text)
    if match is None:
        raise ConfigurationError(
            f"{SYSTEM}: cannot read {RETENTION_PROPERTY}={text!r}.",
            fix="write it as 'interval <n> <second|minute|hour|day|week>s'")
    return float(int(match.group(1)) * _SECONDS[match.group(2).lower()])


def _delta_type(field: Field) -> str:
    kind = field.type
    return str(kind.type) if isinstance(kind, PrimitiveType) else str(kind)
