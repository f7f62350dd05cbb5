"""Class data sharing for the short-lived Spark drivers of the tests: each starts its JVM from an
archive of the classes a twophase stream loads, instead of loading and verifying them anew.

A crash suite starts a fresh driver for every crash point; most of such a driver's life is
its JVM's start (measured on the 2-core machine: the session 6.5-7.4 s and its first job
3.0-3.4 s without the archive, 4.0 s and 1.6-1.8 s with it). :func:`ensure_archive` makes the
archive once per machine (a stream of a small feed into a SQLite sink, with
``-XX:ArchiveClassesAtExit``, about 20 s) in the user's cache directory, named by the PySpark
version and the ``java`` binary, so a new PySpark or JDK makes a new one. The crash suite and
the test session's Spark make it before their first driver; :func:`java_options` (what
:func:`twophase.testing.driver.local_session` gives a driver that names no JVM options) adds it
once it exists, so the demo and the chaos runs use it without waiting for it. A JVM that finds
the archive unusable (another class path) starts without it, silently. A session given its own
``spark.driver.extraJavaOptions`` (a benchmark at full JIT) starts without it; a benchmark that
takes ``local_session``'s defaults gets it, with their C1-only JIT. ``TWOPHASE_CDS=0`` turns it
off.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyspark
from pyspark.sql import SparkSession

from twophase import (
    AbortOutcome,
    CommitOutcome,
    Handle,
    TransactionContext,
    TwoPhaseCommitSink,
)
from twophase.spark import write, write_stream

log = logging.getLogger(__name__)

#: The tests' drivers run their JIT at C1 only: they are short, and C2's compiles cost more
#: than they return in them.
C1_ONLY = "-XX:TieredStopAtLevel=1"
CDS_ENV = "TWOPHASE_CDS"
_SCHEMA = "event_id BIGINT, status STRING, ts TIMESTAMP"
#: How long making the archive may take before it is given up (the drivers then start without).
ARCHIVE_TIMEOUT_S = 300.0


def enabled() -> bool:
    return os.environ.get(CDS_ENV, "1") != "0"


def archive_path() -> Path | None:
    """Where this PySpark's and this JDK's archive lives (None: no ``java`` found)."""
    java = _java()
    if java is None:
        return None
    stat = java.stat()
    identity = f"{pyspark.__version__}:{java}:{stat.st_size}:{stat.st_mtime_ns}"
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "twophase" / "cds" / f"spark-{pyspark.__version__}-{digest}.jsa"


def java_options() -> str:
    """The tests' driver JVM options: C1 only, and the archive if it was made."""
    archive = archive_path() if enabled() else None
    if archive is None or not archive.exists():
        return C1_ONLY
    # -Xlog:disable: a JVM that cannot use the archive says so on stdout; it starts anyway.
    return f"{C1_ONLY} -XX:SharedArchiveFile={archive} -Xshare:auto -Xlog:disable"


def ensure_archive() -> Path | None:
    """The archive, made now if it does not exist yet (None: off, no ``java``, or it failed:
    the drivers start without it)."""
    archive = archive_path() if enabled() else None
    if archive is None or archive.exists():
        return archive
    failed = archive.with_suffix(".failed")
    if failed.exists():  # tried once on this machine: not again for every driver
        return None
    archive.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with tempfile.TemporaryDirectory(prefix="twophase-cds-") as scratch:
        partial = Path(scratch) / archive.name
        try:
            subprocess.run([sys.executable, "-m", __name__, str(partial), scratch],
                           check=True, timeout=ARCHIVE_TIMEOUT_S, capture_output=True)
        except (subprocess.SubprocessError, OSError) as exc:
            _mark_failed(failed, str(exc))
            return None
        if not partial.exists():
            _mark_failed(failed, "the JVM wrote none")
            return None
        os.replace(partial, archive)  # atomic: a concurrent maker's archive is as good
    log.info("class data sharing archive for the test drivers: %s", archive)
    return archive


def _mark_failed(marker: Path, why: str) -> None:
    log.warning("no class data sharing archive for the test drivers (%s): they start without "
                "one; delete %s to try again", why, marker)
    marker.touch()


def _java() -> Path | None:
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


class ClassLoadingSink(TwoPhaseCommitSink[list[Any]]):
    """A sink that keeps nothing: the stream that loads the JVM's classes writes into it
    (the JVM does the same work whatever the sink; the framework may not import a prebuilt
    one)."""

    kind = "twophase-cds"

    def begin_transaction(self, ctx: TransactionContext) -> list[Any]:
        return [ctx.txn_id, 0]

    def write(self, txn: list[Any], rows: Iterable[Sequence[Any]]) -> None:
        txn[1] += sum(1 for _ in rows)

    def pre_commit(self, txn: list[Any]) -> Handle:
        return self.handle(txn[0], txn[1])

    def commit(self, handle: Handle) -> CommitOutcome:
        return CommitOutcome.COMMITTED

    def abort(self, handle: Handle) -> AbortOutcome:
        return AbortOutcome.NOT_FOUND

    def list_in_doubt(self, namespace: str) -> list[Handle]:
        return []


def _load_classes(archive: Path, scratch: Path) -> None:
    """A small stream and a batch job through twophase, in a JVM that writes the classes it
    loaded into ``archive`` when it exits."""
    feed = scratch / "feed"
    feed.mkdir()
    for number in range(2):
        (feed / f"{number}.json").write_text("".join(
            f'{{"event_id": {n}, "status": "paid", "ts": "2026-11-01T00:00:00Z"}}\n'
            for n in range(100 * number, 100 * number + 100)))
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master("local[2]").appName("twophase-cds")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.extraJavaOptions",
                     f"{C1_ONLY} -XX:ArchiveClassesAtExit={archive}")
             .getOrCreate())
    try:
        stream = (spark.readStream.schema(_SCHEMA).option("maxFilesPerTrigger", 1)
                  .json(str(feed)).repartition(2))
        write_stream(stream, ClassLoadingSink(), checkpoint_location=str(scratch / "ckpt"),
                     trigger={"availableNow": True}).awaitTermination()
        write(spark.read.schema(_SCHEMA).json(str(feed)), ClassLoadingSink(),
              state_location=str(scratch / "state"))
    finally:
        spark.stop()


if __name__ == "__main__":
    _load_classes(Path(sys.argv[1]), Path(sys.argv[2]))
