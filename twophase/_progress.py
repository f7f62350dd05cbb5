"""Decisions and commits in the driver's log, as Spark reports each batch's progress.

Spark runs a stream writer's ``commit`` in a Python process of its own, so the log lines the
coordinator writes there never reach the driver's log. A :class:`StreamingQueryListener` in the
driver reads what the state file recorded for each batch Spark reports (one listener per
session, for every query started by :func:`twophase.spark.write_stream`) and logs it here.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import TYPE_CHECKING

from pyspark.sql.streaming.listener import StreamingQueryListener

from twophase._spark import is_connect
from twophase._state import StateStore
from twophase.errors import TwoPhaseError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.listener import (
        QueryIdleEvent,
        QueryProgressEvent,
        QueryStartedEvent,
        QueryTerminatedEvent,
    )

log = logging.getLogger(__name__)

#: A twophase error as a Python worker's traceback ends (inside Spark's own exception text).
_TWOPHASE_ERROR = re.compile(r"^twophase\.errors\.(\w+): (.*)$", re.MULTILINE)
#: Lines of a cause's message read after its first, looking for its fix.
_CAUSE_LINES = 4

_LISTENERS: dict[int, _CommitLog] = {}
_REGISTRATION = threading.Lock()


def log_commits(spark: SparkSession, query_id: str, store: StateStore) -> None:
    """Log, in this (the driver's) process, what twophase decided for each batch of the query."""
    with _REGISTRATION:
        listener = _LISTENERS.get(id(spark))
        if listener is None:
            listener = _LISTENERS[id(spark)] = _CommitLog(spark)
            spark.streams.addListener(listener)
        listener.queries[query_id] = store


class _CommitLog(StreamingQueryListener):
    def __init__(self, spark: SparkSession) -> None:
        self.queries: dict[str, StateStore] = {}
        self.session = spark

    def onQueryStarted(self, event: QueryStartedEvent) -> None:  # noqa: N802 - Spark's name
        """Nothing to say yet: the start is logged by write_stream."""

    def onQueryIdle(self, event: QueryIdleEvent) -> None:  # noqa: N802 - Spark's name
        """Nothing was decided."""

    def onQueryProgress(self, event: QueryProgressEvent) -> None:  # noqa: N802 - Spark's name
        progress = event.progress
        store = self.queries.get(str(progress.id))
        if store is not None:
            log_batch(store, progress.batchId)

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:  # noqa: N802
        store = self.queries.pop(str(event.id), None)
        if store is not None and event.exception:
            log.error("query %s stopped: %s (pending decided batches, if any, are finished "
                      "by its next start; see `python -m twophase.status %s`)",
                      event.id, cause_of(event.exception), store.location)
        if not self.queries and is_connect(self.session):
            self._detach()

    def _detach(self) -> None:
        """Spark Connect delivers a client's events on a thread that is not a daemon: while
        a listener is added, the client process cannot exit. Once none of its queries runs,
        it is removed (from another thread: removing waits for the event thread, this one)."""
        with _REGISTRATION:
            if _LISTENERS.get(id(self.session)) is self:
                del _LISTENERS[id(self.session)]
        threading.Thread(target=self._remove, name="twophase-commit-log-removal",
                         daemon=True).start()

    def _remove(self) -> None:
        if not getattr(self.session, "is_stopped", False):  # a stopped session has none
            self.session.streams.removeListener(self)


def log_batch(store: StateStore, batch: int) -> None:
    """One line on what the state file says of ``batch``: committed, decided, or neither."""
    try:
        state = store.read()
    except TwoPhaseError as exc:
        log.error("cannot read the state of batch %d: %s", batch, exc)
        return
    if state is None:
        return
    record = next((r for r in reversed(state.history) if r.batch == batch), None)
    if record is not None:
        log.info("batch %d committed: %d rows in %d transactions (%d already committed), "
                 "decision %.1f ms, commit %.1f ms, epoch %d", record.batch, record.rows,
                 record.txns, record.already_committed, record.decision_ms, record.commit_ms,
                 record.epoch)
    elif state.decision(batch) is not None:
        log.warning("batch %d decided but not yet committed (its next start finishes it)", batch)
    elif batch <= state.last_done_batch:
        log.info("batch %d was a replay of a committed batch: nothing written twice", batch)
    else:
        log.warning("batch %d reported by Spark but not decided by twophase", batch)


def cause_of(exception: str) -> str:
    """What stopped a query, from Spark's text of the exception: the first twophase error of
    a task's traceback (with its fix) if there is one, else Spark's first line ("Writing job
    failed" says nothing of the cause a sink named; errors after the first are its echoes, as
    the abort of the failed batch)."""
    first = _TWOPHASE_ERROR.search(exception)
    if first is None:
        return exception.splitlines()[0]
    lines = [f"{first.group(1)}: {first.group(2)}"]
    for line in exception[first.end():].splitlines()[1:_CAUSE_LINES + 1]:
        if "Fix:" in lines[-1] or not line.strip():
            break
        lines.append(line.strip())
    return " ".join(lines)
