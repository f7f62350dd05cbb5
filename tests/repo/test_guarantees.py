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

REPO = Path(__file__).resolve().parents[1]
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


@pytest.mark.parametrize("heading", [MATRIX_HEADING, SCORECARD_HEADING])
def test_every_row_of_the_table_names_tests_that_exist(heading: str) -> None:
    rows = table_rows(GUARANTEES.read_text(), heading)
    assert rows, f"the table under {heading!r} is empty"
    without = [row for row in rows if not NODE_ID.findall(row)]
    missing = sorted({node for row in rows for node in NODE_ID.findall(row) if not exists(node)})
    assert without == [], f"rows naming no test: {without}"
    assert missing == [], f"rows name tests that do not exist: {missing}"


def test_the_check_sees_inherited_tests_and_refuses_missing_ones() -> None:
    inherited = ("tests/test_s3_crash.py::TestS3Crashes::"
                 "test_a_driver_killed_at_every_point_in_turn_delivers_every_row_exactly_once")
    assert exists(inherited)
    assert exists("tests/test_sqlite_sink.py::TestSQLiteContract::"
                  "test_pre_committed_rows_stay_invisible_until_commit")
    assert exists("tests/test_model.py::test_model_over_every_sink")
    assert exists("tests/test_model.py::test_model_over_every_sink[sqlite]")
    assert not exists("tests/test_s3_crash.py::TestS3Crashes::test_that_does_not_exist")
    assert not exists("tests/test_model.py::test_that_does_not_exist")
    assert not exists("tests/test_nothing.py::test_model_over_every_sink[sqlite]")
    assert not exists("tests/test_model.py::test_model_over_sqlite")
    assert table_rows(f"{MATRIX_HEADING}\n\n| a | b |\n|---|---|\n| x | y |\n\n| c |\n",
                      MATRIX_HEADING) == ["| x | y |"]
