"""The test drivers' JVM options (twophase.testing.jvm): C1 only, plus the class data sharing
archive where one exists for this PySpark and this JDK; off by TWOPHASE_CDS=0; a machine where
making it failed once does not try again for every driver. (The archive itself is made and
used by every Spark test of the run.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from twophase.testing import jvm


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(jvm.CDS_ENV, raising=False)
    return tmp_path


def test_an_existing_archive_is_given_to_the_driver(cache: Path) -> None:
    archive = jvm.archive_path()
    assert archive is not None and archive.is_relative_to(cache)
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"")
    options = jvm.java_options().split()
    assert options[0] == jvm.C1_ONLY
    assert f"-XX:SharedArchiveFile={archive}" in options


def test_off_the_driver_gets_c1_only_and_nothing_is_made(cache: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(jvm.CDS_ENV, "0")
    assert jvm.ensure_archive() is None
    assert jvm.java_options() == jvm.C1_ONLY
    assert not (cache / "twophase").exists()


def test_after_a_failed_making_it_is_not_tried_again(cache: Path) -> None:
    archive = jvm.archive_path()
    assert archive is not None
    archive.parent.mkdir(parents=True)
    archive.with_suffix(".failed").touch()
    assert jvm.ensure_archive() is None
    assert jvm.java_options() == jvm.C1_ONLY
    assert not archive.exists()


def test_without_an_archive_a_driver_starts_without_waiting_for_one(cache: Path) -> None:
    assert jvm.java_options() == jvm.C1_ONLY
    assert not (cache / "twophase").exists()


def test_the_archive_is_named_by_the_pyspark_version_and_the_java_binary(
        cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    first = jvm.archive_path()
    other_java = tmp_path / "jdk" / "bin" / "java"
    other_java.parent.mkdir(parents=True)
    other_java.write_text("#!/bin/sh\n")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    second = jvm.archive_path()
    assert first is not None and second is not None and first != second
