"""Spark's reused Python workers, kept cheap between tasks.

``pyspark.daemon`` runs a full ``gc.collect()`` after every task of a reused Python worker
(``spark.python.worker.reuse``, on by default), and Spark commits a stream's batches in such a
worker too. A full collection walks the whole heap: the modules of pyspark, pandas and pyarrow
and the sink's client libraries (a boto3 session's parsed service model, a Kafka client's
protocol classes), 60,000-250,000 objects that live as long as the process. Measured with the
S3 sink: 40-150 ms per task or commit, many times what the sink's own work costs in a small
task. :func:`keep_out_of_worker_collections` freezes that long-lived heap once, so that those
collections walk only what later tasks allocate.

PySpark before 4.2 also calls ``importlib.invalidate_caches()`` before every task of such a
worker (``pyspark.worker_util.setup_spark_files``; 4.2 calls it only when the task's path
changed), and on Python 3.11 a ``zipimport.zipimporter`` then reads its archive's whole
directory again: ``pyspark.zip`` (1,328 entries) and py4j's zip, which Spark puts on every
worker's path. Measured on PySpark 4.1.4: 90 ms of CPU per task, five times what writing 50,000
rows to a Parquet file costs the task itself. At the same first unit of work, the worker's
zip importers are made to read an archive again only if it changed on disk
(:func:`read_zip_directories_again_only_if_changed`): what ``invalidate_caches`` is for, a
changed archive, is kept.

Both change the whole worker process, not just twophase's tasks in it: every zip importer of
the process, and the collections of every later task (a UDF's too). ``TWOPHASE_WORKER_TUNING=0``
(:data:`WORKER_TUNING_ENV`; also ``false``, ``off``, ``no``) turns both off: read where
``write_stream`` or ``write`` is called, and shipped to every task with the run's settings
(:attr:`~twophase._spark.RunConfig.worker_tuning`), or read in a worker's own environment
(``spark.executorEnv.TWOPHASE_WORKER_TUNING=0``). Either leaves the workers as Spark made them.
"""

from __future__ import annotations

import gc
import logging
import os
import zipimport
from collections.abc import Callable

log = logging.getLogger(__name__)

#: Set in the Python workers Spark reuses across tasks: the processes that collect after each.
SPARK_REUSE_WORKER_ENV = "SPARK_REUSE_WORKER"
#: The unit of work (a task's transaction, a batch's commit) at which such a worker's heap is
#: frozen: the first loads what is loaded on first use (Spark's Arrow writer imports pandas
#: after the first task's rows, clients parse their protocol models at their first request).
FREEZE_AT_UNIT = 2

#: Set to 0 to leave Spark's reused workers untouched (module docstring).
WORKER_TUNING_ENV = "TWOPHASE_WORKER_TUNING"
#: The values of :data:`WORKER_TUNING_ENV` that turn the tuning off (any case).
TUNING_OFF = ("0", "false", "off", "no")

_units_of_work: dict[int, int] = {}  # by process id: a forked child starts its own count


def worker_tuning_on() -> bool:
    """Whether this process's environment leaves the tuning on (:data:`WORKER_TUNING_ENV`)."""
    return os.environ.get(WORKER_TUNING_ENV, "").strip().lower() not in TUNING_OFF


def keep_out_of_worker_collections(*, tuning: bool = True) -> None:
    """Count a unit of work; at a reused Spark worker's second one, collect and freeze the heap.

    Frozen (``gc.freeze``), the objects that live as long as the process are skipped by every
    later collection; what later tasks allocate is collected as before, and acyclic garbage is
    freed by reference counting, frozen or not. What can stay behind is cyclic garbage made
    unreachable after the freeze among the frozen objects: bounded by the heap at that moment,
    once. At the first, the worker's zip importers stop reading an unchanged archive again
    (module docstring). Anywhere else (a driver, a test process, a worker Spark does not
    reuse), and with the tuning off (``tuning=False``: the run's setting; or this process's
    :data:`WORKER_TUNING_ENV`), it does nothing.
    """
    if not (tuning and os.environ.get(SPARK_REUSE_WORKER_ENV) and worker_tuning_on()):
        return
    pid = os.getpid()
    _units_of_work[pid] = units = _units_of_work.get(pid, 0) + 1
    if units == 1:
        read_zip_directories_again_only_if_changed()
    if units != FREEZE_AT_UNIT:
        return
    gc.collect()
    gc.freeze()
    log.debug("froze %d long-lived objects out of Spark's per-task collections",
              gc.get_freeze_count())


#: An archive as it was when a zip importer last read its directory: inode, size, mtime (ns).
ArchiveStat = tuple[int, int, int]


def read_zip_directories_again_only_if_changed() -> None:
    """Make ``zipimport.zipimporter.invalidate_caches`` (this process's, once) read an
    archive's directory again only if the archive changed on disk since it last read it."""
    invalidate: Callable[[zipimport.zipimporter], None] = zipimport.zipimporter.invalidate_caches
    if getattr(invalidate, "_twophase_reads_changed_only", False):
        return
    read: dict[str, ArchiveStat] = {}

    def invalidate_caches(importer: zipimport.zipimporter) -> None:
        archive = importer.archive
        try:
            stat = os.stat(archive)
        except OSError:
            stat = None
        now = None if stat is None else (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if now is not None and read.get(archive) == now:
            return
        invalidate(importer)
        if now is not None:
            read[archive] = now

    invalidate_caches._twophase_reads_changed_only = True  # type: ignore[attr-defined]
    zipimport.zipimporter.invalidate_caches = invalidate_caches  # type: ignore[method-assign,assignment]
