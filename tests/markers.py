"""The markers every test gets from what it takes, derived at collection (``tests/conftest.py``):

* ``server``: it takes a fixture that starts a server process (:data:`SERVER_FIXTURES`: the
  plugins' :func:`~tests.fixtures.starts_server` fixtures, and every registered setup's
  ``servers``), directly, through other fixtures, or by name at run time where the name is
  known at collection: a suite's ``setup_fixture``, a parameter naming a fixture or a
  registered sink (``"mysql"`` stands for ``mysql_setup``);
* ``spark``: it takes a fixture that starts Spark (:data:`SPARK_FIXTURES`) or is a crash
  suite (whose driver is a Spark process of its own); tests that launch Spark otherwise say
  so themselves (``pytest.mark.spark``);
* the sink's name (``mysql``, ``kafka``, ...: every name of :data:`setups.SETUPS`): it is in
  the sink's room (``tests/sinks/<name>/``) or takes one of its setups (``mysql_setup``,
  ``least_privileged_mysql_setup``, ``delta_s3_setup``: the first registered name in the
  fixture's name ending in ``_setup``).

A test that starts a server some other way (a setup's ``started()`` in its body) is marked
``server`` by hand. The markers are registered in ``pyproject.toml`` (``--strict-markers``).
A ``-m`` that does not name ``long`` leaves the ``long`` tests out, as CI's does
(:func:`without_long`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from setups import SETUPS, SinkSetup
from tests import REPO
from tests.fixtures import SERVER_FIXTURES, SPARK_FIXTURES
from tests.sink_sets import fixture_of
from twophase.testing.crash import CrashSuite

TESTS = REPO / "tests"
SERVER = "server"
SPARK = "spark"
CRASH = "crash"
LONG = "long"
#: The rooms of the sinks' tests: ``tests/sinks/<name>/``.
SINKS_ROOM = "sinks"


def server_fixtures(registry: Mapping[str, type[SinkSetup]] = SETUPS) -> frozenset[str]:
    """The fixtures that start a server: the plugins' and every registered setup's."""
    return frozenset(SERVER_FIXTURES).union(*(setup.servers for setup in registry.values()))


def room_of(path: Path) -> str:
    """The room of a test file: ``unit``, ``repo``, ``spark``, ``sinks`` (several sinks') or
    ``sinks/<name>``; ``tests`` for a module at the top."""
    parts = path.resolve().relative_to(TESTS).parts[:-1]
    if parts[:1] == (SINKS_ROOM,):
        return "/".join(parts[:2])
    return parts[0] if parts else "tests"


def sink_of_room(room: str) -> str | None:
    """``mysql`` for ``sinks/mysql``; None for a room that is no sink's."""
    top, _, name = room.partition("/")
    return name if top == SINKS_ROOM and name in SETUPS else None


def sink_of_fixture(name: str, registry: Iterable[str] = SETUPS) -> str | None:
    """The sink of a setup fixture: the first registered name among the parts of a fixture
    name ending in ``_setup`` (``delta_s3_setup``: delta); None for any other fixture."""
    *parts, last = name.split("_")
    if last != "setup":
        return None
    names = set(registry)
    return next((part for part in parts if part in names), None)


def named_at_run_time(item: pytest.Item) -> set[str]:
    """The fixtures a test takes by name at run time that collection already knows: its
    suite's ``setup_fixture`` and its parameters that name a fixture or a registered sink."""
    names: set[str] = set()
    setup_fixture = getattr(getattr(item, "cls", None), "setup_fixture", None)
    if isinstance(setup_fixture, str):
        names.add(setup_fixture)
    callspec = getattr(item, "callspec", None)
    values: list[Any] = list(callspec.params.values()) if callspec is not None else []
    for value in values:
        for candidate in value if isinstance(value, tuple | list) else (value,):
            if not isinstance(candidate, str):
                continue
            if candidate in SETUPS:
                names.add(fixture_of(candidate))
            elif _definitions(item, candidate):
                names.add(candidate)
    return names


def _definitions(item: pytest.Item, name: str) -> list[Any]:
    """The definitions pytest uses for ``name`` in ``item`` (a parameter given directly, as
    ``connect=True``, is no fixture: its own definition takes nothing)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is not None and name in info.name2fixturedefs:
        return list(info.name2fixturedefs[name])
    manager = item.session._fixturemanager  # pytest's own resolution of a name
    return list(manager.getfixturedefs(name, item) or ())


def fixture_closure(item: pytest.Item) -> set[str]:
    """Every fixture the test takes, the ones taken by name at run time (and what they take:
    a registered setup its ``servers`` too) included."""
    todo = [*getattr(item, "fixturenames", ()), *named_at_run_time(item)]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for definition in _definitions(item, name):
            todo.extend(definition.argnames)
        if name.endswith("_setup") and (setup := SETUPS.get(name.removesuffix("_setup"))):
            todo.extend(setup.servers)
    return seen


def derived_markers(item: pytest.Item) -> set[str]:
    """The markers :mod:`tests.markers` derives for ``item`` (see above)."""
    closure = fixture_closure(item)
    markers: set[str] = set()
    if closure & server_fixtures():
        markers.add(SERVER)
    cls = getattr(item, "cls", None)
    if closure & SPARK_FIXTURES or (isinstance(cls, type) and issubclass(cls, CrashSuite)):
        markers.add(SPARK)
    path = getattr(item, "path", None)
    if isinstance(path, Path) and path.resolve().is_relative_to(TESTS):
        sink = sink_of_room(room_of(path))
        if sink:
            markers.add(sink)
    markers.update(sink for name in closure if (sink := sink_of_fixture(name)))
    return markers


def without_long(expression: str) -> str:
    """``expression`` (a ``-m``), its tests under ``-m long`` left out unless it names ``long``
    itself; an empty one selects everything."""
    if not expression or re.search(r"\blong\b", expression):
        return expression
    return f"({expression}) and not {LONG}"


def mark(items: Iterable[pytest.Item]) -> None:
    """Adds the derived markers to every item (before ``-m`` selects)."""
    for item in items:
        for name in sorted(derived_markers(item)):
            if item.get_closest_marker(name) is None:
                item.add_marker(name)


def check_marked(fixture: str, request: pytest.FixtureRequest) -> None:
    """Fails the test that starts a server (or Spark) through ``fixture`` without the
    marker: the derivation above missed how it takes it."""
    item = getattr(request, "_pyfuncitem", None)
    if item is None:
        return
    for marker, fixtures in ((SERVER, SERVER_FIXTURES), (SPARK, SPARK_FIXTURES)):
        if fixture in fixtures and item.get_closest_marker(marker) is None:
            pytest.fail(f"{item.nodeid} starts {fixture!r} but is not marked {marker!r}: "
                        f"mark it @pytest.mark.{marker} (the fixture is taken in a way "
                        "tests/markers.py cannot see at collection)", pytrace=False)
