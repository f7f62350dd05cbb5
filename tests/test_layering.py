"""The framework knows no external system: nothing under twophase/ imports a sink or a test."""

from __future__ import annotations

import ast
from pathlib import Path

import twophase

FORBIDDEN = ("sinks", "tests")


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_the_framework_imports_no_sink_and_no_test() -> None:
    package = Path(twophase.__file__).parent
    offenders = {
        f"{path.relative_to(package.parent)}: {name}"
        for path in package.rglob("*.py")
        for name in imported_modules(path)
        if name.split(".")[0] in FORBIDDEN
    }
    assert offenders == set()


def test_the_rule_would_catch_an_offender(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import os\nfrom sinks.sqlite import SQLiteSink\nimport tests.x as t\n")
    assert {"sinks.sqlite", "tests.x"} <= imported_modules(module)
