"""Spark's reused Python workers: the long-lived heap is kept out of their per-task collections
and an unchanged archive on their path is not read again before every task
(``twophase._workers``), in a process of their kind and only there."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from twophase._workers import (
    FREEZE_AT_UNIT,
    SPARK_REUSE_WORKER_ENV,
    WORKER_TUNING_ENV,
)

#: Units of work as a reused worker runs them: each followed by the daemon's full collection.
_UNITS_OF_WORK = """
import gc, sys
import pyarrow, boto3  # what a worker holds: Spark's Arrow reader, a sink's client library
from twophase._workers import keep_out_of_worker_collections
frozen = []
for _ in range(int(sys.argv[1])):
    keep_out_of_worker_collections()
    gc.collect()  # what pyspark.daemon does after every task of a reused worker
    frozen.append(gc.get_freeze_count())
print(*frozen, len(gc.get_objects()))
"""


def units_of_work(units: int, *, reused: bool) -> tuple[list[int], int]:
    """The freeze count after each unit, and the objects a collection still walks at the end."""
    env = {key: value for key, value in os.environ.items() if key != SPARK_REUSE_WORKER_ENV}
    if reused:
        env[SPARK_REUSE_WORKER_ENV] = "1"
    run = subprocess.run([sys.executable, "-c", _UNITS_OF_WORK, str(units)], env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    *frozen, walked = (int(n) for n in run.stdout.split())
    return frozen, walked


def test_a_reused_worker_freezes_its_heap_once_at_its_second_unit_of_work() -> None:
    frozen, walked = units_of_work(4, reused=True)
    assert frozen[:FREEZE_AT_UNIT - 1] == [0] * (FREEZE_AT_UNIT - 1)
    assert frozen[FREEZE_AT_UNIT - 1] > 20 * walked  # modules and clients: out of collections
    assert len(set(frozen[FREEZE_AT_UNIT - 1:])) == 1  # once, never again


@pytest.mark.parametrize("units", [1, 4])
def test_any_other_process_keeps_its_heap_as_it_is(units: int) -> None:
    frozen, walked = units_of_work(units, reused=False)
    assert set(frozen) == {0}
    assert walked > 10_000


#: A worker's tasks as PySpark 4.1 runs them (``importlib.invalidate_caches()`` before each),
#: with a zip archive on the path: how often the archive's directory is read, and whether a
#: module added to the archive between tasks is then found.
_TASKS_WITH_A_ZIP_ON_THE_PATH = """
import importlib, sys, zipfile, zipimport
from twophase._workers import keep_out_of_worker_collections
archive = sys.argv[1]
sys.path.insert(0, archive)
import first_module  # the archive's directory, read once on import
reads = []
read_directory = zipimport._read_directory
def counted(path):
    reads.append(path)
    return read_directory(path)
zipimport._read_directory = counted
for task in range(5):
    importlib.invalidate_caches()  # what PySpark 4.1's worker does before every task
    keep_out_of_worker_collections()
with zipfile.ZipFile(archive, "a") as zf:  # the archive changes: it must be read again
    zf.writestr("second_module.py", "VALUE = 2")
importlib.invalidate_caches()
import second_module
print(len(reads), second_module.VALUE)
"""


@pytest.mark.parametrize("reused", [True, False], ids=["reused-worker", "other-process"])
def test_a_reused_worker_reads_an_unchanged_archive_on_its_path_once(
        tmp_path: Path, reused: bool) -> None:
    archive = tmp_path / "includes.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("first_module.py", "VALUE = 1")
    env = {key: value for key, value in os.environ.items() if key != SPARK_REUSE_WORKER_ENV}
    if reused:
        env[SPARK_REUSE_WORKER_ENV] = "1"
    run = subprocess.run([sys.executable, "-c", _TASKS_WITH_A_ZIP_ON_THE_PATH, str(archive)],
                         env=env, capture_output=True, text=True, timeout=120, check=True)
    reads, found = (int(n) for n in run.stdout.split())
    assert found == 2  # a changed archive is read again: its new module imports
    # reused: the first two tasks' reads (before the first unit of work, and the first the
    # importer makes itself), then only the changed archive's; anywhere else one per task
    assert reads == (3 if reused else 6)


#: A reused worker's units of work with the tuning turned off (by the run's setting, shipped in
#: its config: ``sys.argv[1] == "run"``; or by the worker's own environment): what is frozen,
#: and whether the zip importers' cache invalidation is still zipimport's own.
_UNITS_OF_WORK_TUNED_OFF = """
import gc, sys, zipimport
original = zipimport.zipimporter.invalidate_caches
from twophase._workers import keep_out_of_worker_collections
frozen = []
for _ in range(4):
    keep_out_of_worker_collections(tuning=sys.argv[1] != "run")
    gc.collect()
    frozen.append(gc.get_freeze_count())
print(*frozen, zipimport.zipimporter.invalidate_caches is original)
"""


@pytest.mark.parametrize("off", ["run", "0", "false", "OFF"],
                         ids=["the-run-s-setting", "env-0", "env-false", "env-OFF"])
def test_the_opt_out_leaves_a_reused_worker_s_collections_and_zip_importers_untouched(
        off: str) -> None:
    env = {key: value for key, value in os.environ.items() if key != WORKER_TUNING_ENV}
    env[SPARK_REUSE_WORKER_ENV] = "1"
    if off != "run":
        env[WORKER_TUNING_ENV] = off
    run = subprocess.run([sys.executable, "-c", _UNITS_OF_WORK_TUNED_OFF, off], env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    *frozen, untouched = run.stdout.split()
    assert frozen == ["0"] * 4
    assert untouched == "True"
