"""The docs site builds, and every option a page names on a prebuilt sink exists (issue 52).

``mkdocs build --strict`` fails on a broken link or anchor and on a page outside the navigation
(``mkdocs.yml``'s ``validation:`` settings). The option check reads README.md and every page under
``docs/`` as text: each call of a prebuilt sink's class in a code block or a code span (say
``DeltaSink("/data/lake/orders", create=True)``) is parsed, and each keyword it passes must be a
parameter of that class's constructor (``inspect.signature``).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mkdocs_hooks
from setups import SETUPS
from tests import REPO

#: Every prebuilt sink's class and its module, from the registry (a new sink is checked too).
SINK_CLASSES = {cls: module for module, cls in
                (setup.factory.split(":") for setup in SETUPS.values())}
FENCE = re.compile(r"```python\n(.*?)```", re.S)
# where a constructor's ``**kwargs`` go: their keywords are the parameters of this class
KWARGS_TO = {"KafkaSink": ("sinks.kafka.connection", "KafkaSettings")}
#: Where the site is built: the CI artifact (``.gitignore``'s ``/site/``).
SITE = REPO / "site"
SPAN = re.compile(r"`([^`\n]*\([^`\n]*\)[^`\n]*)`")


def pages(root: Path = REPO) -> list[Path]:
    """README.md and every Markdown page of the site."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def snippets(text: str) -> list[str]:
    """The Python a page shows: its ``python`` code blocks and its code spans holding a call."""
    blocks = FENCE.findall(text)
    rest = FENCE.sub("", text.replace("\n", " \n"))
    return blocks + SPAN.findall(rest)


def sink_keywords(code: str) -> list[tuple[str, str]]:
    """(class, keyword) of every call of a prebuilt sink's class the code makes."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in SINK_CLASSES:
                found += [(name, kw.arg) for kw in node.keywords if kw.arg is not None]
    return found


def parameters(cls: str) -> set[str]:
    """The keywords a prebuilt sink's constructor takes (its ``**kwargs``' where they are known)."""
    sink = getattr(importlib.import_module(SINK_CLASSES[cls]), cls)
    names = set(inspect.signature(sink).parameters)
    if cls in KWARGS_TO:
        module, target = KWARGS_TO[cls]
        names |= set(inspect.signature(getattr(importlib.import_module(module), target)).parameters)
    return names


def unknown_options(files: list[Path]) -> list[str]:
    """``file: Class(keyword=)`` for every keyword a page passes that the constructor lacks."""
    unknown = []
    for path in files:
        for code in snippets(path.read_text()):
            for cls, kw in sink_keywords(code):
                if kw not in parameters(cls):
                    unknown.append(f"{path.name}: {cls}({kw}=)")
    return sorted(set(unknown))


def test_every_option_a_page_names_exists_on_the_sink_constructor() -> None:
    assert unknown_options(pages()) == []


def test_the_option_check_refuses_a_planted_option(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("`DeltaSink(\"/data/t\", create=True)`\n")
    (tmp_path / "docs" / "bad.md").write_text(
        "```python\nsink = MySQLXASink(host=\"db\", no_such_option=1)\n```\n"
        "or `sinks.delta.DeltaSink(\"/t\", partition_by=(\"a\",), vacuum_hourly=True)`\n")
    assert unknown_options(pages(tmp_path)) == [
        "bad.md: DeltaSink(vacuum_hourly=)", "bad.md: MySQLXASink(no_such_option=)"]


def test_the_site_builds_strict() -> None:
    """Into ``site/`` (ignored by git), which CI keeps as the built site."""
    mkdocs = Path(sys.executable).with_name("mkdocs")
    if not mkdocs.exists():
        pytest.fail(f"{mkdocs} is missing: install the dev extra (pip install -e '.[dev]')")
    done = subprocess.run([str(mkdocs), "build", "--strict", "-d", str(SITE)],
                          check=False, cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_sink_page_shows_the_phase_table_of_its_docstring() -> None:
    """The site's hook (``mkdocs_hooks.py``) turns each ``<!-- phases: ... -->`` line into the
    module docstring's table: one row per phase, the five columns of the docstring."""
    for page in sorted((REPO / "docs" / "sinks").glob("*.md")):
        for module in mkdocs_hooks.MARKER.findall(page.read_text()):
            table = mkdocs_hooks.module_phase_table(module).splitlines()
            assert table[0].startswith("| phase |"), (page.name, table[0])
            phases = [row.split("|")[1].strip() for row in table[2:]]
            assert {"begin", "write", "pre-commit", "commit", "abort"} <= set(phases), (
                page.name, phases)


def test_the_phase_table_hook_reads_a_simple_table_and_refuses_a_module_without_one() -> None:
    docstring = """Before.

=====  ================  ==========
phase  calls             leaves
=====  ================  ==========
begin  ``XA START``,     nothing |
       connect           at all
write  :class:`~a.B`     rows
=====  ================  ==========
"""
    assert mkdocs_hooks.phase_table(docstring).splitlines() == [
        "| phase | calls | leaves |", "|---|---|---|",
        "| begin | `XA START`, connect | nothing \\| at all |", "| write | `B` | rows |"]
    with pytest.raises(ValueError, match="no table"):
        mkdocs_hooks.phase_table("No table here.")
