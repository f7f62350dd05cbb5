"""twophase shipped with a job, as users ship it to executors that do not have it.

* :func:`twophase_py_file`: the twophase wheel (``pip wheel --no-deps``, twophase and the
  sinks, built from a copy of the source tree) under a ``.zip`` name, for ``--py-files`` /
  ``spark.submit.pyFiles`` / ``SparkContext.addPyFile``: Spark puts only ``.zip``, ``.egg``
  and ``.jar`` files on the executors' path, and a wheel is a zip with the packages at its
  root; its ``.dist-info`` tells the start's check (:mod:`twophase._preflight`) its version.
* :func:`packed_environment`: a ``.tar.gz`` for ``spark.archives`` of a ``site-packages``
  directory with twophase and compiled client libraries (say psycopg's binary build) at the
  driver's versions, installed from pip's cache; on the executors' path by
  ``spark.executorEnv.PYTHONPATH`` (:data:`ARCHIVE_CONF`).
* :func:`sqlite_after_add_py_file`: a sink factory for a notebook-style driver, whose session
  exists before the sink: it ships the py file with ``addPyFile``, then builds the sink.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from sinks.sqlite import SQLiteSink

SOURCE_TREE = Path(__file__).resolve().parents[1]
#: What building the wheel reads of the source tree.
WHEEL_SOURCES = ("pyproject.toml", "README.md", "twophase", "sinks")
PIP_TIMEOUT_S = 300.0
#: The PostgreSQL sink's client: psycopg, its binary build and its one dependency here.
POSTGRES_CLIENT = ("psycopg", "psycopg-binary", "typing-extensions")
ARCHIVE_NAME = "environment"
#: What a driver sets to ship :func:`packed_environment`'s archive (the ``{archive}``).
ARCHIVE_CONF = {"spark.archives": "{archive}#" + ARCHIVE_NAME,
                "spark.executorEnv.PYTHONPATH": f"{ARCHIVE_NAME}/site-packages"}


def twophase_py_file(scratch: Path) -> Path:
    """The twophase wheel, built under ``scratch``, copied to a ``.zip`` name."""
    tree = scratch / "source"
    tree.mkdir(parents=True)
    for name in WHEEL_SOURCES:
        source = SOURCE_TREE / name
        if source.is_dir():
            shutil.copytree(source, tree / name,
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, tree / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--wheel-dir", str(scratch), str(tree)], check=True, timeout=PIP_TIMEOUT_S)
    wheel = next(scratch.glob("twophase-*.whl"))
    return Path(shutil.copy(wheel, wheel.with_suffix(".zip")))


def packed_environment(scratch: Path, py_file: Path, distributions: Sequence[str]) -> Path:
    """A ``.tar.gz`` under ``scratch`` of ``site-packages/``: the wheel beside ``py_file``
    and ``distributions`` at the driver's versions (no other dependency)."""
    site = scratch / "packed" / "site-packages"
    pinned = [f"{name}=={importlib.metadata.version(name)}" for name in distributions]
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--target", str(site), str(py_file.with_suffix(".whl")), *pinned],
                   check=True, timeout=PIP_TIMEOUT_S)
    archive = scratch / f"{ARCHIVE_NAME}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(site, arcname=site.name)
    return archive


def sqlite_after_add_py_file(py_file: str, **options: Any) -> SQLiteSink:
    """A :class:`SQLiteSink` of ``options``; first, in a driver whose Spark session is up,
    ``addPyFile(py_file)`` (in a process without a session, as a test reading the target,
    the sink only)."""
    spark = SparkSession.getActiveSession()
    if spark is not None:
        spark.sparkContext.addPyFile(py_file)
    return SQLiteSink(**options)
