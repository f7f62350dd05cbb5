"""What an executor needs of the table, read once on the driver and pickled with the sink, in
plain values: the executors never import pyiceberg for an unpartitioned table (its import
costs a Python worker over a second of CPU: measured, ``docs/PERFORMANCE.md``).

A partitioned table's spec and schema travel as their JSON; a writer of such a table imports
pyiceberg's partition transforms (``_determine_partitions``, the function pyiceberg's own
writer splits rows by) to name each row's partition.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from pyiceberg.partitioning import PartitionSpec
    from pyiceberg.schema import Schema

#: A partition record's values (Iceberg's internal representation: ints, strings, booleans).
PartitionKey = tuple[Any, ...]


@dataclass(frozen=True)
class Layout:
    """The table's location, its columns as Arrow with their field ids, its Parquet codec,
    its partition spec's id, and (partitioned only) the spec and schema as JSON."""

    location: str
    arrow_schema: pa.Schema
    compression: str
    spec_id: int
    schema_json: str
    spec_json: str | None

    @property
    def partitioned(self) -> bool:
        return self.spec_json is not None

    @cached_property
    def _spec(self) -> tuple[PartitionSpec, Schema]:
        from pyiceberg.partitioning import PartitionSpec  # noqa: PLC0415 - partitioned only
        from pyiceberg.schema import Schema  # noqa: PLC0415 - partitioned only

        assert self.spec_json is not None
        return (PartitionSpec.model_validate_json(self.spec_json),
                Schema.model_validate_json(self.schema_json))

    def partitions(self, table: pa.Table) -> Iterator[tuple[PartitionKey, pa.Table]]:
        """The rows of each partition record of the table's spec."""
        if self.spec_json is None:
            yield (), table
            return
        from pyiceberg.io.pyarrow import _determine_partitions  # noqa: PLC0415

        spec, schema = self._spec
        for partition in _determine_partitions(spec, schema, table):
            record = partition.partition_key.partition
            yield (tuple(record[index] for index in range(len(record))),
                   partition.arrow_table_partition)

    def partition_path(self, key: PartitionKey) -> str:
        """The partition's directories (``name=value/...``), as the spec names them."""
        if self.spec_json is None:
            return ""
        from pyiceberg.typedef import Record  # noqa: PLC0415 - partitioned only

        spec, schema = self._spec
        return spec.partition_to_path(Record(*key), schema)
