"""The processes the model (:mod:`twophase.testing.model`) simulates in the test process.

A crash is an exception no handler of the code under test catches (:class:`SimulatedCrash`);
the crash points are :class:`Traps` the model arms, handed to the framework through its seams
(the ``crash_point`` of :class:`~twophase._coordinator.Coordinator` and of
:func:`~twophase._spark.write_partition`); Spark's ``TaskContext`` is a :class:`FakeTask`; a run
of the query alive in memory, its driver and executors, is a :class:`Run`; a commit behind the
next batch is a :class:`DeferredCommit` the model runs when it chooses. Nothing is patched.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from twophase._coordinator import Coordinator
from twophase._handle import Handle
from twophase._pipeline import CommitPipeline
from twophase._spark import RunConfig
from twophase.errors import FatalError, TwoPhaseError
from twophase.sink import TwoPhaseCommitSink

#: Partitions of every batch (Spark keeps the count across restarts here).
PARTITIONS = 2


class SimulatedCrash(BaseException):
    """The process dies here: no handler of the code under test may run (hence BaseException)."""


class SinkFailedError(FatalError):
    """The sink failed (an outage) after the decision: Spark then aborts the batch."""


class TaskFailedError(FatalError):
    """A task attempt failed after it wrote (its transaction is discarded)."""


def process_dies() -> None:
    raise SimulatedCrash


def sink_fails() -> None:
    raise SinkFailedError("the sink failed mid-commit", fix="(simulated)")


def rows_in(batch: int, partition: int) -> int:
    """Spark replays a batch with the same rows: the count is fixed per batch and partition."""
    return (2 * batch + partition) % 4


class Traps:
    """Armed crash points: (point, batch) -> what happens there, once; :meth:`spring` is the
    ``crash_point`` the framework calls."""

    def __init__(self) -> None:
        self._armed: dict[tuple[str, int], Callable[[], None]] = {}

    def arm(self, point: str, batch: int, action: Callable[[], None]) -> None:
        self._armed[(point, batch)] = action

    def spring(self, point: str, batch: int) -> None:
        action = self._armed.pop((point, batch), None)
        if action is not None:
            action()

    def clear(self) -> None:
        self._armed.clear()


@dataclass
class FakeTask:
    """What ``write_partition`` reads of Spark's ``TaskContext``."""

    partition: int
    attempt: int  # Spark's task attempt id, unique within a run
    number: int  # Spark's attempt number: how many attempts of the partition failed before

    def partitionId(self) -> int:  # noqa: N802 - Spark's name
        return self.partition

    def attemptNumber(self) -> int:  # noqa: N802 - Spark's name
        return self.number

    def taskAttemptId(self) -> int:  # noqa: N802 - Spark's name
        return self.attempt


@dataclass
class Run:
    """One run of the query (one epoch), alive in memory: the driver and its executors."""

    epoch: int
    sink: TwoPhaseCommitSink[Any]
    coordinator: Coordinator
    config: RunConfig
    batch: int
    #: Spark's task attempt ids: unique within the run.
    attempt_ids: Iterator[int] = field(default_factory=itertools.count)
    #: Failed attempts so far per partition of ``batch`` (Spark's attempt number).
    failures: Counter[int] = field(default_factory=Counter)
    #: The successful attempt's message per partition of ``batch``: a handle, or None
    #: (nothing written). Without speculation, a partition succeeds once.
    messages: dict[int, Handle | None] = field(default_factory=dict)
    #: A task was fenced: Spark fails the job, and this (zombie) run's query stops.
    stopped: bool = False
    #: The run's commit pipeline, if its batches commit behind the next one.
    pipeline: CommitPipeline | None = None

    def complete(self) -> bool:
        return len(self.messages) == PARTITIONS

    def unfinished(self, partition: int) -> int | None:
        """``partition``, or the next one without a successful attempt (None: all have one)."""
        left = [p for p in range(PARTITIONS) if p not in self.messages]
        return min(left, key=lambda p: (p - partition) % PARTITIONS) if left else None

    def commit_batch(self, batch: int, query_id: str, handles: list[Handle]) -> None:
        """Spark's commit callback: through the pipeline, if the run has one."""
        if self.pipeline is not None:
            self.pipeline.commit_batch(batch, query_id, handles)
        else:
            self.coordinator.commit_batch(batch, query_id, handles)

    def abort_batch(self, batch: int, query_id: str, handles: list[Handle]) -> None:
        """Spark's abort callback: through the pipeline, if the run has one."""
        if self.pipeline is not None:
            self.pipeline.abort_batch(batch, query_id, handles)
        else:
            self.coordinator.abort_batch(batch, query_id, handles)

    def handles(self) -> list[Handle]:
        return [handle for handle in self.messages.values() if handle is not None]

    def next_batch(self) -> None:
        self.batch += 1
        self.failures, self.messages = Counter(), {}

    def new_task(self, partition: int) -> FakeTask:
        """The next attempt of ``partition``: a fresh attempt id, its attempt number."""
        return FakeTask(partition, next(self.attempt_ids), self.failures[partition])


class DeferredCommit:
    """A commit behind the next batch that the model runs when it chooses (or when the
    pipeline waits for it): what a thread of the driver's process would run."""

    def __init__(self, batch: int, work: Callable[[], None]) -> None:
        self.batch = batch
        self.work = work
        self.done = False
        self.error: TwoPhaseError | None = None

    def run(self) -> None:
        """Run it once (a :class:`SimulatedCrash` in it goes through: the process dies)."""
        if self.done:
            return
        self.done = True
        try:
            self.work()
        except TwoPhaseError as exc:
            self.error = exc

    def result(self) -> None:
        self.run()
        if self.error is not None:
            raise self.error
