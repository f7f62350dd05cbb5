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
from pathlib import Path

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
    commit = _git("rev-parse", "--short", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    load = Path("/proc/loadavg").read_text().split()[:3]
    java = spark.sparkContext._jvm.System.getProperty("java.version")  # type: ignore[union-attr]
    options = spark.conf.get("spark.driver.extraJavaOptions", "")
    jit = "C1 only" if C1_CAP in (options or "") else "full JIT"
    return (f"commit {commit}{' (with local changes)' if dirty else ''}, "
            f"{os.cpu_count()} CPUs, load {' '.join(load)} at the start, Python "
            f"{platform.python_version()}, Java {java}, Spark {spark.version}, JVM at {jit}")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True,
                          check=False).stdout.strip()
