"""A sink's default transaction namespace: the target's name and where it is (0.5.0), a state
started under a sink's former default keeping it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sinks.sqlite import SQLiteSink
from twophase._handle import NAMESPACE_MAX_LENGTH, qualified_namespace, validate_namespace
from twophase._state import State
from twophase.spark import _default_namespace


def test_one_name_in_two_places_gets_two_namespaces() -> None:
    assert qualified_namespace("orders", "a") != qualified_namespace("orders", "b")
    assert qualified_namespace("orders", "a", "b") != qualified_namespace("orders", "ab")
    assert qualified_namespace("orders", "a") == qualified_namespace("orders", "a")


@pytest.mark.parametrize("name", ["orders", "My Orders (2024)", "x" * 80, "…", ""])
def test_a_qualified_namespace_is_usable_and_starts_with_the_name(name: str) -> None:
    namespace = qualified_namespace(name, "db")
    assert validate_namespace(namespace) == namespace
    assert len(namespace) <= NAMESPACE_MAX_LENGTH
    readable = "".join(c if c.isascii() and (c.isalnum() or c in "_-") else "_" for c in name)
    assert namespace.startswith(readable[:15] or "target")


def test_the_format_of_a_default_namespace_does_not_change_between_releases() -> None:
    """A running query's namespace is in its in-doubt transactions: a new release that derived
    another default would orphan them (this pins the digest)."""
    assert qualified_namespace("orders", "shop") == "orders-273b481b"


@pytest.fixture
def sink(tmp_path: Path) -> SQLiteSink:
    return SQLiteSink(str(tmp_path / "shop.db"), "orders")


def saved(namespace: str) -> State:
    return State(namespace=namespace, epoch=3, settings={})


def test_a_new_checkpoint_gets_the_qualified_default(sink: SQLiteSink) -> None:
    assert _default_namespace(sink, None) == sink.default_namespace() != "orders"


def test_a_state_started_under_the_former_default_keeps_it(sink: SQLiteSink) -> None:
    assert sink.former_default_namespaces() == ("orders",)
    assert _default_namespace(sink, saved("orders")) == "orders"
    assert _default_namespace(sink, saved(sink.default_namespace())) == sink.default_namespace()


def test_a_state_of_another_namespace_gets_the_default_and_is_refused_by_the_state(
        sink: SQLiteSink) -> None:
    """Not taken over silently: the state's own check refuses the mismatch, naming both."""
    assert _default_namespace(sink, saved("invoices")) == sink.default_namespace()
