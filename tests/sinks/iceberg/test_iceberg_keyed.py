"""IcebergSink in the keyed mode: the lake's keyed suite (:mod:`tests.sinks.lake_keyed`),
judged by DuckDB's Iceberg reader, and what only Iceberg needs: its options, and pyiceberg's
own reader agreeing with DuckDB."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest

from setups.iceberg import IcebergSetup, iceberg_scan
from sinks.iceberg import IcebergSink
from sinks.iceberg.keyed import IcebergTombstones
from tests.sinks.lake_keyed import LakeKeyedSuite, LakeKeyedTarget, checked
from twophase import ConfigurationError
from twophase.kit import Keyed
from twophase.kit.lake import INTENTS_DIRECTORY
from twophase.testing.keyed import State, change


class IcebergKeyedTarget(LakeKeyedTarget):
    """A fresh Iceberg table created from the keyed columns, read by DuckDB."""

    apply_function = "sinks.iceberg.keyed.apply_batch"

    def __init__(self, iceberg_setup: IcebergSetup) -> None:
        self.setup = iceberg_setup
        self.options = iceberg_setup.target_options()

    def sink(self, **options: Any) -> IcebergSink:
        chosen = {"mode": "keyed", "key": ("order_id",), "version": "version",
                  "deleted": "op", **options}
        return IcebergSink(**{**self.options, **chosen})

    @property
    def identifier(self) -> str:
        return str(self.options["table"])

    def state(self) -> State:
        table = self.setup.catalog().load_table(self.identifier)
        if table.current_snapshot() is None:
            return {}
        return {order_id: (status, version) for order_id, status, version in self.setup.query(
            f"SELECT order_id, status, version FROM {iceberg_scan(table)}")}

    def keys_read(self) -> list[int]:
        table = self.setup.catalog().load_table(self.identifier)
        return [int(row[0]) for row in self.setup.query(
            f"SELECT order_id FROM {iceberg_scan(table)}")]

    def tombstones(self) -> dict[int, int]:
        identifier = IcebergTombstones(self.setup.catalog(), self.identifier,
                                       Keyed(("order_id",), "version")).identifier
        rows = self.setup.catalog().load_table(identifier).scan().to_arrow().to_pylist()
        return {row["order_id"]: row["version"] for row in rows}

    def left_behind(self) -> set[str]:
        if not self.created():
            return set()
        table = self.setup.catalog().load_table(self.identifier)
        return {uri for uri in self.setup.files_under(table.location())
                if f"/{INTENTS_DIRECTORY}/" in uri}

    def commits(self) -> int:
        return len(self.setup.catalog().load_table(self.identifier).metadata.metadata_log)

    def append_other(self, keys: tuple[int, ...], version: int) -> None:
        table = self.setup.catalog().load_table(self.identifier)
        rows = pa.table({
            "order_id": pa.array(keys, pa.int64()), "status": ["other"] * len(keys),
            "version": pa.array([version] * len(keys), pa.int64())})
        table.append(rows.cast(table.schema().as_arrow()))

    def created(self) -> bool:
        return bool(self.setup.catalog().table_exists(self.identifier))

    def maintain(self) -> None:
        table = self.setup.catalog().load_table(self.identifier)
        table.maintenance.expire_snapshots().older_than(datetime.now(UTC)).commit()


class TestIcebergKeyed(LakeKeyedSuite):
    @pytest.fixture
    def keyed_target(self, iceberg_setup: IcebergSetup) -> IcebergKeyedTarget:
        return IcebergKeyedTarget(iceberg_setup)


def test_keyed_refuses_an_unknown_mode(iceberg_setup: IcebergSetup) -> None:
    target = IcebergKeyedTarget(iceberg_setup)
    with pytest.raises(ConfigurationError, match="is not one of"):
        IcebergSink(**{**target.options, "mode": "merge"})
    with pytest.raises(ConfigurationError, match="belongs to mode='keyed'"):
        IcebergSink(**{**target.options, "key": ("order_id",)})


def test_a_deleted_key_is_absent_to_pyicebergs_reader_too(iceberg_setup: IcebergSetup) -> None:
    target = IcebergKeyedTarget(iceberg_setup)
    sink = checked(target)
    LakeKeyedSuite().apply(sink, [change(1, 1, "placed"), change(2, 1, "placed")])
    LakeKeyedSuite().apply(sink, [change(1, 2, op="d")], batch=1)
    rows = iceberg_setup.catalog().load_table(target.identifier).scan().to_arrow().to_pylist()
    assert [(row["order_id"], row["status"]) for row in rows] == [(2, "placed")]
