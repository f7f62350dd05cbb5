"""A prebuilt sink is one package, one setup and one registration (its line in
:data:`setups.SETUPS`); every suite derives its parameters from the registry.

Nothing fails silently: a package under ``sinks/`` without a registration, a registration
naming a fixture that does not exist, a suite class naming a setup fixture that does not exist,
a registered sink without its room of tests (``tests/sinks/<name>/``: its contract suite and
its crash suite, found by name), its marker (``pyproject.toml``, which ``--strict-markers``
needs), its benchmark peer, or an extra of ``pyproject.toml`` named by its ``kind`` (the client
libraries the preflight checks on the driver and every executor), and docs whose "adding a
sink" steps (docs/writing-a-sink.md) no longer match what a registered sink is made of each
fail a test here.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

import setups
from bench.spark_peers import peer_module
from setups import SETUPS, MySQLSetup, SinkSetup, SQLiteSetup
from tests import REPO
from tests.repo.test_docs import paragraph, prebuilt_sinks
from tests.sink_sets import Registry, fixture_of, shipped_in, sink_sets

WRITING_A_SINK = REPO / "docs" / "writing-a-sink.md"
PYPROJECT = REPO / "pyproject.toml"
TESTS = REPO / "tests"
#: A registered sink's room of tests: its contract and crash suites, found by name.
ROOM = "sinks/{name}"
#: The docs' "adding a sink" steps (docs/writing-a-sink.md): a numbered list in the paragraph
#: that begins so.
STEPS_START = "Inside this repository a prebuilt sink is"
STEP = re.compile(r"\d+\. ")
SETUP_FIXTURE = re.compile(r'^\s+setup_fixture = "(\w+)"', re.MULTILINE)
NAME = "<name>"


class LakeSetup(SQLiteSetup):
    """A sink of a later release, outside the every-sink group (a lake's, say)."""

    name = "lake"
    factory = "sinks.lake:LakeSink"
    since = "0.4.0"
    every_sink = False


def package_of(setup: type[SinkSetup]) -> str:
    """The package (or module) under ``sinks/`` of the setup's factory: ``mysql`` for
    ``sinks.mysql:MySQLXASink``."""
    top, _, inside = setup.factory.partition(":")[0].partition(".")
    assert top == "sinks", f"{setup.name}'s factory {setup.factory} is no prebuilt sink"
    return inside.partition(".")[0]


def unregistered(packages: Iterable[str], registry: Registry) -> list[str]:
    """The packages under ``sinks/`` that no registered setup's factory comes from."""
    registered = {package_of(setup) for setup in registry.values()}
    return [package for package in packages if package not in registered]


def missing_fixtures(request: pytest.FixtureRequest, names: Iterable[str]) -> list[str]:
    """The fixtures among ``names`` that this test session does not define."""
    manager = request._fixturemanager
    return [name for name in names if not manager.getfixturedefs(name, request.node)]


def places(setup: type[SinkSetup]) -> list[str]:
    """What a registered sink is made of, in the docs' order: its package, its setup, the
    registry's module; relative to the repository, the sink's name written ``<name>``."""
    spec = importlib.util.find_spec(f"sinks.{package_of(setup)}")
    assert spec is not None and spec.origin is not None, setup.factory
    package = Path(spec.origin)
    made_of = [package.parent if package.name == "__init__.py" else package,
               Path(inspect.getfile(setup)), Path(inspect.getfile(setups))]
    return [str(generic(path.relative_to(REPO), setup.name)) for path in made_of]


def generic(path: Path, name: str) -> Path:
    """``path`` with the sink's name written ``<name>`` (``setups/<name>.py``)."""
    return path.with_name(NAME + path.suffix) if path.stem == name else path


def docs_steps(page: str) -> list[str]:
    """The numbered steps of the docs' "adding a sink" paragraph, each on one line."""
    steps: list[str] = []
    for line in paragraph(page, STEPS_START).splitlines()[1:]:
        if STEP.match(line):
            steps.append(STEP.sub("", line, count=1))
        elif steps:
            steps[-1] += f" {line.strip()}"
    return steps


def room(name: str) -> Path:
    """The directory of a registered sink's tests."""
    return TESTS / ROOM.format(name=name)


def sink_class(setup: type[SinkSetup]) -> type[Any]:
    """The sink class a setup's factory names (``sinks.mysql:MySQLXASink``)."""
    module, _, name = setup.factory.partition(":")
    found: type[Any] = getattr(importlib.import_module(module), name)
    return found


def missing_extras(registry: Registry, extras: Mapping[str, object]) -> list[str]:
    """The registered sinks whose ``kind`` names no extra of ``pyproject.toml`` (the preflight
    would then check no client library of theirs)."""
    return [f"{name}: no extra {sink_class(setup).kind!r}" for name, setup in registry.items()
            if sink_class(setup).kind not in extras]


def pyproject() -> dict[str, Any]:
    return tomllib.loads(PYPROJECT.read_text())


def registered_markers() -> set[str]:
    """The markers ``pyproject.toml`` registers (``--strict-markers`` refuses any other)."""
    lines = pyproject()["tool"]["pytest"]["ini_options"]["markers"]
    return {line.partition(":")[0].strip() for line in lines}


def crash_suites(path: Path) -> list[str]:
    """The classes of a test module that subclass the shared crash suite directly."""
    return [node.name for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.ClassDef)
            and any(isinstance(base, ast.Name) and base.id == "CrashSuite"
                    for base in node.bases)]


# -- the registry as it is -----------------------------------------------------------------------

def test_every_package_under_sinks_is_registered_under_its_own_name() -> None:
    assert unregistered(prebuilt_sinks(), SETUPS) == []
    assert {name: package_of(setup) for name, setup in SETUPS.items()} == {
        name: name for name in SETUPS}


def test_every_registration_names_fixtures_that_exist(request: pytest.FixtureRequest) -> None:
    assert {name: missing_fixtures(request, [*setup.servers, fixture_of(name)])
            for name, setup in SETUPS.items()} == {name: [] for name in SETUPS}


def test_every_suite_names_a_setup_fixture_that_exists(request: pytest.FixtureRequest) -> None:
    named = {fixture for path in TESTS.rglob("test_*.py")
             for fixture in SETUP_FIXTURE.findall(path.read_text())}
    assert {fixture_of(name) for name in SETUPS} <= named
    assert missing_fixtures(request, sorted(named)) == []


def test_every_registered_sink_has_its_contract_suite_crash_suite_and_peer() -> None:
    """Found by name in the sink's room; the crash suites in one layout (the docs' own
    sink, no prebuilt one, in tests/spark/test_crash.py)."""
    assert SETUP_FIXTURE.findall((TESTS / "spark" / "test_crash.py").read_text()) == []
    for name in SETUPS:
        assert (room(name) / "__init__.py").is_file(), f"no room {ROOM.format(name=name)}"
        contract = room(name) / f"test_{name}_sink.py"
        assert f'setup_fixture = "{fixture_of(name)}"' in contract.read_text(), (
            f"{contract.name} runs no contract suite over the registered setup of {name}")
        assert crash_suites(room(name) / f"test_{name}_crash.py"), f"no crash suite of {name}"
        assert importlib.util.find_spec(peer_module(name)) is not None, f"no peer of {name}"


def test_every_registered_sink_has_its_marker_and_the_extra_of_its_kind() -> None:
    """``scripts/test -m <name>`` selects the sink's tests (tests/markers.py marks them); its
    ``kind`` names the extra whose client libraries the preflight checks (``client_extras``)."""
    assert set(SETUPS) - registered_markers() == set()
    assert missing_extras(SETUPS, pyproject()["project"]["optional-dependencies"]) == []


def test_every_registration_states_what_the_suites_derive() -> None:
    for name, setup in SETUPS.items():
        assert setup.model_ci_examples > 0, name
        assert name in shipped_in(setup.since), name


def test_the_docs_list_every_place_a_registered_sink_is_made_of() -> None:
    steps = docs_steps(WRITING_A_SINK.read_text())
    for setup in SETUPS.values():
        made_of = places(setup)
        assert len(steps) == len(made_of) == 3, (steps, made_of)
        assert [place for place, step in zip(made_of, steps, strict=True)
                if place not in step] == [], steps


# -- what is derived, and the checks refuse offenders --------------------------------------------

def test_a_later_sink_is_left_out_of_an_older_release_and_one_outside_the_group_runs_alone(
) -> None:
    registry: Registry = {"sqlite": SQLiteSetup, "mysql": MySQLSetup, "lake": LakeSetup}
    assert list(shipped_in("0.1.0", registry)) == ["sqlite", "mysql"]
    assert list(shipped_in("0.4.0", registry)) == ["sqlite", "mysql", "lake"]
    sets = sink_sets(registry)
    assert [(param.id, param.values, [mark.name for mark in param.marks]) for param in sets] == [
        ("every-sink", (("sqlite", "mysql"),), []),
        ("sqlite", (("sqlite",),), ["long"]),
        ("mysql", (("mysql",),), ["long"]),
        ("lake", (("lake",),), [])]


def test_the_checks_refuse_an_unregistered_package_a_missing_fixture_and_a_missing_step(
        request: pytest.FixtureRequest) -> None:
    assert unregistered([*prebuilt_sinks(), "lake"], SETUPS) == ["lake"]
    assert missing_fixtures(request, ["sqlite_setup", "lake_setup", "lake_server"]) == [
        "lake_setup", "lake_server"]
    text = (f"Before.\n\n{STEPS_START} two things:\n1. its package, `sinks/{NAME}/`;\n"
            f"2. its setup,\n   `setups/{NAME}.py`.\n\nAfter.\n")
    assert docs_steps(text) == [f"its package, `sinks/{NAME}/`;",
                                f"its setup, `setups/{NAME}.py`."]
    assert len(docs_steps(text)) != len(places(SQLiteSetup))
    assert places(MySQLSetup) == [f"sinks/{NAME}", f"setups/{NAME}.py", "setups/__init__.py"]
    assert crash_suites(TESTS / "repo" / "test_registry.py") == []
    extras = pyproject()["project"]["optional-dependencies"]
    assert missing_extras({"mysql": MySQLSetup}, {**extras, "mysql": []}) == []
    assert missing_extras({"mysql": MySQLSetup}, {k: v for k, v in extras.items()
                                                  if k != "mysql"}) == ["mysql: no extra 'mysql'"]
    assert {"server", "spark", "long"} <= registered_markers()
