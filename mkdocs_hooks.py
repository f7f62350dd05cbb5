"""MkDocs hooks of the docs site (``mkdocs.yml``'s ``hooks:``).

A sink's table of phases ("what a crash at each one leaves behind") is written once, in its
``sink`` module's docstring, as a reStructuredText simple table. A page shows it with a line of
its own, ``<!-- phases: sinks/mysql/sink.py -->``: the hook replaces that line with the table
as Markdown, read from the module's source (nothing is imported). A marker naming a module
without such a table fails the build.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).parent
MARKER = re.compile(r"^<!-- phases: (\S+) -->$", re.MULTILINE)
RULE = re.compile(r"^=+(?: +=+)+$")
ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def spans(rule: str) -> list[tuple[int, int | None]]:
    """The columns of a simple table, from its rule of ``=``: (start, end), the last open."""
    found = [(m.start(), m.end()) for m in re.finditer(r"=+", rule)]
    return [(start, end) for start, end in found[:-1]] + [(found[-1][0], None)]


def inline(text: str) -> str:
    """reStructuredText's inline markup as Markdown: ``code``, roles as code, ``|`` escaped."""
    text = ROLE.sub(lambda m: f"`{m.group(1).rsplit('.', 1)[-1]}`", text)
    return text.replace("``", "`").replace("|", "\\|")


def cells(line: str, columns: list[tuple[int, int | None]]) -> list[str]:
    return [line[start:end].strip() for start, end in columns]


def phase_table(docstring: str) -> str:
    """The docstring's simple table whose header begins with ``phase``, as a Markdown table."""
    lines = docstring.splitlines()
    rules = [i for i, line in enumerate(lines) if RULE.match(line)]
    for first, header_end, last in zip(rules, rules[1:], rules[2:], strict=False):
        header = lines[first + 1:header_end]
        if not header or not header[0].startswith("phase"):
            continue
        columns = spans(lines[first])
        rows: list[list[str]] = []
        for line in [*header, None, *lines[header_end + 1:last]]:
            if line is None:  # the header ends: the body's rows begin
                rows.append([])
                continue
            parts = cells(line, columns)
            if not rows or not rows[-1] or parts[0]:
                if rows and not rows[-1]:
                    rows.pop()
                rows.append(parts)
            else:
                rows[-1] = [f"{had} {part}".strip() for had, part in zip(rows[-1], parts,
                                                                         strict=True)]
        head, *body = rows
        out = ["| " + " | ".join(inline(cell) for cell in head) + " |",
               "|" + "---|" * len(head)]
        out += ["| " + " | ".join(inline(cell) for cell in row) + " |" for row in body]
        return "\n".join(out)
    raise ValueError("no table whose header begins with 'phase'")


def module_phase_table(path: str) -> str:
    """The phase table of the module at ``path`` (relative to the repository)."""
    source = ROOT / path
    docstring = ast.get_docstring(ast.parse(source.read_text()), clean=True) or ""
    return phase_table(docstring)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    def table(match: re.Match[str]) -> str:
        try:
            return module_phase_table(match.group(1))
        except (OSError, ValueError) as error:
            raise PluginError(f"{page.file.src_path}: phases of {match.group(1)}: {error}"
                              ) from error
    return MARKER.sub(table, markdown)
