"""A sink's default transaction namespace: the target's name and where it is (0.5.0), a state
started under a sink's former default keeping it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sinks.sqlite import SQLiteSink
from twophase._handle import NAMESPACE_MAX_LENGTH, qualified_namespace, validate_namespace
from twophase._state import StateStore
from twophase.errors import ConfigurationError
from twophase.spark import _namespaces


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


def started_under(tmp_path: Path, namespace: str) -> StateStore:
    store = StateStore(tmp_path / "state")
    store.start_run(namespace, {})
    return store


def test_a_new_checkpoint_gets_the_qualified_default(sink: SQLiteSink, tmp_path: Path) -> None:
    default, former = _namespaces(sink, None)
    assert default == sink.default_namespace() != "orders"
    assert StateStore(tmp_path / "state").start_run(default, {}, keeping=former).namespace == \
        default


def test_a_state_started_under_the_former_default_keeps_it(sink: SQLiteSink,
                                                           tmp_path: Path) -> None:
    assert sink.former_default_namespaces() == ("orders",)
    default, former = _namespaces(sink, None)
    assert former == ("orders",)
    assert started_under(tmp_path / "old", "orders").start_run(
        default, {}, keeping=former).namespace == "orders"
    assert started_under(tmp_path / "new", default).start_run(
        default, {}, keeping=former).namespace == default


def test_a_namespace_the_job_names_keeps_no_former_default(sink: SQLiteSink) -> None:
    assert _namespaces(sink, "shop") == ("shop", ())


def test_a_state_of_another_namespace_is_refused_by_the_state(sink: SQLiteSink,
                                                              tmp_path: Path) -> None:
    """Not taken over silently: the state's own check refuses the mismatch, naming both."""
    default, former = _namespaces(sink, None)
    with pytest.raises(ConfigurationError, match=r"belongs to namespace 'invoices', not "
                       + repr(default)):
        started_under(tmp_path, "invoices").start_run(default, {}, keeping=former)
