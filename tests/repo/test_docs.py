"""The docs keep up with the code: the front page (README.md) names every prebuilt sink and
links its page, each sink's page shows its phase table, the tables of ``twophase.kit``
(docs/writing-a-sink.md) and ``twophase.testing`` (docs/versioning.md) list exactly what each
exports (their ``__all__`` is the public API), and the deprecated shims stay out of
``__all__`` while docs/versioning.md and CHANGELOG.md name them; the version is one in
pyproject.toml, ``twophase.__version__`` and CHANGELOG.md. Every Python block of README.md and
of the pages under docs/ compiles, the names it imports from ``twophase`` and ``sinks``
exist, and it type-checks (mypy over the blocks with the library's own hints: a wrong option,
argument or return type fails; names a fragment leaves to the reader, such as ``df``, and
``...`` bodies do not); every JSON and TOML block parses.

The checks read the pages as text; the sinks are found on disk (a package ``sinks/<name>/``
or a module ``sinks/<name>.py``), the kit's exports are its ``__all__``.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path

from mypy import api as mypy

import twophase
import twophase.kit
import twophase.testing
import twophase.testing.contract
import twophase.testing.crash
from tests import REPO
from tests.repo.test_guarantees import table_rows

README = REPO / "README.md"
DOCS = REPO / "docs"
#: The pages that hold what the README held: the kit's table, the suites and the sink's steps;
#: the public API and its deprecations.
WRITING_A_SINK = DOCS / "writing-a-sink.md"
VERSIONING = DOCS / "versioning.md"
SINK_PAGES = DOCS / "sinks"
SINKS = REPO / "sinks"
PREBUILT_HEADING = "## Sinks"
KIT_HEADING = "What every sink repeats comes from `twophase.kit`"
#: The kit's families: each module's table, under its own heading on the same page.
FAMILIES = {module: f"The family `{module}`" for module in
            ("twophase.kit.sql", "twophase.kit.s3", "twophase.kit.lake")}
TESTING_HEADING = "What `twophase.testing` exports"
DEPRECATED_HEADING = "Deprecated, working with a warning until"
PHASES = re.compile(r"^<!-- phases: (\S+) -->$", re.MULTILINE)
CHANGELOG = REPO / "CHANGELOG.md"
#: The deprecated shims: where they live and their name (kept out of ``__all__``).
SHIMS = [(twophase.kit, "CommitsViaCommitter"), (twophase.testing.crash, "SinkTarget")]
CODE = re.compile(r"`([A-Za-z_]\w*)`")
#: A fenced code block: its language and its text.
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
#: The packages whose names a block's imports must resolve (a job's, a sink's imports).
CHECKED_PACKAGES = ("twophase", "sinks")


def prebuilt_sinks() -> list[str]:
    """The name of every package (``sinks/<name>/__init__.py``) and module under ``sinks/``."""
    packages = [init.parent.name for init in SINKS.glob("*/__init__.py")]
    modules = [module.stem for module in SINKS.glob("*.py") if module.name != "__init__.py"]
    return sorted([*packages, *modules])


def paragraph(text: str, start: str) -> str:
    """The paragraph of ``text`` that begins with ``start``."""
    found = [block for block in text.split("\n\n") if block.startswith(start)]
    assert found, f"no paragraph begins with {start!r}"
    return found[0]


def section(text: str, heading: str) -> str:
    """The section of ``text`` under the heading line ``heading`` (``## Sinks``), up to the next
    heading of its level or above."""
    lines = text.splitlines()
    assert heading in lines, f"no heading {heading!r}"
    body = lines[lines.index(heading) + 1:]
    level = len(heading) - len(heading.lstrip("#"))
    ends = [i for i, line in enumerate(body)
            if 0 < len(line) - len(line.lstrip("#")) <= level and " " in line[:level + 1]]
    return "\n".join(body[:ends[0]] if ends else body)


def unnamed_sinks(readme: str, sinks: Iterable[str]) -> list[str]:
    """The sinks the front page's "Sinks" section does not name as ``sinks.<name>.`` with a
    link to the sink's page (``docs/sinks/<name>.md``)."""
    prebuilt = section(readme, PREBUILT_HEADING)
    return [name for name in sinks
            if f"[`sinks.{name}." not in prebuilt or f"](docs/sinks/{name}.md)" not in prebuilt]


def pages_without_phases(sinks: Iterable[str], pages: Path = SINK_PAGES) -> list[str]:
    """The sinks whose page is missing or shows no phase table of the sink's own modules
    (``<!-- phases: sinks/<name>/sink.py -->``, which the site's hook fills in)."""
    missing = []
    for name in sinks:
        page = pages / f"{name}.md"
        shown = PHASES.findall(page.read_text()) if page.exists() else []
        if not any(path.startswith((f"sinks/{name}/", f"sinks/{name}.py")) for path in shown):
            missing.append(name)
    return missing


def kit_table(text: str, heading: str = KIT_HEADING) -> list[str]:
    """The names in the first column of the kit's table (or of the one under ``heading``)."""
    return [name for row in table_rows(text, heading)
            for name in CODE.findall(row.split("|")[1])]


def kit_table_errors(text: str, exports: Iterable[str], heading: str = KIT_HEADING
                     ) -> tuple[list[str], list[str]]:
    """The exports the kit table (or the one under ``heading``) leaves out, and the names it
    lists that are no exports."""
    listed, exported = kit_table(text, heading), list(exports)
    return ([name for name in exported if name not in listed],
            [name for name in listed if name not in exported])


def doc_pages(root: Path = REPO) -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def code_blocks(text: str, *languages: str) -> list[str]:
    """The fenced code blocks of ``text`` in one of ``languages``."""
    return [code for language, code in BLOCK.findall(text) if language in languages]


def unresolved_import(module: str, name: str | None = None) -> str | None:
    """Why ``from module import name`` (or ``import module``) fails, or None."""
    try:
        imported = importlib.import_module(module)
    except ImportError as error:
        return f"{module}: {error}"
    if name is None or name == "*" or hasattr(imported, name):
        return None
    try:
        importlib.import_module(f"{module}.{name}")
    except ImportError:
        return f"{module} has no {name}"
    return None


def python_block_errors(code: str, where: str) -> list[str]:
    """What is wrong with a Python block: it does not compile, or a name it imports from
    ``twophase`` or ``sinks`` does not exist."""
    try:
        tree = ast.parse(code, filename=where)
        compile(tree, where, "exec")
    except SyntaxError as error:
        return [f"{where}: line {error.lineno}: {error.msg}"]
    errors = []
    for node in ast.walk(tree):
        wanted: list[tuple[str, str | None]] = []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            wanted = [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            wanted = [(alias.name, None) for alias in node.names]
        else:
            continue
        for module, name in wanted:
            if module.split(".")[0] in CHECKED_PACKAGES:
                why = unresolved_import(module, name)
                if why:
                    errors.append(f"{where}: line {node.lineno}: {why}")
    return errors


def block_errors(pages: Iterable[Path]) -> list[str]:
    """Every fault of the pages' code blocks: Python that does not compile or imports what does
    not exist, JSON or TOML that does not parse."""
    errors = []
    for page in pages:
        text = page.read_text()
        for number, code in enumerate(code_blocks(text, "python", "py"), start=1):
            errors += python_block_errors(code, f"{page.name}, python block {number}")
        for number, code in enumerate(code_blocks(text, "json"), start=1):
            try:
                json.loads(code)
            except json.JSONDecodeError as error:
                errors.append(f"{page.name}, json block {number}: {error}")
        for number, code in enumerate(code_blocks(text, "toml"), start=1):
            try:
                tomllib.loads(code)
            except tomllib.TOMLDecodeError as error:
                errors.append(f"{page.name}, toml block {number}: {error}")
    return errors


NOT_IN_A_NAME = re.compile(r"\W")
#: mypy over the blocks: fragments may leave names to the reader and bodies to ``...``.
BLOCK_MYPY_OPTIONS = ("--config-file", "", "--ignore-missing-imports", "--follow-imports=silent",
                      "--disable-error-code=name-defined", "--disable-error-code=empty-body",
                      "--no-error-summary", "--python-version", "3.11")


def type_errors(pages: Iterable[Path], workdir: Path) -> list[str]:
    """mypy's errors in the pages' Python blocks, each block a module of its own (named by its
    page and number)."""
    files = []
    for page in pages:
        for number, code in enumerate(code_blocks(page.read_text(), "python", "py"), start=1):
            block = workdir / f"{NOT_IN_A_NAME.sub('_', page.stem)}_block_{number}.py"
            block.write_text(code)
            files.append(str(block))
    if not files:
        return []
    report, _, _ = mypy.run([*files, *BLOCK_MYPY_OPTIONS, "--cache-dir", str(workdir / ".cache")])
    return [line for line in report.splitlines() if ": error: " in line]


def test_the_front_page_names_and_links_every_prebuilt_sink() -> None:
    sinks = prebuilt_sinks()
    assert {"sqlite", "mysql", "postgres", "s3", "kafka", "http"} <= set(sinks)
    assert unnamed_sinks(README.read_text(), sinks) == []


def test_every_prebuilt_sink_has_a_page_showing_its_phase_table() -> None:
    assert pages_without_phases(prebuilt_sinks()) == []


def test_the_kit_table_lists_exactly_the_kit_exports() -> None:
    missing, unknown = kit_table_errors(WRITING_A_SINK.read_text(), twophase.kit.__all__)
    assert missing == [], f"twophase.kit exports these, {WRITING_A_SINK.name}'s kit table " \
                          f"omits them: {missing}"
    assert unknown == [], f"{WRITING_A_SINK.name}'s kit table lists these, twophase.kit does " \
                          f"not export them: {unknown}"


def test_each_kit_family_table_lists_exactly_the_family_exports() -> None:
    page = WRITING_A_SINK.read_text()
    for module, heading in FAMILIES.items():
        exports = importlib.import_module(module).__all__
        missing, unknown = kit_table_errors(page, exports, heading)
        assert (missing, unknown) == ([], []), (
            f"{module} exports what {WRITING_A_SINK.name}'s table omits: {missing}; the table "
            f"lists what it does not export: {unknown}")


def test_the_testing_table_lists_exactly_the_testing_exports() -> None:
    missing, unknown = kit_table_errors(VERSIONING.read_text(), twophase.testing.__all__,
                                        TESTING_HEADING)
    assert (missing, unknown) == ([], []), (
        f"twophase.testing exports what the docs' table omits: {missing}; the table lists "
        f"what it does not export: {unknown}")


def test_deprecated_shims_are_no_api_but_the_docs_and_changelog_name_them() -> None:
    versioning, changelog = VERSIONING.read_text(), CHANGELOG.read_text()
    deprecated = " ".join(table_rows(versioning, DEPRECATED_HEADING))
    for module, name in SHIMS:
        assert hasattr(module, name), f"{module.__name__}.{name}: the shim is gone"
        assert name not in module.__all__, f"{module.__name__}.__all__ names the shim {name}"
        assert f"`{module.__name__}.{name}`" in deprecated, name
        assert f"`{module.__name__}.{name}`" in changelog, name
    assert "`sink` fixture" in deprecated and "`sink` fixture" in changelog
    assert hasattr(twophase.testing.contract, "SINK_FIXTURE_DEPRECATED")


def test_the_version_is_one_and_the_changelog_pins_every_release() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert twophase.__version__ == version
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", CHANGELOG.read_text(), re.MULTILINE)
    assert releases[0] == version, "CHANGELOG.md's newest release is not this version"
    for release in releases:
        link = re.search(rf"^\[{re.escape(release)}\]: .*\b([0-9a-f]{{40}})\b",
                         CHANGELOG.read_text(), re.MULTILINE)
        assert link or release == version, f"CHANGELOG.md pins {release} to no commit"


def test_every_code_block_of_the_docs_compiles_and_imports_what_exists() -> None:
    pages = doc_pages()
    assert sum(len(code_blocks(page.read_text(), "python")) for page in pages) >= 10
    assert block_errors(pages) == []


def test_every_python_block_of_the_docs_type_checks(tmp_path: Path) -> None:
    assert type_errors(doc_pages(), tmp_path) == []


def test_the_type_check_refuses_a_planted_fault(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "```python\nfrom sinks.sqlite import SQLiteSink\n\nsink = SQLiteSink('a.db', 'orders')\n"
        "query = write_stream(df, sink)  # names left to the reader\n```\n")
    (tmp_path / "docs" / "bad.md").write_text(
        "```python\nfrom sinks.sqlite import SQLiteSink\n\n"
        "sink = SQLiteSink('a.db', 'orders', chunk_size='many')\n```\n")
    errors = type_errors(doc_pages(tmp_path), tmp_path)
    assert len(errors) == 1 and "bad_block_1.py" in errors[0] and "chunk_size" in errors[0], \
        errors


def test_the_checks_refuse_a_missing_name() -> None:
    readme, writing = README.read_text(), WRITING_A_SINK.read_text()
    assert unnamed_sinks(readme, [*prebuilt_sinks(), "nosuchsink"]) == ["nosuchsink"]
    assert pages_without_phases([*prebuilt_sinks(), "nosuchsink"]) == ["nosuchsink"]
    assert kit_table_errors(writing, [*twophase.kit.__all__, "NoSuchExport"]) == (
        ["NoSuchExport"], [])
    text = (f"{PREBUILT_HEADING}\n\n| [`sinks.a.A`](docs/sinks/a.md) | `sinks.b.B` |\n\n"
            f"## Next\n\n[`sinks.c.C`](docs/sinks/c.md)\n\n"
            f"{KIT_HEADING}:\n\n| piece | what |\n|---|---|\n| `x`, `y` | `not_z` |\n"
            "| `w` | w |\n\n| `after` | the table |\n")
    assert unnamed_sinks(text, ["a", "b", "c"]) == ["b", "c"]
    assert kit_table(text) == ["x", "y", "w"]
    assert kit_table_errors(text, ["w", "x", "y"]) == ([], [])
    assert kit_table_errors(text, ["w", "x", "y", "z"]) == (["z"], [])
    assert kit_table_errors(text, ["w", "x"]) == ([], ["y"])
    assert kit_table_errors(VERSIONING.read_text(), [*twophase.testing.__all__, "Nope"],
                            TESTING_HEADING) == (["Nope"], [])


def test_the_block_check_refuses_a_planted_fault(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "```python\nfrom twophase import Secret\nfrom twophase.spark import write_stream\n```\n")
    (tmp_path / "docs" / "bad.md").write_text(
        "```python\nfrom twophase import NoSuchName\n```\n\n"
        "```python\nimport sinks.no_such_sink\n```\n\n"
        "```python\nsink = MySQLXASink(host=\"db\"\n```\n\n"
        "```python\nreturn 1\n```\n\n"
        "```json\n{\"Version\": }\n```\n\n"
        "```toml\n[target\n```\n\n"
        "```python\nfrom pyspark.sql import NotChecked\n```\n")
    errors = block_errors(doc_pages(tmp_path))
    assert [error.split(":")[0] for error in errors] == [
        "bad.md, python block 1", "bad.md, python block 2", "bad.md, python block 3",
        "bad.md, python block 4", "bad.md, json block 1", "bad.md, toml block 1"], errors
    assert "twophase has no NoSuchName" in errors[0]
    assert "'return' outside function" in errors[3]
