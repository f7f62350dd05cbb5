"""twophase shipped with a job, as users ship it to executors that do not have it.

* :func:`twophase_py_file`: the twophase wheel (``pip wheel --no-deps``, twophase and the
  sinks, built from a copy of the source tree) under a ``.zip`` name, for ``--py-files`` /
  ``spark.submit.pyFiles`` / ``SparkContext.addPyFile`` / Spark Connect's
  ``addArtifacts(pyfile=True)``: Spark puts only ``.zip``, ``.egg`` and ``.jar`` files on the
  executors' path, and a wheel is a zip with the packages at its root; its ``.dist-info``
  tells the start's check (:mod:`twophase._preflight`) its version.
* :func:`installed_py_file`: a pure-Python client library as the driver has it installed (say
  PyMySQL), its files and ``.dist-info`` in a ``.zip``, shipped beside the wheel the same way.
* :func:`packed_environment`: a ``.tar.gz`` for ``spark.archives`` of a ``site-packages``
  directory with twophase and compiled client libraries (say psycopg's binary build) at the
  driver's versions, installed from pip's cache; on the executors' path by
  ``spark.executorEnv.PYTHONPATH`` (:data:`ON_EXECUTORS_PATH`).
* :func:`packed_virtualenv`: a virtualenv with pyarrow, twophase and such clients packed by
  venv-pack, for ``spark.archives`` as the executors' own Python
  (``PYSPARK_PYTHON=./environment/bin/python``, :data:`PACKED_PYTHON`), as on EMR, Dataproc
  or YARN; :func:`unpack` it where a driver's own Python workers start.
* :func:`sqlite_after_shipping_py_file`: a sink factory for a notebook-style driver, whose
  session exists before the sink: it ships the py file with that session, then builds the
  sink.
* :class:`BareConnectServer`: a Spark Connect server whose Python workers run a given Python
  (a bare one: twophase reaches them only as its clients ship it).
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from setups.servers.connect import ConnectServer
from sinks.sqlite import SQLiteSink

SOURCE_TREE = Path(__file__).resolve().parents[1]
#: What building the wheel reads of the source tree.
WHEEL_SOURCES = ("pyproject.toml", "README.md", "twophase", "sinks")
PIP_TIMEOUT_S = 300.0
#: The PostgreSQL sink's client: psycopg, its binary build and its one dependency here.
POSTGRES_CLIENT = ("psycopg", "psycopg-binary", "typing-extensions")
ARCHIVE_NAME = "environment"
CONNECT_MODULE = "pyspark.sql.connect."  # where a Spark Connect session's class lives
#: What puts :func:`packed_environment`'s archive, shipped by :func:`archives_conf`, on the
#: executors' path (relative to their working directory, where Spark unpacks it).
ON_EXECUTORS_PATH = {"spark.executorEnv.PYTHONPATH": f"{ARCHIVE_NAME}/site-packages"}
#: The Python of :func:`packed_virtualenv`'s archive shipped as ``#environment``, from the
#: working directory of an executor (where Spark unpacks it) or of a driver.
PACKED_PYTHON = f"./{ARCHIVE_NAME}/bin/python"
#: What packs a virtualenv (PyPI; installed into the virtualenv it packs, from pip's cache).
VENV_PACK = "venv-pack==0.2.0"


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


def installed_py_file(scratch: Path, distribution: str) -> Path:
    """A ``.zip`` under ``scratch`` of ``distribution``'s installed files (its packages and its
    ``.dist-info``, which the start's check reads its version from): for a pure-Python
    library, what ``--py-files`` ships of it."""
    installed = importlib.metadata.distribution(distribution)
    archive = scratch / f"{distribution}-{installed.version}.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
        for file in installed.files or ():
            if file.suffix != ".pyc" and not file.parts[0].startswith(".."):
                zipped.write(file.locate(), file.as_posix())
    return archive


def packed_environment(scratch: Path, py_file: Path, distributions: Sequence[str]) -> Path:
    """A ``.tar.gz`` under ``scratch`` of ``site-packages/``: the wheel beside ``py_file``
    and ``distributions`` at the driver's versions (no other dependency)."""
    site = scratch / "packed" / "site-packages"
    _pip_install(["--target", str(site)], py_file, pinned(distributions))
    archive = scratch / f"{ARCHIVE_NAME}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(site, arcname=site.name)
    return archive


def packed_virtualenv(scratch: Path, py_file: Path, distributions: Sequence[str]) -> Path:
    """A ``.tar.gz`` under ``scratch`` of a virtualenv of this interpreter with pyarrow, the
    wheel beside ``py_file`` and ``distributions`` at the driver's versions, packed by
    venv-pack (which rewrites its scripts' paths; its ``bin/python`` stays a link to this
    interpreter, which every host must have at the same path). No PySpark, as Spark's docs
    pack it: the workers import Spark's own ``pyspark.zip``, whose version the start's check
    reads from the module (the zip has no package metadata). The virtualenv itself is
    removed once packed."""
    venv = scratch / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=PIP_TIMEOUT_S)
    requirements = [*pinned(("pyarrow", *distributions)), VENV_PACK]
    _pip_install([], py_file, requirements, python=venv / "bin" / "python")
    archive = scratch / f"{ARCHIVE_NAME}.tar.gz"
    subprocess.run([str(venv / "bin" / "venv-pack"), "--prefix", str(venv), "--output",
                    str(archive), "--quiet"], check=True, timeout=PIP_TIMEOUT_S)
    shutil.rmtree(venv)
    return archive


def archives_conf(archive: Path) -> dict[str, str]:
    """What a driver sets to ship ``archive`` to its executors, unpacked as ``environment``
    in their working directories."""
    return {"spark.archives": f"{archive}#{ARCHIVE_NAME}"}


def unpack(archive: Path, directory: Path) -> Path:
    """``archive`` unpacked into ``directory`` (as Spark unpacks ``spark.archives`` on an
    executor); ``directory``."""
    with tarfile.open(archive) as tar:
        tar.extractall(directory, filter="tar")  # keeps bin/python's link to this interpreter
    return directory


def pinned(distributions: Sequence[str]) -> list[str]:
    """``distributions`` as requirements at the versions the driver has installed."""
    return [f"{name}=={importlib.metadata.version(name)}" for name in distributions]


def _pip_install(options: Sequence[str], py_file: Path, requirements: Sequence[str], *,
                 python: Path = Path(sys.executable)) -> None:
    """pip of ``python`` installs the wheel beside ``py_file`` and ``requirements``, without
    their dependencies."""
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", *options,
                    str(py_file.with_suffix(".whl")), *requirements],
                   check=True, timeout=PIP_TIMEOUT_S)


def sqlite_after_shipping_py_file(py_file: str, **options: Any) -> SQLiteSink:
    """A :class:`SQLiteSink` of ``options``; first, in a driver whose Spark session is up,
    ``py_file`` shipped by that session (:func:`ship_py_file`; in a process without a
    session, as a test reading the target, the sink only)."""
    spark = SparkSession.getActiveSession()
    if spark is not None:
        ship_py_file(spark, py_file)
    return SQLiteSink(**options)


def ship_py_file(spark: SparkSession, py_file: str) -> None:
    """``SparkContext.addPyFile(py_file)``; on a Spark Connect client (no SparkContext)
    ``addArtifacts(py_file, pyfile=True)``: the server keeps it with the client's session
    and puts it on the path of the Python workers of that session's jobs, its own and the
    executors' (not of its streams' in Spark 4.3.0: see tests/spark/test_shipping.py)."""
    if type(spark).__module__.startswith(CONNECT_MODULE):
        spark.addArtifacts(py_file, pyfile=True)
    else:
        spark.sparkContext.addPyFile(py_file)


@dataclass
class BareConnectServer(ConnectServer):
    """A Spark Connect server whose Python workers, its own and its executors', run
    ``python`` (``PYSPARK_PYTHON``), with nothing of the repository on their path: they
    import twophase and the sinks only as a client ships them."""

    python: str = sys.executable

    def _environment(self, crash_at: str | None) -> dict[str, str]:
        env = super()._environment(crash_at)
        env.pop("PYTHONPATH")
        return {**env, "PYSPARK_PYTHON": self.python}
