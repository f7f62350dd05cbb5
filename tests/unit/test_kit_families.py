"""The kit by family: ``twophase.kit`` (the core, what every sink needs) and
``twophase.kit.sql``, ``.s3`` and ``.lake`` (what one family of sinks shares). Each name of the
flat kit lives in exactly one of them; a name that moved to a family still imports from
``twophase.kit`` until 0.6.0, the same object, with a :class:`DeprecationWarning` naming its
new home, and stays out of ``twophase.kit.__all__``."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import twophase.kit
import twophase.kit.lake
import twophase.kit.s3
import twophase.kit.sql
from tests import REPO

#: ``twophase.kit.__all__`` before the split (0.4.0's 59 names and the 16 added while 0.5.0 was
#: unreleased): one flat module.
FLAT_KIT = frozenset({
    "DEFAULT_CHUNK_SIZE", "DEFAULT_COMMIT_PARALLELISM", "DEFAULT_MAX_FILE_BYTES",
    "DEFAULT_S3_MAX_ATTEMPTS", "DEFAULT_TOMBSTONE_RETENTION_S", "DELETED_FLAG", "FIX_LAKE_DISK",
    "FIX_LAKE_RETRY", "FIX_LAKE_VALUES", "INSTANT_TYPE", "INTENTS_DIRECTORY", "KEYED",
    "LAKE_FILE_CONDITIONS", "LAKE_FILE_RULES", "LAKE_S3_PERMISSIONS", "MODES", "S3_OPTIONS",
    "TOMBSTONE_TIME_COLUMN", "Change", "ClientCache", "Condition", "ConnectionPool",
    "Credentials", "ErrorTable", "Keyed", "LakeCleanup", "LakeCommitter", "LakeFileRecord",
    "LakeFileStat", "LakeFileWriter", "LakeFiles", "LakeIntents", "LakeOutput", "LakeSink",
    "LakeStorage", "LakeTransaction", "LocalCommitMember", "Mode", "PooledCommitter",
    "S3Checksums", "S3Errors", "S3Settings", "Secret", "SecretOption", "TableColumn",
    "WholeBatchCommitter", "as_utc", "boto_errors", "check_columns", "chunks", "classified",
    "conform_table", "is_delete", "keyed_apply_statements", "lake_classifier", "lake_deadline",
    "lake_iam_policy", "lake_storage", "namespace_from", "newer_than", "qualified_namespace",
    "query_key", "retried_if_rotated", "reveal", "rows_of", "scrubbed", "split_s3_location",
    "tombstone_table_name", "transaction_id_reused", "transaction_lost", "validate_chunk_size",
    "validate_keyed", "validate_max_file_bytes", "validate_mode", "validate_namespace",
})
FAMILIES: dict[str, ModuleType] = {module.__name__: module for module in (
    twophase.kit.sql, twophase.kit.s3, twophase.kit.lake)}
KIT: dict[str, ModuleType] = {"twophase.kit": twophase.kit, **FAMILIES}
#: What moved, from the families themselves (the names of the flat kit they export).
MOVED = {name: family for family, module in FAMILIES.items() for name in module.__all__
         if name in FLAT_KIT}
#: What a family gained since the split: never in the flat kit, so never taken from it.
GAINED = {"twophase.kit.sql": {"ConnectionOption", "ConnectionSettings", "ConnectionUrl",
                               "UrlPassword"},
          # issue 49: a lake table's keyed mode
          "twophase.kit.lake": {"APPEND", "LAKE_MODES", "STAGED_DIRECTORY", "BatchPlan",
                                "LakeTombstones", "StagedFile", "keys_of", "plan_batch",
                                "proof_key", "validate_lake_mode"}}
#: A name a docstring table mentions (``:class:`~twophase.kit.LakeSink``` counts as ``LakeSink``
#: only if undotted: ``:meth:`Keyed.reduce``` and ``:mod:`twophase._keyed``` do not).
ROLE = re.compile(r":(?:func|class|data|meth|mod|attr):`~?([\w.]+)`")
#: Where the repository's own code lives: none of it takes a moved name from the flat kit.
CODE = ("twophase", "sinks", "setups", "tests", "bench", "chaos", "examples")


@pytest.mark.parametrize("module", KIT.values(), ids=list(KIT))
def test_every_name_a_kit_module_exports_resolves(module: ModuleType) -> None:
    assert len(module.__all__) == len(set(module.__all__)), module.__name__
    assert [name for name in module.__all__ if not hasattr(module, name)] == []


def test_the_families_are_disjoint_and_with_the_core_hold_the_flat_kit() -> None:
    """Every flat name is in one place: a family (5 + 7 + 25 of them) or the core (the other
    38, and what the core gained since the split, such as the TLS options)."""
    exports = [name for module in KIT.values() for name in module.__all__]
    assert len(exports) == len(set(exports)), "a name is exported by two kit modules"
    assert FLAT_KIT - set(exports) == set()
    assert {name: len(set(module.__all__) & FLAT_KIT) for name, module in FAMILIES.items()} == {
        "twophase.kit.sql": 5, "twophase.kit.s3": 7, "twophase.kit.lake": 25}
    assert {name: set(module.__all__) - FLAT_KIT for name, module in FAMILIES.items()
            if set(module.__all__) - FLAT_KIT} == GAINED
    assert len(FLAT_KIT & set(twophase.kit.__all__)) == 38


def test_what_a_family_gained_since_the_split_is_its_own() -> None:
    for family, names in GAINED.items():
        for name in names:
            assert hasattr(importlib.import_module(family), name)
            with pytest.raises(AttributeError, match=name):
                getattr(twophase.kit, name)


def test_the_core_exports_no_moved_name_and_knows_each_ones_new_home() -> None:
    assert set(twophase.kit.__all__) & set(MOVED) == set()
    assert dict(twophase.kit.MOVED) == MOVED


@pytest.mark.parametrize("name", sorted(MOVED))
def test_a_moved_name_still_comes_from_the_flat_kit_with_a_warning_naming_its_home(
        name: str) -> None:
    home = MOVED[name]
    with pytest.warns(DeprecationWarning) as caught:
        flat = getattr(twophase.kit, name)
    assert flat is getattr(importlib.import_module(home), name)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert f"{home}.{name}" in message and "0.6.0" in message, message
    assert caught[0].filename == __file__


def test_importing_a_moved_name_warns_once_at_the_import_statement() -> None:
    with pytest.warns(DeprecationWarning) as caught:
        from twophase.kit import LakeSink, S3Settings  # noqa: PLC0415
    assert sorted(str(warning.message).split(":")[0] for warning in caught) == [
        "twophase.kit.LakeSink is deprecated since 0.5.0 and is removed in 0.6.0",
        "twophase.kit.S3Settings is deprecated since 0.5.0 and is removed in 0.6.0"]
    assert {warning.filename for warning in caught} == {__file__}
    assert (LakeSink, S3Settings) == (twophase.kit.lake.LakeSink, twophase.kit.s3.S3Settings)


def test_an_unknown_name_of_the_kit_is_still_an_error() -> None:
    with pytest.raises(AttributeError, match="NoSuchPiece"):
        getattr(twophase.kit, "NoSuchPiece")  # noqa: B009
    with pytest.raises(ImportError, match="NoSuchPiece"):
        from twophase.kit import NoSuchPiece  # noqa: F401, PLC0415


def first_table(docstring: str) -> str:
    """The first ``====`` table of a docstring: from its top rule to its bottom rule."""
    rules = [match.start() for match in re.finditer(r"^=+ +=+$", docstring, re.MULTILINE)]
    assert len(rules) >= 3, "no table"
    return docstring[rules[0]:rules[2]]


@pytest.mark.parametrize("module", KIT.values(), ids=list(KIT))
def test_each_kit_modules_docstring_table_names_exactly_its_exports(module: ModuleType) -> None:
    assert module.__doc__ is not None
    named = {name for name in ROLE.findall(first_table(module.__doc__)) if "." not in name}
    assert named == set(module.__all__)


def test_the_core_imports_no_family_and_every_kit_module_imports_without_a_warning() -> None:
    script = ("import sys, twophase.kit\n"
              "print(sorted(m for m in sys.modules if m.startswith('twophase.kit.')))\n"
              "import twophase.kit.lake, twophase.kit.s3, twophase.kit.sql\n")
    done = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", script],
                          capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.split() == ["[]"]


def flat_imports_of_moved_names(paths: list[str]) -> set[str]:
    """``from twophase.kit import X`` of a moved ``X`` in ``paths`` (directories of the repo),
    but for this module's own."""
    found: set[str] = set()
    for root in paths:
        for path in sorted((REPO / root).rglob("*.py")):
            if path == Path(__file__).resolve():
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.ImportFrom) and node.module == "twophase.kit" \
                        and node.level == 0:
                    found.update(f"{path.relative_to(REPO)}:{node.lineno}: {alias.name}"
                                 for alias in node.names if alias.name in MOVED)
    return found


def test_the_repository_takes_no_moved_name_from_the_flat_kit() -> None:
    assert flat_imports_of_moved_names(list(CODE)) == set()
