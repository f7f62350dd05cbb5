"""README.md keeps up with the code: it names every prebuilt sink, its tables of
``twophase.kit`` and ``twophase.testing`` list exactly what each exports (their ``__all__`` is
the public API), and the deprecated shims stay out of ``__all__`` while README and CHANGELOG.md
name them; the version is one in pyproject.toml, ``twophase.__version__`` and CHANGELOG.md.

Both checks read the README as text; the sinks are found on disk (a package ``sinks/<name>/``
or a module ``sinks/<name>.py``), the kit's exports are its ``__all__``.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable

import twophase
import twophase.kit
import twophase.testing
import twophase.testing.contract
import twophase.testing.crash
from tests import REPO
from tests.repo.test_guarantees import table_rows

README = REPO / "README.md"
SINKS = REPO / "sinks"
PREBUILT_HEADING = "Prebuilt sinks"
KIT_HEADING = "What every sink repeats comes from `twophase.kit`"
TESTING_HEADING = "What `twophase.testing` exports"
DEPRECATED_HEADING = "Deprecated, working with a warning until"
CHANGELOG = REPO / "CHANGELOG.md"
#: The deprecated shims: where they live and their name (kept out of ``__all__``).
SHIMS = [(twophase.kit, "CommitsViaCommitter"), (twophase.testing.crash, "SinkTarget")]
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


def kit_table(readme: str, heading: str = KIT_HEADING) -> list[str]:
    """The names in the first column of the README's table of the kit (or under ``heading``)."""
    return [name for row in table_rows(readme, heading)
            for name in CODE.findall(row.split("|")[1])]


def kit_table_errors(readme: str, exports: Iterable[str], heading: str = KIT_HEADING
                     ) -> tuple[list[str], list[str]]:
    """The exports the kit table (or the one under ``heading``) leaves out, and the names it
    lists that are no exports."""
    listed, exported = kit_table(readme, heading), list(exports)
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


def test_the_readme_testing_table_lists_exactly_the_testing_exports() -> None:
    missing, unknown = kit_table_errors(README.read_text(), twophase.testing.__all__,
                                        TESTING_HEADING)
    assert (missing, unknown) == ([], []), (
        f"twophase.testing exports what README's table omits: {missing}; README lists what it "
        f"does not export: {unknown}")


def test_deprecated_shims_are_no_api_but_readme_and_changelog_name_them() -> None:
    readme, changelog = README.read_text(), CHANGELOG.read_text()
    deprecated = " ".join(table_rows(readme, DEPRECATED_HEADING))
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
    assert kit_table_errors(readme, [*twophase.testing.__all__, "Nope"], TESTING_HEADING) == (
        ["Nope"], [])
