"""Commits behind the next batch: a decided batch commits while Spark runs the next one.

Without it, Spark's commit callback of batch ``N`` decides ``N`` and commits every
transaction of it before it returns, and Spark plans batch ``N + 1`` only after that: the
commit is on the critical path of every batch. Flink commits after
``notifyCheckpointComplete`` without stopping the stream; this does the same where a process
lives across batches (the classic driver's Python process of ``foreachBatch``, and the
Python worker that Spark reuses for a stream's commit callbacks):

1. the callback of batch ``N`` waits until batch ``N - 1`` is committed (the bound: at most
   one decided batch is ever uncommitted, which Kafka's id pool needs: batch ``b + 2`` may
   begin only after batch ``b`` is committed, and ``b + 2``'s tasks start only after ``b + 1``'s
   callback returns);
2. it decides ``N`` (durable in the state file, as before), hands ``N``'s commit to a thread
   of this process and returns: Spark writes its commit log and runs ``N + 1``'s tasks while
   ``N`` commits.

Batches still become visible in order (``N + 1`` is decided only after ``N`` is committed),
a sink group's members in ``commit_order`` within each. A crash while ``N`` commits behind is
a crash after ``N``'s decision: the next run (or the next callback, in another process)
commits it. A commit behind that fails leaves ``N`` decided and pending: the next callback
commits it again before anything else and raises there, so the query fails one batch later
than it would have, with the same error.

The callback's process is Spark's: if the commit behind is not in this process (Spark gave
the callback to another Python worker), the callback waits for the state to show ``N - 1``
committed, as long as :data:`COMMITTING_ELSEWHERE_WAIT_S`, and then commits it itself.

A batch job commits in the callback, as before: nothing runs after its one batch to wait for
the commit. So does a query that ends by itself (``availableNow``, ``once``) unless it asks
(``write_stream(..., commits="behind")``, which then runs it through ``foreachBatch``): its
commits behind then run in the driver's own process, and the query's ``awaitTermination``
waits for the last one.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from twophase._coordinator import Coordinator, Decided
from twophase._crash import COMMITTING_BEHIND
from twophase._handle import Handle
from twophase._metrics import COMMIT_WAIT_SECONDS, observation
from twophase._state import StateStore
from twophase.errors import TwoPhaseError

log = logging.getLogger(__name__)

#: How long a callback waits for a commit behind that runs in another process before it
#: commits the batch itself (the other process may have died).
COMMITTING_ELSEWHERE_WAIT_S = 10.0
#: How often the state is read meanwhile.
STATE_POLL_S = 0.005
#: The name (prefix) of the thread a batch commits behind the next one on.
COMMIT_BEHIND_THREAD = "twophase-commit-behind"


class Committing(Protocol):
    """A commit handed over to run behind (a ``Future``): ``result`` waits for its end."""

    def result(self) -> object: ...


#: Who commits behind: runs the commit of a batch later (a thread of this process; the
#: model runs it when it chooses).
Behind = Callable[[int, Callable[[], None]], Committing]


class CommitPipeline:
    """One run's driver side in a process that lives across batches.

    ``deciding`` decides (and, for a batch that cannot wait, commits) on the callback's
    thread; ``committing`` commits behind, on ``behind``'s thread. Each keeps its committer
    open across batches (its pools, clients and sessions are built once per process).
    """

    def __init__(self, deciding: Coordinator, committing: Coordinator, *,
                 behind: Behind | None = None,
                 elsewhere_wait_s: float = COMMITTING_ELSEWHERE_WAIT_S) -> None:
        self.deciding = deciding
        self.committing = committing
        self.elsewhere_wait_s = elsewhere_wait_s
        self._threads: ThreadPoolExecutor | None = None
        self._behind = behind or self._on_a_thread
        self._committing: Committing | None = None

    def commit_batch(self, batch: int, query_id: str, handles: Sequence[Handle]) -> None:
        """Decide ``batch`` once the batch before it is committed; commit it behind."""
        started = time.monotonic()
        if not self.wait_for_commit():
            self._wait_for_commits_elsewhere(batch)
        self.deciding.tally.add_all(observation(COMMIT_WAIT_SECONDS,
                                                time.monotonic() - started))
        decided = self.deciding.decide_batch(batch, query_id, handles)
        if decided is not None:
            self._committing = self._behind(batch, lambda: self._commit_behind(decided))

    def abort_batch(self, batch: int, query_id: str | None, handles: Sequence[Handle]) -> None:
        self.wait_for_commit()
        self.deciding.abort_batch(batch, query_id, handles)

    def wait_for_commit(self) -> bool:
        """Wait for the batch committing behind in this process; whether there was one. Its
        failure is logged, not raised: the batch stays decided, and the next step commits it
        again (and raises)."""
        committing, self._committing = self._committing, None
        if committing is None:
            return False
        try:
            committing.result()
        except TwoPhaseError as exc:
            log.warning("a batch's commit behind the next batch failed (it stays decided; "
                        "the next batch's commit finishes it first): %s", exc)
        return True

    def drain(self) -> None:
        """Make every decided batch visible: wait for the commit behind, then commit what is
        still pending (a commit behind that failed, or ran in a process that died)."""
        self.wait_for_commit()
        self.deciding.recover()

    def close(self) -> None:
        self.wait_for_commit()
        if self._threads is not None:
            self._threads.shutdown()
        self.deciding.close()
        self.committing.close()

    def _commit_behind(self, decided: Decided) -> None:
        self.committing.crash_point(COMMITTING_BEHIND, decided.decision.batch)
        self.committing.finish_decided(decided)

    def _on_a_thread(self, _batch: int, work: Callable[[], None]) -> Future[None]:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(max_workers=1,
                                               thread_name_prefix=COMMIT_BEHIND_THREAD)
        return self._threads.submit(work)

    def _wait_for_commits_elsewhere(self, batch: int) -> None:
        """Nothing committed behind in this process: wait (bounded) until no batch before
        ``batch`` is pending, as another process may be committing it behind (Spark gave this
        callback to another worker). What is still pending then, ``decide_batch`` commits."""
        wait_for_commits(self.deciding.store, before=batch, wait_s=self.elsewhere_wait_s)


def wait_for_commits(store: StateStore, *, before: float = math.inf,
                     wait_s: float = COMMITTING_ELSEWHERE_WAIT_S) -> bool:
    """Wait up to ``wait_s`` until no decided batch (before ``before``) is pending in
    ``store``; whether none is."""
    deadline = time.monotonic() + wait_s
    while True:
        state = store.read()
        if state is None or all(decision.batch >= before for decision in state.pending):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(STATE_POLL_S)


# -- the pipelines of this process ------------------------------------------------------------

#: A run's pipeline in this process: by state location, namespace and epoch.
RunKey = tuple[str, str, int]

_pipelines: dict[RunKey, CommitPipeline] = {}
_pipelines_lock = threading.Lock()


def pipeline_of(key: RunKey, new: Callable[[], CommitPipeline]) -> CommitPipeline:
    """This process's pipeline of the run ``key`` (made by ``new`` on first use). A pipeline
    of an older run of the same state and namespace is closed: a newer run fenced it."""
    with _pipelines_lock:
        pipeline = _pipelines.get(key)
        if pipeline is not None:
            return pipeline
        older = [_pipelines.pop(run) for run in list(_pipelines)
                 if run[:2] == key[:2] and run[2] < key[2]]
        pipeline = _pipelines[key] = new()
    for fenced in older:
        _close_quietly(fenced)
    return pipeline


def drop_pipeline(key: RunKey) -> bool:
    """Close and forget this process's pipeline of the run ``key`` (its commit behind
    finished first); whether it had one."""
    with _pipelines_lock:
        pipeline = _pipelines.pop(key, None)
    if pipeline is None:
        return False
    _close_quietly(pipeline)
    return True


def _close_quietly(pipeline: CommitPipeline) -> None:
    try:
        pipeline.close()
    except TwoPhaseError as exc:
        log.warning("closing a run's commit pipeline: %s", exc)
