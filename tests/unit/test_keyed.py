"""The keyed mode's one meaning (twophase._keyed), without a server: the reduce per key in
rows and in Arrow agree, the options are checked, tombstone tables are named within limits."""

from __future__ import annotations

import random
import re
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.user_sink import JsonLinesSink
from twophase import ConfigurationError, SchemaMismatchError
from twophase.group import SinkGroup
from twophase.kit import Change, Keyed, is_delete, newer_than, validate_keyed, validate_mode
from twophase.kit.sql import tombstone_table_name

COLUMNS = ("id", "status", "v", "op")
KEYED = Keyed(("id",), "v", "op")

changes = st.lists(st.tuples(st.integers(0, 5), st.text(max_size=3), st.integers(0, 20),
                             st.sampled_from(["c", "u", "d", "r", None])), max_size=60)


def expected(rows: list[tuple[Any, ...]]) -> dict[int, tuple[Any, ...]]:
    """The newest change per key; of one version the first (written the long way)."""
    newest: dict[int, tuple[Any, ...]] = {}
    for row in rows:
        if row[0] not in newest or row[2] > newest[row[0]][2]:
            newest[row[0]] = row
    return newest


@settings(max_examples=200, deadline=None)
@given(changes)
def test_the_reduce_keeps_the_newest_change_per_key_in_rows_and_in_arrow(
        rows: list[tuple[Any, ...]]) -> None:
    newest = expected(rows)
    reduced = KEYED.reduce(rows, COLUMNS)
    assert {c.key[0]: c for c in reduced} == {
        key: Change((key,), row[2], None if row[3] == "d" else row[:3])
        for key, row in newest.items()}
    table = pa.Table.from_pylist([dict(zip(COLUMNS, row, strict=True)) for row in rows],
                                 schema=pa.schema([("id", pa.int64()), ("status", pa.string()),
                                                   ("v", pa.int64()), ("op", pa.string())]))
    assert sorted(KEYED.reduce_arrow(table).to_pylist(), key=lambda r: r["id"]) == [
        dict(zip(COLUMNS, newest[key], strict=True)) for key in sorted(newest)]


def test_only_newer_changes_pass_the_current_versions() -> None:
    changes = [Change((1,), 5, (1, "a", 5)), Change((2,), 5, None), Change((3,), 1, (3, "c", 1))]
    assert newer_than(changes, {(1,): 5, (2,): 4}) == changes[1:]


def test_a_null_key_or_version_is_refused_with_its_fix() -> None:
    with pytest.raises(SchemaMismatchError, match=r"null key or version.*Fix: filter the rows"):
        KEYED.reduce([(1, "a", None, "u")], COLUMNS)
    table = pa.table({"id": [1, None], "status": ["a", "b"], "v": [1, 2], "op": ["u", "u"]})
    with pytest.raises(SchemaMismatchError, match="null key or version"):
        KEYED.reduce_arrow(table)


def test_deletes_are_marked_by_true_or_debeziums_d_only() -> None:
    assert [is_delete(mark) for mark in (True, "d", False, None, "u", "c", "r", 1, "D")] == [
        True, True, False, False, False, False, False, False, False]


def test_the_options_are_checked() -> None:
    assert validate_mode("S", "keyed", ("id",)) == "keyed"
    with pytest.raises(ConfigurationError, match="mode='keyed' needs the key columns"):
        validate_mode("S", "keyed", (), key_required=False)
    with pytest.raises(ConfigurationError, match=r"unknown mode.*'keyed'"):
        validate_mode("S", "latest")
    with pytest.raises(ConfigurationError, match="belong to mode='keyed'"):
        validate_keyed("S", "insert", (), None, "op")
    with pytest.raises(ConfigurationError, match="must be positive"):
        validate_keyed("S", "keyed", ("id",), "v", None, tombstone_retention_s=0)
    assert validate_keyed("S", "upsert", ("id",), None, None) is None


def test_tombstone_tables_are_named_within_the_systems_limit() -> None:
    assert tombstone_table_name("orders") == "_twophase_tombstones_orders"
    long = tombstone_table_name("o" * 60, 64)
    assert len(long) == 64 and long != tombstone_table_name("o" * 59 + "p", 64)


class RoutedSink(JsonLinesSink):
    def __init__(self, key: tuple[str, ...] | None) -> None:
        super().__init__("unused")
        self.key = key

    def route_key(self) -> tuple[str, ...] | None:
        return self.key


def test_a_group_routes_by_the_key_columns_its_keyed_members_share() -> None:
    group = SinkGroup({"a": RoutedSink(("tenant", "id")), "b": RoutedSink(("id",)),
                       "c": RoutedSink(None)})
    assert group.route_key() == ("id",)
    assert SinkGroup({"c": RoutedSink(None)}).route_key() is None
    with pytest.raises(ConfigurationError, match="share no column"):
        SinkGroup({"a": RoutedSink(("tenant",)), "b": RoutedSink(("id",))}).route_key()


def test_the_reduce_keeps_stream_order_of_first_appearance() -> None:
    rows = [(k, "s", v, "u") for k, v in random.Random(1).sample(
        [(k, v) for k in range(5) for v in range(3)], 15)]
    first_seen = list(dict.fromkeys(row[0] for row in rows))
    assert [c.key[0] for c in KEYED.reduce(rows, COLUMNS)] == first_seen


@pytest.mark.parametrize("route_by_key", [-1, 0, 2.5, "2"])
def test_route_by_key_is_a_number_of_partitions_or_a_bool(route_by_key: Any) -> None:
    from twophase.spark import routed_by_key  # noqa: PLC0415 - pyspark only here

    with pytest.raises(ConfigurationError, match="neither a number of partitions nor a bool"):
        routed_by_key(None, RoutedSink(("id",)), route_by_key)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["boolean", "binary", "array<bigint>", "struct<a:int>"])
def test_a_version_of_a_type_that_does_not_order_is_refused(kind: str) -> None:
    from twophase import Column  # noqa: PLC0415

    columns = [Column("id", "bigint"), Column("v", kind)]
    with pytest.raises(SchemaMismatchError, match=f"of type {re.escape(kind)}, which does not"):
        Keyed(("id",), "v").check_columns("t", columns)
    Keyed(("id",), "v").check_columns("t", [Column("id", "bigint"), Column("v", "timestamp")])


def applied(parts: list[list[tuple[Any, ...]]]) -> dict[int, tuple[Any, ...]]:
    """What applying flagged parts in order leaves: per key the newest (a later part's change
    of a key wins only if newer: the writers' version guard)."""
    state: dict[int, tuple[Any, ...]] = {}
    for part in parts:
        assert len({row[0] for row in part}) == len(part), "a key twice in one part"
        for row in part:
            if row[0] not in state or row[2] > state[row[0]][2]:
                state[row[0]] = row
    return state


@settings(max_examples=200, deadline=None)
@given(changes, st.integers(1, 7), st.integers(1, 8))
def test_a_tasks_chunks_reduced_across_chunks_apply_as_their_newest_changes(
        rows: list[tuple[Any, ...]], chunk: int, size: int) -> None:
    """newest_in_chunks and newest_in_tables hand over parts of at least ``size`` keys (but the
    last), each key once per part, flagged; applied in order they leave each key's newest
    change, the same in rows and in Arrow."""
    chunks = [rows[i:i + chunk] for i in range(0, len(rows), chunk)]
    parts = list(KEYED.newest_in_chunks(chunks, COLUMNS, size))
    schema = pa.schema([("id", pa.int64()), ("status", pa.string()), ("v", pa.int64()),
                        ("op", pa.string())])
    tables = (pa.Table.from_pylist([dict(zip(COLUMNS, row, strict=True)) for row in part],
                                   schema=schema) for part in chunks)
    arrow = [list(zip(*(column.to_pylist() for column in table.columns), strict=True))
             for table in KEYED.newest_in_tables(tables, size)]
    assert all(len(part) >= size for part in parts[:-1])
    want = {key: (*row[:3], is_delete(row[3])) for key, row in expected(rows).items()}
    assert applied(parts) == want
    assert applied(arrow) == want
    assert KEYED.flagged_columns(COLUMNS) == ("id", "status", "v", "_twophase_deleted")
