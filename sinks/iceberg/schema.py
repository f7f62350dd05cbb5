"""The table's schema against the query's columns, the table settings the sink refuses, and the
:class:`Layout` (schema, partition spec, location, properties) the writers and the committer use.

Spark's ``Column.type`` (``DataType.simpleString()``) maps to Iceberg's primitive types by
:data:`SPARK_TO_ICEBERG` (``decimal(p,s)`` to ``decimal(p, s)``); a nested column is refused
(primitive columns only). A written column must exist with its Iceberg type, or one Iceberg
promotes to it (``int`` into ``long``, ``float`` into ``double``); a required table column
must be among the rows'.

Refused at the start, by name (the sink appends Parquet data files, one fast-append snapshot
per batch, and its own files must live under the table's location):

==================================  ==========================================================
table setting                       why
==================================  ==========================================================
``format-version`` other than 1, 2  format 3 asks writers for row lineage (first row ids) the
                                    sink does not assign
``write.format.default`` not        the sink writes Parquet only
``parquet``
``write.data.path``,                data files outside ``<location>/data``: the sink's storage
``write.object-storage.enabled``,   (intents, conditional creates) is rooted at the location
``write.location-provider.impl``
a sort order                        the sink's files are not sorted
a partition field whose source is   its value cannot be named in the handle's JSON (decimal,
not of :data:`PARTITION_SOURCES`    binary, uuid)
==================================  ==========================================================
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from pyiceberg.catalog import Catalog
from pyiceberg.io.pyarrow import schema_to_pyarrow
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    TimestamptzType,
)

from sinks.iceberg.errors import SYSTEM
from sinks.iceberg.layout import Layout
from twophase import Column, ConfigurationError, SchemaMismatchError
from twophase.kit import TableColumn
from twophase.kit import check_columns as kit_check_columns

#: Spark's simple type names and the Iceberg type of each.
SPARK_TO_ICEBERG: Mapping[str, IcebergType] = {
    "boolean": BooleanType(), "tinyint": IntegerType(), "smallint": IntegerType(),
    "int": IntegerType(), "bigint": LongType(), "float": FloatType(), "double": DoubleType(),
    "string": StringType(), "binary": BinaryType(), "date": DateType(),
    "timestamp": TimestamptzType(), "timestamp_ntz": TimestampType()}
DECIMAL = re.compile(r"decimal\((\d+),\s*(\d+)\)")
#: What a written type may land in besides itself (Iceberg's own type promotions).
PROMOTIONS: Mapping[IcebergType, frozenset[IcebergType]] = {
    IntegerType(): frozenset({LongType()}), FloatType(): frozenset({DoubleType()})}
#: Partition source types whose partition values are plain JSON (ints, strings, booleans).
PARTITION_SOURCES = (BooleanType, IntegerType, LongType, StringType, DateType, TimestampType,
                     TimestamptzType)
SUPPORTED_FORMAT_VERSIONS = (1, 2)
FILE_FORMAT_PROPERTY = "write.format.default"
#: Table properties that move data files away from ``<location>/data``.
REFUSED_LOCATION_PROPERTIES = ("write.data.path", "write.object-storage.path",
                               "write.location-provider.impl")
OBJECT_STORAGE_PROPERTY = "write.object-storage.enabled"
COMPRESSION_PROPERTY = "write.parquet.compression-codec"
#: Iceberg's default Parquet codec (``write.parquet.compression-codec``).
DEFAULT_COMPRESSION = "zstd"


def layout_of(table: Table) -> Layout:
    """What the executors need of ``table`` (:mod:`~sinks.iceberg.layout`)."""
    metadata = table.metadata
    spec = metadata.spec()
    return Layout(
        location=metadata.location.rstrip("/"), arrow_schema=schema_to_pyarrow(table.schema()),
        compression=str(metadata.properties.get(COMPRESSION_PROPERTY,
                                                DEFAULT_COMPRESSION)).lower(),
        spec_id=spec.spec_id, schema_json=table.schema().model_dump_json(),
        spec_json=None if spec.is_unpartitioned() else spec.model_dump_json())


def iceberg_type_of(column: Column) -> IcebergType:
    """The Iceberg type of a Spark column, else SchemaMismatchError."""
    spark = column.type.lower()
    if spark in SPARK_TO_ICEBERG:
        return SPARK_TO_ICEBERG[spark]
    if match := DECIMAL.fullmatch(spark):
        return DecimalType(int(match.group(1)), int(match.group(2)))
    raise SchemaMismatchError(
        f"{SYSTEM}: column {column.name!r} is of type {column.type}, which this sink does not "
        "write (primitive types only).",
        fix=f"cast it in the query (to_json({column.name}) for a nested value)")


def check_columns(schema: Schema, columns: Sequence[Column], where: str) -> None:
    """The kit's column checks (every written column exists, every required one is written),
    then each written column's type: its own, or one Iceberg promotes to it."""
    fields = {field.name: field for field in schema.fields}
    kit_check_columns(where, [TableColumn(field.name, required=field.required)
                              for field in schema.fields], columns)
    for column in columns:
        wanted, actual = iceberg_type_of(column), fields[column.name].field_type
        if wanted != actual and actual not in PROMOTIONS.get(wanted, frozenset()):
            raise SchemaMismatchError(
                f"{where}: column {column.name!r} is {actual} in the table, but the rows hold "
                f"{column.type} ({wanted}).",
                fix=f"cast {column.name!r} in the query to the table's type ({actual}), or "
                "change the table's column")


def check_partition_by(table: Table, partition_by: Sequence[str], where: str) -> None:
    """``partition_by=`` (if given) is the identity of the table's own partition columns."""
    spec, schema = table.spec(), table.schema()
    if partition_by and tuple(partition_by) != tuple(
            schema.find_column_name(field.source_id) for field in spec.fields):
        raise ConfigurationError(
            f"{where} is partitioned by {spec}, not by the identity of {list(partition_by)}.",
            fix="drop partition_by= (the table's own spec is used) or fix it")


def check_settings(metadata: TableMetadata, where: str) -> None:
    """Refuse a table whose settings ask for what the sink cannot honour (module docstring)."""
    properties = metadata.properties
    refused: list[str] = []
    if metadata.format_version not in SUPPORTED_FORMAT_VERSIONS:
        refused.append(f"format-version {metadata.format_version}")
    file_format = str(properties.get(FILE_FORMAT_PROPERTY, "parquet")).lower()
    if file_format != "parquet":
        refused.append(f"{FILE_FORMAT_PROPERTY}={file_format}")
    refused += [f"{name}={properties[name]}" for name in REFUSED_LOCATION_PROPERTIES
                if name in properties]
    if str(properties.get(OBJECT_STORAGE_PROPERTY, "false")).lower() == "true":
        refused.append(f"{OBJECT_STORAGE_PROPERTY}=true")
    sort_order = metadata.sort_order_by_id(metadata.default_sort_order_id)
    if sort_order is not None and not sort_order.is_unsorted:
        refused.append("a sort order")
    refused += [f"a partition field on {metadata.schema().find_column_name(field.source_id)} "
                f"({metadata.schema().find_field(field.source_id).field_type})"
                for field in metadata.spec().fields
                if not isinstance(metadata.schema().find_field(field.source_id).field_type,
                                  PARTITION_SOURCES)]
    if refused:
        raise ConfigurationError(
            f"{where} uses {', '.join(refused)}, which IcebergSink cannot honour when it "
            "appends Parquet files under the table's location.",
            fix=f"write to a table without {refused[0]} (a new table, or alter it)")


def create_table(catalog: Catalog, identifier: str, columns: Sequence[Column], *,
                 partition_by: Sequence[str], properties: Mapping[str, str]) -> Table:
    """A new table of the query's columns (its namespace created if missing), partitioned by
    the identity of ``partition_by``; never over an existing table."""
    names = [column.name for column in columns]
    if unknown := [name for name in partition_by if name not in names]:
        raise ConfigurationError(f"{SYSTEM}: partition_by names {unknown}, which the rows lack.",
                                 fix="partition by columns of the DataFrame")
    fields = [NestedField(index, column.name, iceberg_type_of(column), required=False)
              for index, column in enumerate(columns, start=1)]
    schema = Schema(*fields)
    spec = PartitionSpec(*(
        PartitionField(source_id=names.index(name) + 1, field_id=1000 + position,
                       transform=IdentityTransform(), name=name)
        for position, name in enumerate(partition_by)))
    namespace = identifier.rsplit(".", 1)[0] if "." in identifier else None
    if namespace:
        catalog.create_namespace_if_not_exists(namespace)
    return catalog.create_table(identifier, schema, partition_spec=spec,
                                properties=dict(properties))
