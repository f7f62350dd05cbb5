"""A bare executor Python: a virtualenv with PySpark and pyarrow only, nothing of twophase.

:func:`bare_venv` makes it in well under a second from what the driver's environment has
installed anyway: ``python -m venv --without-pip`` (no site packages of the driver's), then
the top-level entries of PySpark's, py4j's (PySpark's one dependency) and pyarrow's
distributions (their packages, libraries and ``.dist-info``) as symbolic links into its
empty ``site-packages``. Nothing else is importable there: not twophase, not the sinks,
not any sink's client library. (A copy by ``pip install pyspark==V pyarrow==V`` from pip's
cache is equivalent and took 24 s here; the links cost nothing.)

The links point into ``packages``: the driver's ``site-packages`` as the executors see it
(:mod:`setups.servers.spark_cluster` mounts it at another path in the workers' mount
namespace, where the bare virtualenv takes the driver's virtualenv's place).

:func:`bare_driver_python` is one for a process of the driver's side whose Python workers'
path Spark also sends to the bare executors (a Spark Connect server: one ``PYSPARK_PYTHON``
for both): its links name the driver's ``site-packages`` by its path, which is the driver's
on the driver's host and the bare virtualenv's (the same three distributions) in the workers'
namespace, so it is bare on either side.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import sysconfig
from pathlib import Path, PurePosixPath

#: What a bare executor has: PySpark (and py4j, its dependency) and pyarrow.
BARE_DISTRIBUTIONS = ("pyspark", "py4j", "pyarrow")


def site_packages(venv: Path) -> Path:
    """The ``site-packages`` directory of the virtualenv at ``venv`` (this Python's layout)."""
    relative = Path(sysconfig.get_path("purelib")).relative_to(sys.prefix)
    return venv / relative


def top_level_entries(distribution: str) -> set[str]:
    """The names in ``site-packages`` that ``distribution`` installed (no scripts)."""
    files = importlib.metadata.distribution(distribution).files or []
    parts = (PurePosixPath(str(path)).parts for path in files)
    return {part[0] for part in parts if part and part[0] not in ("..", "__pycache__")}


def bare_venv(venv: Path, packages: Path) -> Path:
    """A virtualenv at ``venv`` whose ``site-packages`` links PySpark's, py4j's and pyarrow's
    entries of ``packages`` and holds nothing else; the directory ``venv``."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = site_packages(venv)
    for distribution in BARE_DISTRIBUTIONS:
        for name in top_level_entries(distribution):
            (site / name).symlink_to(packages / name)
    return venv


def bare_driver_python(venv: Path) -> Path:
    """The Python of a bare virtualenv at ``venv`` that is bare on the driver's host and on
    the bare executors alike (see above)."""
    return bare_venv(venv, site_packages(Path(sys.prefix))) / "bin" / "python"
