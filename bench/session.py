"""The benchmarks' one SparkSession: the JVM at full speed, and the provenance of every run.

The tests' sessions (:func:`twophase.testing.driver.local_session` with its ``SPARK_CONF``)
cap the driver's JIT at C1 (``-XX:TieredStopAtLevel=1``): right for a test's start-up, wrong
for a benchmark, where it slows every writer that runs in the JVM, Spark's own above all. A
benchmark's session leaves the JVM at its defaults (:data:`FULL_JIT`: the C2 compiler, G1),
and every published number names the run it came from (:func:`provenance`: the commit, the
machine's CPUs and load, the Python, Java and Spark versions).
"""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyspark
from pyspark.sql import SparkSession

from twophase.testing.driver import local_session

#: The JVM at its defaults (C1 then C2, G1), never the tests' C1-only cap.
FULL_JIT = {"spark.driver.extraJavaOptions": "-XX:+UseG1GC"}
#: The flag a benchmark's JVM must not run with.
C1_CAP = "TieredStopAtLevel=1"


def bench_session(app_name: str, cores: int = 2, conf: dict[str, str] | None = None,
                  python: str | None = None) -> SparkSession:
    """``local[cores]`` with the tests' small-machine settings but the JVM at full JIT (a
    ``conf`` of the caller's own may add to :data:`FULL_JIT`'s options, never cap them)."""
    settings = {**(conf or {})}
    java = " ".join(filter(None, (FULL_JIT["spark.driver.extraJavaOptions"],
                                  settings.pop("spark.driver.extraJavaOptions", ""))))
    if C1_CAP in java:
        raise ValueError(f"a benchmark's JVM runs at full JIT, not with {C1_CAP}")
    return local_session(app_name, cores, {**settings, "spark.driver.extraJavaOptions": java},
                         python)


def provenance(spark: SparkSession) -> str:
    """The run's commit, machine, load and versions, printed before its numbers."""
    return describe(provenance_of(spark))


def provenance_of(spark: SparkSession) -> dict[str, Any]:
    """:func:`machine` and the session's Java and Spark versions and JIT, as a results file
    keeps them."""
    java = spark.sparkContext._jvm.System.getProperty("java.version")  # type: ignore[union-attr]
    options = spark.conf.get("spark.driver.extraJavaOptions", "") or ""
    return {**machine(java), "spark": spark.version,
            "jit": "C1 only" if C1_CAP in options else "full JIT"}


def machine(java: str | None = None) -> dict[str, Any]:
    """The commit (and whether the tree has local changes), the CPUs, the load average now,
    the Python, PySpark and Java versions (``java``, else asked of the ``java`` PySpark
    starts): what a run whose sessions are other processes' records (``bench/latency.py``;
    each of its sessions is a :func:`bench_session`)."""
    return {"commit": _git("rev-parse", "--short", "HEAD"),
            "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
            "cpus": os.cpu_count(), "load": Path("/proc/loadavg").read_text().split()[:3],
            "python": platform.python_version(), "spark": pyspark.__version__,
            "java": java or _java_version(), "at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")}


def describe(run: dict[str, Any], *, markdown: bool = False) -> str:
    """One line of a run's provenance (:func:`provenance_of` or :func:`machine`; the commit as
    code if ``markdown``)."""
    versions = ", ".join(f"{label} {run[key]}" for key, label in
                         (("java", "Java"), ("spark", "Spark")) if key in run)
    commit = f"`{run['commit']}`" if markdown else run["commit"]
    return (f"commit {commit}{' (with local changes)' if run['dirty'] else ''}, "
            f"{run['at']}, {run['cpus']} CPUs, load {' '.join(run['load'])} at the start, "
            f"Python {run['python']}{', ' + versions if versions else ''}"
            f"{', JVM at ' + run['jit'] if 'jit' in run else ''}")


def _java_version() -> str:
    """The version of the ``java`` PySpark starts (``JAVA_HOME``'s, else the one on PATH)."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else "java"
    found = subprocess.run([java, "-XshowSettings:properties", "-version"],
                           capture_output=True, text=True, check=False).stderr
    return next((line.split("=", 1)[1].strip() for line in found.splitlines()
                 if line.strip().startswith("java.version =")), "unknown")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True,
                          check=False).stdout.strip()
