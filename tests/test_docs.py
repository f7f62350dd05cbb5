"""README.md keeps up with the code: it names every prebuilt sink, and its table of
``twophase.kit`` lists exactly what the kit exports.

Both checks read the README as text; the sinks are found on disk (a package ``sinks/<name>/``
or a module ``sinks/<name>.py``), the kit's exports are its ``__all__``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import twophase.kit
from tests.test_guarantees import table_rows

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
SINKS = REPO / "sinks"
PREBUILT_HEADING = "Prebuilt sinks"
KIT_HEADING = "What every sink repeats comes from `twophase.kit`"
CODE = re.compile(r"`([A-Za-z_]\w*)`")


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


def unnamed_sinks(readme: str, sinks: Iterable[str]) -> list[str]:
    """The sinks the README's "Prebuilt sinks" paragraph does not name as ``sinks.<name>.``."""
    prebuilt = paragraph(readme, PREBUILT_HEADING)
    return [name for name in sinks if f"`sinks.{name}." not in prebuilt]


def kit_table(readme: str) -> list[str]:
    """The names in the first column of the README's table of the kit."""
    return [name for row in table_rows(readme, KIT_HEADING)
            for name in CODE.findall(row.split("|")[1])]


def kit_table_errors(readme: str, exports: Iterable[str]) -> tuple[list[str], list[str]]:
    """The exports the kit table leaves out, and the names it lists that are no exports."""
    listed, exported = kit_table(readme), list(exports)
    return ([name for name in exported if name not in listed],
            [name for name in listed if name not in exported])


def test_the_readme_names_every_prebuilt_sink() -> None:
    sinks = prebuilt_sinks()
    assert {"sqlite", "mysql", "postgres", "s3", "kafka", "http"} <= set(sinks)
    assert unnamed_sinks(README.read_text(), sinks) == []


def test_the_readme_kit_table_lists_exactly_the_kit_exports() -> None:
    missing, unknown = kit_table_errors(README.read_text(), twophase.kit.__all__)
    assert missing == [], f"twophase.kit exports these, README's kit table omits them: {missing}"
    assert unknown == [], f"README's kit table lists these, twophase.kit does not export them: " \
                          f"{unknown}"


def test_the_checks_refuse_a_missing_name() -> None:
    readme = README.read_text()
    assert unnamed_sinks(readme, [*prebuilt_sinks(), "nosuchsink"]) == ["nosuchsink"]
    assert kit_table_errors(readme, [*twophase.kit.__all__, "NoSuchExport"]) == (
        ["NoSuchExport"], [])
    text = (f"{PREBUILT_HEADING}: `sinks.a.A` and `sinks.b.B`.\n\nNot `sinks.c.C`.\n\n"
            f"{KIT_HEADING}:\n\n| piece | what |\n|---|---|\n| `x`, `y` | `not_z` |\n"
            "| `w` | w |\n\n| `after` | the table |\n")
    assert unnamed_sinks(text, ["a", "b", "c"]) == ["c"]
    assert kit_table(text) == ["x", "y", "w"]
    assert kit_table_errors(text, ["w", "x", "y"]) == ([], [])
    assert kit_table_errors(text, ["w", "x", "y", "z"]) == (["z"], [])
    assert kit_table_errors(text, ["w", "x"]) == ([], ["y"])
