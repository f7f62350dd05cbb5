"""The layers, enforced both ways.

``twophase/`` is at the bottom and knows no sink and no test; ``sinks/`` stand on twophase's
public face only; ``setups/`` (one test setup per sink, and the servers) stands on both and
knows no suite; ``tests/``, ``chaos/`` and ``bench/`` sit on top: they take the setups from
``setups/``, chaos and bench import no test module, and none imports another in a circle.
The public face of twophase, for a sink:

================================  ==============================================================
module                            what a sink takes from it
================================  ==============================================================
``twophase``                      the contract (``TwoPhaseCommitSink``, ``Committer``,
                                  ``Handle``, ``TxnId``, outcomes) and the errors
``twophase.kit``                  what every sink repeats (see its docstring)
``twophase.errors``               the error taxonomy (also re-exported by ``twophase``)
================================  ==============================================================

Tests also take ``twophase.testing`` (the suites) and, for now, private modules: they test
the framework's insides. Everything else under ``twophase._*`` is internal.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import twophase

REPO = Path(twophase.__file__).resolve().parents[1]
FORBIDDEN_IN_FRAMEWORK = ("sinks", "setups", "tests", "chaos", "bench")
PUBLIC_FOR_SINKS = frozenset({"twophase", "twophase.kit", "twophase.errors"})
TOP = ("bench", "chaos", "tests")


def imported_modules(path: Path) -> set[str]:
    """Every absolute module a file imports (``from x import y`` counts as ``x``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _files(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


def _relative(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def framework_offenders(paths: Iterable[Path]) -> set[str]:
    return {f"{_relative(path)}: {name}" for path in paths for name in imported_modules(path)
            if name.split(".")[0] in FORBIDDEN_IN_FRAMEWORK}


def sink_offenders(paths: Iterable[Path]) -> set[str]:
    """Imports of twophase beyond its public face for sinks, and of tests, chaos or bench."""
    return {f"{_relative(path)}: {name}" for path in paths for name in imported_modules(path)
            if (name.split(".")[0] == "twophase" and name not in PUBLIC_FOR_SINKS)
            or name.split(".")[0] in TOP}


def importers_of(paths: Iterable[Path], package: str) -> set[str]:
    return {_relative(path) for path in paths
            if any(name.split(".")[0] == package for name in imported_modules(path))}


def package_graph(files: dict[str, list[Path]]) -> dict[str, set[str]]:
    """Which of ``files``' packages import which others."""
    return {package: {name.split(".")[0] for path in paths
                      for name in imported_modules(path)
                      if name.split(".")[0] in files and name.split(".")[0] != package}
            for package, paths in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle of ``graph``, each from its smallest node (a graph of a few nodes)."""
    found: list[list[str]] = []

    def walk(path: list[str]) -> None:
        for successor in sorted(graph.get(path[-1], ())):
            if successor == path[0]:
                found.append(path)
            elif successor not in path and successor > path[0]:
                walk([*path, successor])

    for start in sorted(graph):
        walk([start])
    return found


# -- the tree as it is ---------------------------------------------------------------------------

def test_the_framework_imports_no_sink_test_chaos_or_bench() -> None:
    assert framework_offenders(_files("twophase")) == set()


def test_sinks_import_only_the_public_face_of_twophase() -> None:
    assert sink_offenders(_files("sinks")) == set()


def test_the_setups_import_no_suite() -> None:
    assert {package: importers_of(_files("setups"), package) for package in TOP} == {
        package: set() for package in TOP}


def test_chaos_and_bench_import_no_test_module() -> None:
    assert importers_of([*_files("chaos"), *_files("bench")], "tests") == set()


def test_setups_bench_chaos_and_tests_import_each_other_in_no_circle() -> None:
    graph = package_graph({package: _files(package) for package in (*TOP, "setups")})
    assert cycles(graph) == []


# -- the rules catch offenders --------------------------------------------------------------------

def test_the_rules_catch_each_kind_of_offender(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import os\nfrom sinks.sqlite import SQLiteSink\nimport tests.x as t\n"
                      "from twophase._rows import rows_of\nfrom twophase.kit import chunks\n"
                      "from . import sibling\n")
    assert imported_modules(module) == {"os", "sinks.sqlite", "tests.x", "twophase._rows",
                                        "twophase.kit"}
    names = {entry.split(": ")[1] for entry in sink_offenders([module])}
    assert names == {"tests.x", "twophase._rows"}
    assert cycles({"bench": {"tests"}, "chaos": {"tests"}, "tests": {"chaos"}}) == [
        ["chaos", "tests"]]
    assert cycles({"bench": {"chaos"}, "chaos": {"tests"}, "tests": {"bench"}}) == [
        ["bench", "chaos", "tests"]]
    assert cycles({"bench": {"tests"}, "chaos": {"tests"}, "tests": set()}) == []

