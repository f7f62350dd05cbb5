"""docs/GUARANTEES.md lists nothing without a test: every row of the matrix and of the scorecard
names tests, and they exist.

Test ids are collected without importing anything: the test files are parsed (AST), and a
class's tests include those it inherits, also from base classes in other modules
(``SinkContract``, ``CrashSuite``), found through the file's imports. A parametrized test may
be named with one of its ids (``test_model_over_every_sink[kafka]``); the id is not checked
against the parameters, only the test it belongs to.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from itertools import takewhile
from pathlib import Path

import pytest

from tests import REPO

GUARANTEES = REPO / "docs" / "GUARANTEES.md"
MATRIX_HEADING = "## Matrix"
SCORECARD_HEADING = "## Scorecard"
NODE_ID = re.compile(r"`(tests/[\w/]+\.py::[\w:]+(?:\[[\w.-]+\])?)`")


def table_rows(text: str, heading: str) -> list[str]:
    """The body rows of the first Markdown table after ``heading`` (a line or part of one)."""
    _, found, after = text.partition(heading)
    assert found, f"no {heading!r} in the text"
    lines = after.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), len(lines))
    table = list(takewhile(lambda line: line.startswith("|"), lines[start:]))
    return table[2:]  # skip the header and the |---| line


@cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def module_path(module: str) -> Path | None:
    path = REPO / (module.replace(".", "/") + ".py")
    return path if path.exists() else None


def imported_from(tree: ast.Module, name: str) -> Path | None:
    """The file of the module ``name`` is imported from (``from m import name``)."""
    for node in tree.body:
        if (isinstance(node, ast.ImportFrom) and node.module and node.level == 0
                and any((alias.asname or alias.name) == name for alias in node.names)):
            return module_path(node.module)
    return None


def class_tests(path: Path, name: str) -> set[str]:
    """The test methods of class ``name`` in ``path``, inherited ones included."""
    tree = parsed(path)
    found = next((node for node in tree.body
                  if isinstance(node, ast.ClassDef) and node.name == name), None)
    if found is None:
        source = imported_from(tree, name)
        return class_tests(source, name) if source else set()
    tests = {node.name for node in found.body
             if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
             and node.name.startswith("test")}
    for base in found.bases:
        if isinstance(base, ast.Name):
            tests |= class_tests(path, base.id)
    return tests


def exists(node_id: str) -> bool:
    file, _, rest = node_id.partition("::")
    rest = rest.partition("[")[0]  # a parametrized test's id
    path = REPO / file
    if not path.exists():
        return False
    parts = rest.split("::")
    if len(parts) == 1:
        return any(isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                   and node.name == parts[0] for node in parsed(path).body)
    if len(parts) == 2:
        return parts[1] in class_tests(path, parts[0])
    return False


# -- which named tests run in CI (not under ``-m long``) ---------------------------------------


def _is_long_mark(node: ast.expr) -> bool:
    """``pytest.mark.long`` (or ``mark.long``), called or not."""
    if isinstance(node, ast.Call):
        node = node.func
    return (isinstance(node, ast.Attribute) and node.attr == "long"
            and isinstance(node.value, ast.Attribute) and node.value.attr == "mark")


def _marks_long(node: ast.expr | None) -> bool:
    """A ``marks=`` value (one mark or a list of them) that holds ``pytest.mark.long``."""
    if node is None:
        return False
    marks = node.elts if isinstance(node, ast.List | ast.Tuple) else [node]
    return any(_is_long_mark(mark) for mark in marks)


def _constants(tree: ast.Module) -> dict[str, object]:
    """The module's names bound to a literal (``RACE_TRIALS_LONG = 100``, also unpacked)."""
    found: dict[str, object] = {}
    for node in tree.body:
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target, value = node.targets[0], node.value
        pairs = (zip(target.elts, value.elts, strict=False)
                 if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple)
                 else [(target, value)])
        for name, literal in pairs:
            if isinstance(name, ast.Name) and isinstance(literal, ast.Constant):
                found[name.id] = literal.value
    return found


def _param_id(call: ast.Call, constants: dict[str, object]) -> str | None:
    """The id pytest gives ``pytest.param(...)``: its ``id=``, else its literal values joined
    by ``-`` (None where a value is no literal)."""
    for keyword in call.keywords:
        if keyword.arg == "id" and isinstance(keyword.value, ast.Constant):
            return str(keyword.value.value)
    parts = []
    for arg in call.args:
        if isinstance(arg, ast.Constant):
            parts.append(str(arg.value))
        elif isinstance(arg, ast.Name) and arg.id in constants:
            parts.append(str(constants[arg.id]))
        else:
            return None
    return "-".join(parts)


def _parametrizations(function: ast.FunctionDef | ast.AsyncFunctionDef
                      ) -> list[list[ast.expr]]:
    """The values of each ``@pytest.mark.parametrize`` of ``function`` (literal lists only)."""
    found = []
    for decorator in function.decorator_list:
        if (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
                and decorator.func.attr == "parametrize" and len(decorator.args) >= 2
                and isinstance(decorator.args[1], ast.List | ast.Tuple)):
            found.append(list(decorator.args[1].elts))
    return found


def _long_param(value: ast.expr) -> bool:
    return (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
            and value.func.attr == "param"
            and _marks_long(next((k.value for k in value.keywords if k.arg == "marks"), None)))


def _function_long(path: Path, function: ast.FunctionDef | ast.AsyncFunctionDef,
                   param: str | None) -> bool:
    """Marked long itself, every value of one of its parametrizations long, or (``param``
    given) the value of that id long."""
    if any(_is_long_mark(decorator) for decorator in function.decorator_list):
        return True
    constants = _constants(parsed(path))
    for values in _parametrizations(function):
        if values and all(_long_param(value) for value in values):
            return True
        for value in values:
            if param is None or not _long_param(value):
                continue
            assert isinstance(value, ast.Call)
            value_id = _param_id(value, constants)
            if value_id is not None and (f"-{param}-".find(f"-{value_id}-") >= 0
                                         or value_id == param):
                return True
    return False


def _module_long(tree: ast.Module) -> bool:
    """``pytestmark`` holds ``pytest.mark.long``."""
    return any(isinstance(node, ast.Assign) and any(
        isinstance(target, ast.Name) and target.id == "pytestmark" for target in node.targets)
        and _marks_long(node.value) for node in tree.body)


def _class_long(path: Path, name: str) -> bool:
    """Class ``name`` of ``path`` (or where it is imported from), or a base of it, is long
    (pytest's marks follow the classes' inheritance)."""
    tree = parsed(path)
    found = next((node for node in tree.body
                  if isinstance(node, ast.ClassDef) and node.name == name), None)
    if found is None:
        source = imported_from(tree, name)
        return _class_long(source, name) if source else False
    if _module_long(tree) or any(_is_long_mark(d) for d in found.decorator_list):
        return True
    return any(_class_long(path, base.id) for base in found.bases if isinstance(base, ast.Name))


def _method(path: Path, cls: str, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The method ``name`` as class ``cls`` of ``path`` has it (its own or inherited)."""
    tree = parsed(path)
    found = next((node for node in tree.body
                  if isinstance(node, ast.ClassDef) and node.name == cls), None)
    if found is None:
        source = imported_from(tree, cls)
        return _method(source, cls, name) if source else None
    for node in found.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return node
    for base in found.bases:
        if isinstance(base, ast.Name) and (method := _method(path, base.id, name)):
            return method
    return None


def is_long(node_id: str) -> bool:
    """Whether the test ``node_id`` names (an existing one) runs under ``-m long`` only."""
    file, _, rest = node_id.partition("::")
    rest, _, param = rest.partition("[")
    param_id = param.rstrip("]") or None
    path = REPO / file
    tree = parsed(path)
    parts = rest.split("::")
    if _module_long(tree):
        return True
    if len(parts) == 2:
        method = _method(path, parts[0], parts[1])
        return _class_long(path, parts[0]) or (
            method is not None and _function_long(path, method, param_id))
    function = next(node for node in tree.body if isinstance(
        node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == parts[0])
    return _function_long(path, function, param_id)


@pytest.mark.parametrize("heading", [MATRIX_HEADING, SCORECARD_HEADING])
def test_every_row_of_the_table_names_tests_that_exist(heading: str) -> None:
    rows = table_rows(GUARANTEES.read_text(), heading)
    assert rows, f"the table under {heading!r} is empty"
    without = [row for row in rows if not NODE_ID.findall(row)]
    missing = sorted({node for row in rows for node in NODE_ID.findall(row) if not exists(node)})
    assert without == [], f"rows naming no test: {without}"
    assert missing == [], f"rows name tests that do not exist: {missing}"


def test_the_check_sees_inherited_tests_and_refuses_missing_ones() -> None:
    inherited = ("tests/sinks/s3/test_s3_crash.py::TestS3Crashes::"
                 "test_a_driver_killed_at_every_point_in_turn_delivers_every_row_exactly_once")
    assert exists(inherited)
    assert exists("tests/sinks/sqlite/test_sqlite_sink.py::TestSQLiteContract::"
                  "test_pre_committed_rows_stay_invisible_until_commit")
    assert exists("tests/unit/test_model.py::test_model_over_every_sink")
    assert exists("tests/unit/test_model.py::test_model_over_every_sink[sqlite]")
    assert not exists("tests/sinks/s3/test_s3_crash.py::TestS3Crashes::test_that_does_not_exist")
    assert not exists("tests/unit/test_model.py::test_that_does_not_exist")
    assert not exists("tests/test_nothing.py::test_model_over_every_sink[sqlite]")
    assert not exists("tests/unit/test_model.py::test_model_over_sqlite")
    assert table_rows(f"{MATRIX_HEADING}\n\n| a | b |\n|---|---|\n| x | y |\n\n| c |\n",
                      MATRIX_HEADING) == ["| x | y |"]


@pytest.mark.parametrize("heading", [MATRIX_HEADING, SCORECARD_HEADING])
def test_every_row_names_a_test_that_runs_in_ci(heading: str) -> None:
    """What ``-m long`` alone runs (CI time) never stands alone for a guarantee: every row
    names at least one test of CI's selection (``-m 'not long'``)."""
    rows = table_rows(GUARANTEES.read_text(), heading)
    only_long = [row[:120] for row in rows
                 if all(is_long(node) for node in NODE_ID.findall(row) if exists(node))]
    assert only_long == [], f"rows whose tests all run under -m long only: {only_long}"


def test_the_check_sees_what_runs_under_long_only() -> None:
    every_point = "test_a_driver_killed_at_every_point_in_turn_delivers_every_row_exactly_once"
    assert not is_long(f"tests/sinks/sqlite/test_sqlite_crash.py::TestSQLiteCrashes::{every_point}")
    # a class marked long, a subclass of one, and an inherited test
    assert is_long(f"tests/sinks/s3/test_s3_crash.py::TestS3Crashes::{every_point}")
    assert is_long(f"tests/sinks/delta/test_delta_crash.py::TestDeltaOnS3EveryPointCrashes::"
                   f"{every_point}")
    # a function marked long; a parameter marked long, by its id or its values; all of them
    assert is_long("tests/spark/test_chaos.py::test_no_batch_is_decided_while_a_member_is_down")
    assert is_long("tests/spark/test_secret_canary.py::"
                   "test_no_secret_reaches_anything_the_job_or_its_tools_produce[reference]")
    assert not is_long("tests/spark/test_secret_canary.py::"
                       "test_no_secret_reaches_anything_the_job_or_its_tools_produce[clear]")
    assert not is_long("tests/spark/test_secret_canary.py::"
                       "test_no_secret_reaches_anything_the_job_or_its_tools_produce")
    racing = ("tests/sinks/delta/test_delta_sink.py::"
              "test_two_committers_racing_on_one_decided_batch_land_one_commit")
    assert is_long(f"{racing}[delta_setup-100]") and not is_long(f"{racing}[delta_setup-20]")
    assert is_long("tests/spark/test_chaos.py::test_a_chaos_round_delivers_every_row_exactly_once")
