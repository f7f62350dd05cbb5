"""DeltaSink in the keyed mode: the lake's keyed suite (:mod:`tests.sinks.lake_keyed`), judged
by DuckDB's Delta reader, and what only Delta needs: its options, and deltalake's own reader
(the log, as Spark reads it) agreeing with DuckDB."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from setups.delta import DeltaSetup, delta_scan, intents_left
from sinks.delta import DeltaSink
from sinks.delta.keyed import TOMBSTONES_PATH
from tests.sinks.lake_keyed import LakeKeyedSuite, LakeKeyedTarget, checked
from twophase import ConfigurationError
from twophase.testing.keyed import State, change


class DeltaKeyedTarget(LakeKeyedTarget):
    """A fresh Delta table created from the keyed columns, read by DuckDB."""

    apply_function = "sinks.delta.committer.merge_batch"

    def __init__(self, delta_setup: DeltaSetup) -> None:
        self.setup = delta_setup
        self.uri = str(delta_setup.target_options()["table_uri"])

    def sink(self, **options: Any) -> DeltaSink:
        chosen = {"mode": "keyed", "key": ("order_id",), "version": "version",
                  "deleted": "op", "create": True, **options}
        return DeltaSink(self.uri, **chosen)

    def state(self) -> State:
        return {order_id: (status, version) for order_id, status, version in self.setup.query(
            f"SELECT order_id, status, version FROM {delta_scan(self.uri)}")}

    def keys_read(self) -> list[int]:
        return [int(row[0]) for row in self.setup.query(
            f"SELECT order_id FROM {delta_scan(self.uri)}")]

    def tombstones(self) -> dict[int, int]:
        rows = DeltaTable(f"{self.uri}/{TOMBSTONES_PATH}").to_pyarrow_table(
            columns=["order_id", "version"]).to_pylist()
        return {row["order_id"]: row["version"] for row in rows}

    def left_behind(self) -> set[str]:
        return intents_left(Path(self.uri))

    def commits(self) -> int:
        return int(DeltaTable(self.uri).version())

    def append_other(self, keys: tuple[int, ...], version: int) -> None:
        write_deltalake(self.uri, pa.table({
            "order_id": pa.array(keys, pa.int64()), "status": ["other"] * len(keys),
            "version": pa.array([version] * len(keys), pa.int64())}), mode="append")

    def created(self) -> bool:
        return (Path(self.uri) / "_delta_log").is_dir()

    def maintain(self) -> None:
        table = DeltaTable(self.uri)
        table.optimize.compact()
        table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)


class TestDeltaKeyed(LakeKeyedSuite):
    @pytest.fixture
    def keyed_target(self, delta_setup: DeltaSetup) -> DeltaKeyedTarget:
        return DeltaKeyedTarget(delta_setup)


def test_keyed_refuses_an_explicit_app_id_and_an_unknown_mode(delta_setup: DeltaSetup) -> None:
    target = DeltaKeyedTarget(delta_setup)
    with pytest.raises(ConfigurationError, match="app_id= is for mode='append'"):
        target.sink(app_id="mine")
    with pytest.raises(ConfigurationError, match="is not one of"):
        DeltaSink(target.uri, mode="merge")
    with pytest.raises(ConfigurationError, match="belongs to mode='keyed'"):
        DeltaSink(target.uri, key=("order_id",))


def test_a_deleted_key_is_absent_to_deltalakes_reader_too(delta_setup: DeltaSetup) -> None:
    target = DeltaKeyedTarget(delta_setup)
    sink = checked(target)
    LakeKeyedSuite().apply(sink, [change(1, 1, "placed"), change(2, 1, "placed")])
    LakeKeyedSuite().apply(sink, [change(1, 2, op="d")], batch=1)
    rows = DeltaTable(target.uri).to_pyarrow_table().to_pylist()
    assert [(row["order_id"], row["status"]) for row in rows] == [(2, "placed")]
