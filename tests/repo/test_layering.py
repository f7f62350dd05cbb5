"""The layers, enforced both ways.

``twophase/`` is at the bottom and knows no sink, test or example, and its modules import each
other in no circle (not even inside a function or for the type checker); ``sinks/`` stand on
twophase's public face for sinks only, and no sink on another; ``setups/`` (one test setup per
sink, and the servers) stands on both and knows no suite; ``tests/``, ``chaos/`` and
``bench/`` sit on top: they take the setups from ``setups/``, chaos and bench import no test
module, and none imports another in a circle.
The sink kit (``twophase/kit/``: its core and its families, the lake code under it) stands on
the framework, never under it: no other module of ``twophase/`` imports it.
The public face of twophase, for a sink:

================================  ==============================================================
module                            what a sink takes from it
================================  ==============================================================
``twophase``                      the contract (``TwoPhaseCommitSink``, ``Committer``,
                                  ``Handle``, ``TxnId``, outcomes) and the errors
``twophase.kit``                  what every sink repeats (see its docstring)
``twophase.kit.sql``, ``.s3``,    what one family of sinks shares (a database's pool and keyed
``.lake``                         SQL, the S3 client, a lake table's files, sink and committer)
``twophase.errors``               the error taxonomy (also re-exported by ``twophase``)
================================  ==============================================================

``setups/``, ``chaos/``, ``bench/`` and ``examples/`` (the demo among them) take any public
module of twophase, none whose name has a part starting with ``_``: besides the above,
``twophase.spark``, ``twophase.status``, ``twophase.metrics`` and ``twophase.testing`` (whose
``crash_points`` and ``protocol`` serve harnesses). Tests also take private modules: they test
the framework's insides.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

import pytest

import twophase

REPO = Path(twophase.__file__).resolve().parents[1]
FORBIDDEN_IN_FRAMEWORK = ("sinks", "setups", "tests", "chaos", "bench", "examples")
#: The sink kit: its core and its families (each module's ``__all__`` is its public API).
KIT = frozenset({"twophase.kit", "twophase.kit.sql", "twophase.kit.s3", "twophase.kit.lake"})
PUBLIC_FOR_SINKS = frozenset({"twophase", "twophase.errors", *KIT})
#: Subpackages of ``twophase/`` whose modules join its import graph (one module per file).
FRAMEWORK_SUBPACKAGES = ("kit",)
TOP = ("bench", "chaos", "tests")
#: What stands on twophase's public face without being a sink.
EDGES = ("setups", "chaos", "bench", "examples")
#: The state store: below the sinks, so it takes nothing from their kit.
STATE_STORE = ("twophase/_state.py", "twophase/_storage.py")
#: What runs on the driver (or in cron) of a sink: reached through its committer alone.
DRIVER_SIDE = frozenset({"fence", "commit", "abort", "list_in_doubt", "purge_commit_records",
                         "commit_deadline", "check_committable", "finish_batch"})
#: The framework modules that drive sinks (all but the contract itself, ``twophase/sink.py``,
#: whose default committer is the one place that forwards to the sink).
DRIVERS = ("twophase/_coordinator.py", "twophase/_aborts.py", "twophase/_spark.py",
           "twophase/spark.py", "twophase/cleanup.py", "twophase/status.py",
           "twophase/group.py", "twophase/metrics.py")
#: A receiver that is a sink: ``sink``, ``self.sink``, ``target.sink``, ``self.members[name]``.
_A_SINK = re.compile(r"(^|\.)(sink|members\[[^\]]*\])$")


def imported_modules(path: Path, root: Path = REPO) -> set[str]:
    """Every absolute module a file imports: ``from x import y`` counts as ``x.y`` if that is
    a module of the tree at ``root`` (``from twophase import _crash``), else as ``x``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names
                          if _is_module(root, f"{node.module}.{alias.name}")}
            names.update(submodules)
            if len(submodules) < len(node.names):
                names.add(node.module)
    return names


def _is_module(root: Path, name: str) -> bool:
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


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


def is_private(name: str) -> bool:
    """A module of twophase's insides: a part of its name after ``twophase`` starts with ``_``."""
    root, *parts = name.split(".")
    return root == "twophase" and any(part.startswith("_") for part in parts)


def private_offenders(paths: Iterable[Path]) -> set[str]:
    """Imports of twophase's private modules (``twophase._crash``, ``twophase.testing._x``)."""
    return {f"{_relative(path)}: {name}" for path in paths for name in imported_modules(path)
            if is_private(name)}


def foreign_sink_offenders(paths: Iterable[Path], root: Path = REPO) -> set[str]:
    """Imports of one sink by another (a module of ``sinks/X`` importing ``sinks.Y``): what two
    sinks share belongs in twophase's public face."""
    return {f"{_relative(path)}: {name}" for path in paths
            for name in imported_modules(path, root)
            if name.startswith("sinks.") and name.split(".")[1] != sink_of(path, root)}


def sink_of(path: Path, root: Path = REPO) -> str:
    """The sink a file of ``root/sinks`` belongs to: ``s3`` for ``sinks/s3/sink.py``,
    ``sqlite`` for ``sinks/sqlite.py``."""
    return path.relative_to(root / "sinks").parts[0].removesuffix(".py")


def module_graph(root: Path, package: str, subpackages: Iterable[str] = ()
                 ) -> dict[str, set[str]]:
    """Which of ``package``'s top-level modules and those of its ``subpackages`` (at any
    depth; a package's ``__init__`` named as the package) import which others."""
    paths = [*sorted((root / package).glob("*.py")),
             *(path for sub in subpackages
               for path in sorted((root / package / sub).rglob("*.py")))]
    modules = {_dotted(root, path): path for path in paths}
    return {module: {name for name in imported_modules(path, root)
                     if name in modules and name != module}
            for module, path in modules.items()}


def _dotted(root: Path, path: Path) -> str:
    """The module a file of ``root`` is: ``twophase.kit`` for ``twophase/kit/__init__.py``."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


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


def driver_side_calls_on_a_sink(path: Path) -> set[str]:
    """Calls of a driver-side method on a sink (not its committer) in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return {f"{_relative(path)}:{node.lineno}: {ast.unparse(node.func)}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in DRIVER_SIDE and _A_SINK.search(ast.unparse(node.func.value))}


def group_type_checks(path: Path) -> set[str]:
    """``isinstance(x, SinkGroup)`` in ``path``: knowing a group by its type."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return {f"{_relative(path)}:{node.lineno}" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "isinstance" and len(node.args) == 2
            and "SinkGroup" in ast.unparse(node.args[1])}


# -- the tree as it is ---------------------------------------------------------------------------

def test_the_framework_imports_no_sink_test_chaos_bench_or_example() -> None:
    assert framework_offenders(_files("twophase")) == set()


def test_the_framework_modules_import_each_other_in_no_circle() -> None:
    graph = module_graph(REPO, "twophase", FRAMEWORK_SUBPACKAGES)
    assert set(graph) >= KIT
    assert cycles(graph) == []


def is_kit(name: str) -> bool:
    return name == "twophase.kit" or name.startswith("twophase.kit.")


def test_the_state_store_imports_no_sink_kit() -> None:
    assert {f"{path}: {name}" for path in STATE_STORE
            for name in imported_modules(REPO / path) if is_kit(name)} == set()


def test_the_framework_imports_no_sink_kit() -> None:
    """The kit (and the lake code under it) stands on the framework: no module of
    ``twophase/`` outside ``twophase/kit/`` imports any of it."""
    kit = REPO / "twophase" / "kit"
    assert {f"{_relative(path)}: {name}" for path in _files("twophase")
            if not path.is_relative_to(kit)
            for name in imported_modules(path) if is_kit(name)} == set()


def test_the_framework_reaches_a_sinks_driver_side_through_its_committer_alone() -> None:
    assert set().union(*(driver_side_calls_on_a_sink(REPO / path) for path in DRIVERS)) == set()


def test_the_coordinator_knows_no_sink_group() -> None:
    """A group is a sink whose committer gives one commit stage per member."""
    assert "twophase.group" not in imported_modules(REPO / "twophase/_coordinator.py")
    assert {check for path in _files("twophase") if path.name != "group.py"
            for check in group_type_checks(path)} == set()


def test_sinks_import_only_the_public_face_of_twophase() -> None:
    assert sink_offenders(_files("sinks")) == set()


def test_no_sink_imports_another_sink() -> None:
    assert foreign_sink_offenders(_files("sinks")) == set()


def test_setups_chaos_bench_and_examples_import_no_private_module_of_twophase() -> None:
    assert private_offenders(path for edge in EDGES for path in _files(edge)) == set()


def test_the_setups_import_no_suite() -> None:
    assert {package: importers_of(_files("setups"), package) for package in TOP} == {
        package: set() for package in TOP}


def test_setups_chaos_bench_and_examples_import_no_pytest() -> None:
    """The servers and setups serve benchmarks, chaos runs and scripts without pytest: their
    test fixtures live in ``tests/fixtures``."""
    edges = [path for edge in EDGES for path in _files(edge)]
    assert {package: importers_of(edges, package) for package in ("pytest", "_pytest")} == {
        "pytest": set(), "_pytest": set()}


def test_chaos_and_bench_import_no_test_module() -> None:
    assert importers_of([*_files("chaos"), *_files("bench")], "tests") == set()


def test_setups_bench_chaos_and_tests_import_each_other_in_no_circle() -> None:
    graph = package_graph({package: _files(package) for package in (*TOP, "setups")})
    assert cycles(graph) == []


# -- the rules catch offenders --------------------------------------------------------------------

def test_the_rules_catch_a_driver_side_call_on_a_sink_and_a_group_type_check(
        tmp_path: Path) -> None:
    module = tmp_path / "driver.py"
    module.write_text("def sweep(self, target, committer, sink, group):\n"
                      "    self.sink.list_in_doubt('ns')\n"
                      "    target.sink.purge_commit_records('ns', 0)\n"
                      "    self.members[name].abort(handle)\n"
                      "    committer.list_in_doubt('ns')\n"
                      "    sink.committer().commit(handle)\n"
                      "    sink.kind\n"
                      "    return isinstance(group, SinkGroup)\n")
    assert {line.split(": ")[1] for line in driver_side_calls_on_a_sink(module)} == {
        "self.sink.list_in_doubt", "target.sink.purge_commit_records",
        "self.members[name].abort"}
    assert {line.rsplit(":", 1)[1] for line in group_type_checks(module)} == {"8"}


def test_the_rules_catch_each_kind_of_offender(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import os\nfrom sinks.sqlite import SQLiteSink\nimport tests.x as t\n"
                      "from twophase._rows import rows_of\nfrom twophase.kit import chunks\n"
                      "from twophase import _crash, TxnId\nfrom . import sibling\n")
    assert imported_modules(module) == {"os", "sinks.sqlite", "tests.x", "twophase._rows",
                                        "twophase.kit", "twophase", "twophase._crash"}
    names = {entry.split(": ")[1] for entry in sink_offenders([module])}
    assert names == {"tests.x", "twophase._rows", "twophase._crash"}
    assert cycles({"bench": {"tests"}, "chaos": {"tests"}, "tests": {"chaos"}}) == [
        ["chaos", "tests"]]
    assert cycles({"bench": {"chaos"}, "chaos": {"tests"}, "tests": {"bench"}}) == [
        ["bench", "chaos", "tests"]]
    assert cycles({"bench": {"tests"}, "chaos": {"tests"}, "tests": set()}) == []



def _tree(root: Path, files: dict[str, str]) -> list[Path]:
    """``files`` (path: source) written under ``root``; their paths."""
    paths = []
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
        paths.append(path)
    return paths


@pytest.mark.parametrize("edge", EDGES)
def test_the_rules_catch_a_private_import_at_an_edge(tmp_path: Path, edge: str) -> None:
    paths = _tree(tmp_path, {f"{edge}/m.py": "from twophase._crash import CRASH_POINTS\n"
                             "from twophase import _state, TxnId\nimport twophase._handle\n"
                             "from twophase.testing.crash_points import CRASH_ENV\n"
                             "from twophase.testing.protocol import StateStore\n"})
    assert {entry.split(": ")[1] for entry in private_offenders(paths)} == {
        "twophase._crash", "twophase._state", "twophase._handle"}


def test_the_rules_catch_a_sink_importing_another_sink(tmp_path: Path) -> None:
    paths = _tree(tmp_path, {
        "sinks/__init__.py": "",
        "sinks/alpha/__init__.py": "from sinks.alpha.sink import AlphaSink\n",
        "sinks/alpha/sink.py": "from sinks.alpha import errors\nfrom sinks import beta\n"
                               "from twophase import TwoPhaseCommitSink\n",
        "sinks/alpha/errors.py": "import sinks.gamma\n",
        "sinks/beta/__init__.py": "",
        "sinks/gamma.py": "from sinks.beta import Beta\n"})
    assert {entry.removeprefix(f"{tmp_path}/") for entry in foreign_sink_offenders(
        paths, tmp_path)} == {"sinks/alpha/sink.py: sinks.beta",
                              "sinks/alpha/errors.py: sinks.gamma",
                              "sinks/gamma.py: sinks.beta"}


def test_the_rules_catch_a_circle_among_framework_modules(tmp_path: Path) -> None:
    _tree(tmp_path, {"twophase/__init__.py": "from twophase.a import A\n",
                     "twophase/a.py": "from twophase import _b\n",
                     "twophase/_b.py": "from twophase import c\nimport twophase.d\n",
                     "twophase/c.py": "import os\n",
                     "twophase/d.py": "from twophase import A\n"})
    graph = module_graph(tmp_path, "twophase")
    assert graph["twophase._b"] == {"twophase.c", "twophase.d"}
    assert cycles(graph) == [["twophase", "twophase.a", "twophase._b", "twophase.d"]]


def test_the_rules_catch_a_circle_through_the_kits_families(tmp_path: Path) -> None:
    _tree(tmp_path, {"twophase/__init__.py": "",
                     "twophase/kit/__init__.py": "from twophase._rows import chunks\n",
                     "twophase/kit/lake/__init__.py": "from twophase.kit.lake._sink import S\n",
                     "twophase/kit/lake/_sink.py": "from twophase.kit import chunks\n",
                     "twophase/_rows.py": "from twophase.kit.lake import S\n"})
    assert "twophase.kit.lake._sink" not in module_graph(tmp_path, "twophase")
    graph = module_graph(tmp_path, "twophase", ["kit"])
    assert graph["twophase.kit.lake"] == {"twophase.kit.lake._sink"}
    assert cycles(graph) == [["twophase._rows", "twophase.kit.lake", "twophase.kit.lake._sink",
                              "twophase.kit"]]
