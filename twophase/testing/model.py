"""Model-based tests of the protocol: hypothesis generates crash schedules, any sink is judged.

A :class:`~hypothesis.stateful.RuleBasedStateMachine` drives the real protocol (the
:class:`~twophase._coordinator.Coordinator`, the state file, the executors' ``write_partition``
and the cleanup task) over a real sink, one fresh external system per example, and applies
these steps in any order hypothesis chooses:

========================================  ==================================================
rule                                      what it simulates
========================================  ==================================================
``driver_starts(tasks_read_state)``       a run starts as ``twophase.spark`` starts one: new
                                          epoch, recover, sweep (tasks can or cannot read
                                          the state, as in local mode or on a cluster);
                                          every example begins with one
``task_runs(partition, how)``             a task attempt of a partition that has not
                                          succeeded yet: ``pre_commits``,
                                          ``fails_mid_write`` (discarded),
                                          ``executor_killed_mid_write`` (no discard, no
                                          pre-commit, its process state lost) or
                                          ``executor_killed_after_pre_commit`` (the handle
                                          never reaches the driver); retries carry Spark's
                                          attempt number
``driver_commits_batch(crash)``           Spark's ``commit``: decide the batch and commit,
``batch_runs(crash)``                     (``batch_runs``: a run started if none is, the
                                          missing partitions pre-commit) or die (every
                                          in-memory object lost) at a crash point of
                                          ``twophase._crash``, or after
                                          the commit but before Spark's commit log; or the
                                          sink fails after the decision and Spark aborts the
                                          batch (foreachBatch does), the query stops
``spark_aborts_batch``                    tasks failed for good: Spark aborts, query stops
``commit_behind_runs(which, crash)``      a pipelined run (``pipeline_class``): a decided
                                          batch's commit behind the next batch runs now
                                          (any one pending: the model does not trust the
                                          pipeline's order), the driver dying or the sink
                                          failing in it; else it runs when the pipeline
                                          waits for it
``driver_killed``                         kill -9 of the driver between steps
``newer_run_takes_over``                  a second run starts; the older lives on, a zombie
``newer_run_takes_over_mid_commit``       the takeover happens while the older run is
                                          inside ``commit_batch`` at a crash point; it goes on
``zombie_*``                              a zombie's tasks run, it commits its batch, aborts
                                          it, recovers, or finally dies
``cleanup_runs``                          ``twophase.cleanup.clean`` on the state and sink
========================================  ==================================================

Spark's side is modelled as Spark behaves: a restarted run replays the batch whose commit is
missing from Spark's checkpoint, with new task attempts; every partition of a batch has a
fixed number of rows; a batch is committed only when every partition has a successful attempt.
Every transaction's rows get event ids of their own, so what is visible tells exactly which
transactions were committed.

Invariants: after every step, each visible row belongs to a decided batch's decision, none is
visible twice, and no row of a batch is visible while a decided row of an earlier batch is not
(batches become visible in order); a batch decided and committed in one step committed each of
its transactions once (as many commits as transactions, none already committed); right after
every start and at the end of every example
(a final restart), what is visible is exactly the rows of the decided batches, nothing of the
query is in doubt in the sink, and the state file has nothing pending. A decided transaction
reported lost, or a zombie run not fenced, is a violation too. A failure is an
:class:`ExactlyOnceError`, shrunk by hypothesis to a short schedule of named steps (each step
also ``note()`` s what it did).

Running it over a sink takes a target factory: a callable returning, per example, a
:class:`~twophase.testing.Target` over a *fresh, empty* external system whose rows have
:data:`~twophase.testing.contract.ORDER_COLUMNS` (its ``build`` is called again after every
simulated crash; ``visible`` includes repeats: they are duplicates)::

    from twophase.testing.model import run_model

    def test_my_sink_model(tmp_path):
        examples = itertools.count()
        stats = run_model(lambda: MyTarget("my_package.sinks:MySink",
                                           {"directory": str(tmp_path / str(next(examples)))}))

Settings: profile ``twophase-ci`` (derandomized, bounded) unless the environment variable
``TWOPHASE_HYPOTHESIS_PROFILE=long`` selects ``twophase-long``; ``run_model`` takes
``max_examples`` and further hypothesis settings. Crashes are simulated in the test process by
dropping objects (the crash suite of :mod:`twophase.testing.crash` kills real processes): the
framework takes the simulation through its seams (:mod:`twophase.testing.simulated`). The
model imports ``twophase._spark``, so it needs pyspark (but starts no Spark).
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from twophase import cleanup
from twophase._coordinator import SWEEP_INTERVAL_S, Coordinator
from twophase._crash import (
    AFTER_DECISION,
    AFTER_PRE_COMMIT,
    BEFORE_DECISION,
    BEFORE_DONE,
    BETWEEN_MEMBERS,
    COMMITTING_BEHIND,
    MID_COMMIT,
)
from twophase._handle import Handle, TxnId
from twophase._pipeline import CommitPipeline
from twophase._retry import RetryPolicy
from twophase._spark import RunConfig, write_partition
from twophase._state import StateStore
from twophase.errors import FencedError, TransactionLostError, TwoPhaseError
from twophase.group import member_handles
from twophase.sink import TwoPhaseCommitSink
from twophase.testing.contract import ORDER_COLUMNS, list_in_doubt, orders
from twophase.testing.simulated import (
    PARTITIONS,
    DeferredCommit,
    Run,
    SimulatedCrash,
    SinkFailedError,
    TaskFailedError,
    Traps,
    process_dies,
    rows_in,
    sink_fails,
)
from twophase.testing.target import ExactlyOnceError, Target

#: Namespaces are per example (a server shared by examples lists only its own).
NAMESPACE_PREFIX = "model"
MAX_ZOMBIES = 2
PROFILE_ENV = "TWOPHASE_HYPOTHESIS_PROFILE"
CI_PROFILE = "twophase-ci"
LONG_PROFILE = "twophase-long"
FAST_RETRY = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.05)
#: The deadline gate's margin in the model, whose commits take milliseconds: an example may
#: run for half a minute between a Kafka transaction's begin and its decision.
MODEL_DEADLINE_MARGIN_S = 1.0
#: Where Spark's commit log is written: a crash there leaves a committed batch to replay.
BEFORE_SPARK_COMMIT_LOG = "before_spark_commit_log"
NO_CRASH = "no_crash"
#: Points at which a batch being committed is decided (its decision is durable).
#: (Between two members' commits: a sink group's; another sink never reaches it.)
DECIDED_AT = (AFTER_DECISION, MID_COMMIT, BETWEEN_MEMBERS, BEFORE_DONE)
#: The sink fails (an outage) at a point after the decision: Spark then aborts the batch.
SINK_FAILS = "sink_fails_at_"
DRIVER_CRASHES = (NO_CRASH, BEFORE_DECISION, *DECIDED_AT, BEFORE_SPARK_COMMIT_LOG,
                  *(SINK_FAILS + point for point in DECIDED_AT))
TAKEOVER_POINTS = (BEFORE_DECISION, *DECIDED_AT)
#: Where a commit behind the next batch may die or meet an outage (a pipelined run's).
BEHIND_POINTS = (COMMITTING_BEHIND, MID_COMMIT, BETWEEN_MEMBERS, BEFORE_DONE)
BEHIND_CRASHES = (NO_CRASH, *BEHIND_POINTS, *(SINK_FAILS + point for point in BEHIND_POINTS))
#: What a task attempt does.
PRE_COMMITS = "pre_commits"
FAILS_MID_WRITE = "fails_mid_write"
KILLED_MID_WRITE = "executor_killed_mid_write"
KILLED_AFTER_PRE_COMMIT = "executor_killed_after_pre_commit"
TASK_OUTCOMES = (PRE_COMMITS, FAILS_MID_WRITE, KILLED_MID_WRITE, KILLED_AFTER_PRE_COMMIT)

_SETTINGS: dict[str, Any] = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.filter_too_much,
                              HealthCheck.data_too_large],
    "report_multiple_bugs": False,
}
settings.register_profile(CI_PROFILE, max_examples=50, stateful_step_count=25,
                          derandomize=True, database=None, **_SETTINGS)
settings.register_profile(LONG_PROFILE, max_examples=1000, stateful_step_count=40,
                          database=None, **_SETTINGS)


def profile() -> settings:
    """The profile selected by ``TWOPHASE_HYPOTHESIS_PROFILE`` (``ci`` by default, or ``long``)."""
    chosen = os.environ.get(PROFILE_ENV, "ci")
    if chosen not in ("ci", "long"):
        raise ValueError(f"{PROFILE_ENV}={chosen!r}: use ci or long")
    return settings.get_profile(LONG_PROFILE if chosen == "long" else CI_PROFILE)


@dataclass
class ModelStats:
    """What a model run did: examples and steps run, faults injected by kind."""

    examples: int = 0
    steps: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    #: How many examples decided how many batches (a check that the model gets far enough).
    decided_batches: Counter[int] = field(default_factory=Counter)


class ProtocolModel(RuleBasedStateMachine):
    """The model; :func:`model_machine` binds it to a target factory and a protocol variant."""

    new_target: Callable[[], Target]
    coordinator_class: type[Coordinator] = Coordinator
    store_class: type[StateStore] = StateStore
    #: Batches commit behind the next one through this pipeline (None: in the callback).
    pipeline_class: type[CommitPipeline] | None = None
    state_root: str | None = None
    stats: ModelStats

    def __init__(self) -> None:
        super().__init__()
        self.stats.examples += 1
        self.target = self.new_target()
        self.state_dir = Path(tempfile.mkdtemp(prefix="twophase-model-", dir=self.state_root))
        self.store = self.store_class(self.state_dir / "state")
        self.query_id = str(uuid.uuid4())
        self.namespace = f"{NAMESPACE_PREFIX}{self.query_id[:8]}"
        self.live: Run | None = None
        self.zombies: list[Run] = []
        self.spark_done = -1  # the last batch in Spark's commit log
        self.started = False
        self.decided: dict[int, list[int]] = {}
        #: The event ids each task attempt wrote, by (epoch, batch, partition, attempt).
        self.rows_of: dict[tuple[int, int, int, int], list[int]] = {}
        self.next_event = 0
        self.inspector = self.target.build()
        self.traps = Traps()
        #: The live run's commits handed over to run behind, not run yet.
        self.behind: list[DeferredCommit] = []

    # -- helpers ---------------------------------------------------------------------------

    def say(self, what: str) -> None:
        self.stats.steps += 1
        note(what)

    def fault(self, kind: str) -> None:
        self.stats.faults[kind] += 1

    def new_run(self, *, tasks_read_state: bool = True) -> Run:
        """A run starts as ``twophase.spark`` starts one: fence, recover, sweep."""
        state = self.store.start_run(self.namespace, {})
        sink = self.target.build()
        sink.check_schema(ORDER_COLUMNS)
        coordinator = self.coordinator_class(sink, self.store, namespace=self.namespace,
                                             epoch=state.epoch, retry=FAST_RETRY,
                                             crash_point=self.traps.spring,
                                             straggler_grace_s=0.0,
                                             deadline_margin_s=MODEL_DEADLINE_MARGIN_S,
                                             sweep_interval_s=self.sweep_interval_s())
        config = RunConfig(sink=sink, state_location=self.store.location,
                           namespace=self.namespace, epoch=state.epoch, columns=ORDER_COLUMNS,
                           retry=FAST_RETRY, decided_through=state.last_decided_batch,
                           tasks_read_state=tasks_read_state)
        with _lost_is_a_violation():
            coordinator.start(self.query_id if self.started else None)
            coordinator.record_query(self.query_id)
        self.started = True
        run = Run(state.epoch, sink, coordinator, config, batch=self.spark_done + 1,
                  pipeline=self.new_pipeline(coordinator, sink, state.epoch))
        self.behind = []  # the processes of earlier runs are gone, or zombies whose
        # commits behind never run (a zombie's commit of a decided batch changes nothing)
        self.say(f"run of epoch {run.epoch} started (recovered, swept; tasks "
                 f"{'read' if tasks_read_state else 'cannot read'} the state); Spark replays "
                 f"from batch {run.batch}")
        self.check_settled(f"after the start of epoch {run.epoch}")
        return run

    def sweep_interval_s(self) -> float:
        """A pipelined run's coordinator sweeps as a long-lived one does in Spark; any
        other, every batch."""
        return SWEEP_INTERVAL_S if self.pipeline_class is not None else 0.0

    def new_pipeline(self, deciding: Coordinator, sink: TwoPhaseCommitSink[Any],
                     epoch: int) -> CommitPipeline | None:
        """A pipelined run's pipeline: its commits behind run when the model says."""
        if self.pipeline_class is None:
            return None
        committing = self.coordinator_class(sink, self.store, namespace=self.namespace,
                                            epoch=epoch, retry=FAST_RETRY,
                                            crash_point=self.traps.spring,
                                            straggler_grace_s=0.0,
                                            deadline_margin_s=MODEL_DEADLINE_MARGIN_S)
        return self.pipeline_class(deciding, committing, behind=self.defer,
                                   elsewhere_wait_s=0.0)

    def defer(self, batch: int, work: Callable[[], None]) -> DeferredCommit:
        deferred = DeferredCommit(batch, work)
        self.behind.append(deferred)
        return deferred

    def rows_for(self, batch: int, partition: int) -> list[tuple[Any, ...]]:
        count = rows_in(batch, partition)
        rows = orders(self.next_event, count)
        self.next_event += count
        return rows

    def run_task(self, run: Run, partition: int, how: str = PRE_COMMITS) -> None:
        """One task attempt of ``run`` through the executors' real ``write_partition``."""
        rows = self.rows_for(run.batch, partition)
        task = run.new_task(partition)
        self.rows_of[(run.epoch, run.batch, partition, task.attempt)] = [row[0] for row in rows]

        def deliver(sink: TwoPhaseCommitSink[Any], txn: Any) -> None:
            sink.write(txn, rows)
            if how == FAILS_MID_WRITE:
                raise TaskFailedError("the task failed after writing", fix="(simulated)")
            if how == KILLED_MID_WRITE:
                raise SimulatedCrash

        if how == KILLED_AFTER_PRE_COMMIT:
            self.traps.arm(AFTER_PRE_COMMIT, run.batch, process_dies)
        try:
            message = write_partition(run.config, deliver, batch=run.batch,
                                      query_id=self.query_id, task=task,
                                      crash_point=self.traps.spring,
                                      discard_on_failure=how != KILLED_MID_WRITE)
        except (SimulatedCrash, TaskFailedError):
            run.failures[partition] += 1
            return
        except FencedError:
            if run is self.live:
                raise  # only a zombie's task may be fenced
            self.say("  fenced: a newer run has written here; the zombie's query stops")
            run.stopped = True
            self.zombies = [zombie for zombie in self.zombies if zombie is not run]
            return
        finally:
            self.traps.clear()
            gc.collect()  # a killed executor's connections close, as the OS closes them
        run.messages[partition] = Handle.loads(message.handle) if message.handle else None

    def task(self, run: Run, partition: int, how: str) -> None:
        chosen = run.unfinished(partition)
        if chosen is None:
            return
        who = "zombie " if run is not self.live else ""
        self.say(f"{who}epoch {run.epoch}: task attempt {run.failures[chosen]} of batch "
                 f"{run.batch} partition {chosen} {how.replace('_', ' ')}")
        if how != PRE_COMMITS:
            self.fault("task failure" if how == FAILS_MID_WRITE else "executor kill")
        self.run_task(run, chosen, how)
        if chosen in run.messages:
            handle = run.messages[chosen]
            self.say(f"  it reports {handle.txn_id if handle else 'nothing'}")

    def complete(self, run: Run) -> None:
        """Every partition of ``run``'s batch without a successful attempt gets one."""
        while not run.stopped and (partition := run.unfinished(0)) is not None:
            self.task(run, partition, PRE_COMMITS)

    def record_decision(self, batch: int, handles: Sequence[Handle]) -> None:
        """The model's oracle: ``batch`` is decided with ``handles`` (unless it was already)."""
        if batch in self.decided:
            return
        rows = [event for handle in handles for event in self.rows_of[_key(handle.txn_id)]]
        expected = sum(rows_in(batch, p) for p in range(PARTITIONS))
        if len(rows) != expected:
            raise ExactlyOnceError(f"batch {batch} was decided with {len(rows)} of its "
                                   f"{expected} rows")
        self.decided[batch] = rows

    def check_committed_once(self, batch: int, handles: Sequence[Handle]) -> None:
        """A batch decided and committed in one uninterrupted step (its record written, not
        behind the next batch) committed each of its transactions once: as many outcomes as
        transactions, none "already committed" (nobody else could have committed them) but
        an empty one (a sink may prove it by its having nothing to add). A stage committed
        twice breaks it."""
        # Read by a store of its own: reading through the runs' store would move what its
        # next compare-and-swap expects.
        state = StateStore(self.state_dir / "state").read()
        record = next((r for r in state.history if r.batch == batch), None) if state else None
        if record is None:
            return
        transactions = [member for handle in handles
                        for member in ([m for _, m in member_handles(handle)] or [handle])]
        empty = sum(1 for member in transactions if not member.rows)
        if record.txns != len(transactions) or record.already_committed > empty:
            raise ExactlyOnceError(
                f"batch {batch} has {len(transactions)} transactions ({empty} empty), but its "
                f"commit reported {record.txns} commits, {record.already_committed} of them "
                "already committed: a transaction was committed more than once")

    def decided_rows(self) -> list[int]:
        return sorted(event for rows in self.decided.values() for event in rows)

    def check_settled(self, when: str) -> None:
        """visible == the decided rows; nothing of the query in doubt; nothing pending."""
        seen, expected = sorted(self.target.visible()), self.decided_rows()
        if seen != expected:
            missing = sorted((Counter(expected) - Counter(seen)).elements())
            extra = sorted((Counter(seen) - Counter(expected)).elements())
            raise ExactlyOnceError(f"{when}: missing rows {missing}, rows visible but not "
                                   f"decided or visible twice {extra}")
        in_doubt = [str(h.txn_id) for h in list_in_doubt(self.inspector, self.namespace)
                    if h.txn_id.belongs_to(self.namespace, self.query_id)]
        if in_doubt:
            raise ExactlyOnceError(f"{when}: left in doubt {in_doubt}")
        state = self.store.read()
        if state is not None and state.pending:
            raise ExactlyOnceError(
                f"{when}: batches {[d.batch for d in state.pending]} still pending")

    def commit(self, run: Run, crash: str) -> None:
        """Spark's commit of ``run``'s batch; ``crash``: where the driver dies or the sink
        fails (then Spark aborts the batch and the query stops)."""
        batch, handles = run.batch, run.handles()
        outage = crash.startswith(SINK_FAILS)
        point = crash.removeprefix(SINK_FAILS)
        if point in (BEFORE_DECISION, *DECIDED_AT):
            self.traps.arm(point, batch, sink_fails if outage else process_dies)
        self.say(f"epoch {run.epoch} commits batch {batch} with "
                 f"{[str(h.txn_id) for h in handles]}"
                 + ("" if crash == NO_CRASH else f", {crash.replace('_', ' ')}"))
        try:
            with _lost_is_a_violation():
                run.commit_batch(batch, self.query_id, handles)
        except (SimulatedCrash, SinkFailedError):
            self.fault("commit failure" if outage else "driver kill")
            if point in DECIDED_AT:
                self.record_decision(batch, handles)
            if outage:
                with _lost_is_a_violation():
                    run.abort_batch(batch, self.query_id, handles)
            self.live = None
            return
        finally:
            self.traps.clear()
        newly_decided = batch not in self.decided
        self.record_decision(batch, handles)
        if newly_decided:
            self.check_committed_once(batch, handles)
        if crash == BEFORE_SPARK_COMMIT_LOG:
            self.fault("driver kill")
            self.live = None
            return
        self.spark_done = batch
        run.next_batch()

    # -- the driver --------------------------------------------------------------------------

    @initialize(tasks_read_state=st.booleans())
    def first_driver_starts(self, tasks_read_state: bool) -> None:
        """Every example starts with a run (a rule left to chance would leave the examples
        that never start one, a third of them, doing nothing)."""
        self.driver_starts(tasks_read_state)

    @precondition(lambda self: self.live is None)
    @rule(tasks_read_state=st.booleans())
    def driver_starts(self, tasks_read_state: bool) -> None:
        self.live = self.new_run(tasks_read_state=tasks_read_state)

    @precondition(lambda self: self.live is not None)
    @rule()
    def driver_killed(self) -> None:
        assert self.live is not None
        self.say(f"driver of epoch {self.live.epoch} killed")
        self.fault("driver kill")
        self.live = None

    @precondition(lambda self: self.live is not None and self.live.complete())
    @rule(crash=st.sampled_from(DRIVER_CRASHES))
    def driver_commits_batch(self, crash: str) -> None:
        assert self.live is not None
        self.commit(self.live, crash)

    @rule(crash=st.one_of(st.just(NO_CRASH), st.sampled_from(DRIVER_CRASHES)))
    def batch_runs(self, crash: str) -> None:
        """Every partition without a successful attempt gets one, then Spark commits (a
        query down first restarts, as a scheduler restarts it)."""
        if self.live is None:
            self.driver_starts(tasks_read_state=True)
        run = self.live
        assert run is not None
        self.complete(run)
        self.commit(run, crash)

    @precondition(lambda self: self.live is not None)
    @rule()
    def spark_aborts_batch(self) -> None:
        run = self.live
        assert run is not None
        self.say(f"Spark aborts batch {run.batch} of epoch {run.epoch} "
                 f"({len(run.handles())} handles); the query stops")
        with _lost_is_a_violation():
            run.abort_batch(run.batch, self.query_id, run.handles())
        self.live = None

    @precondition(lambda self: self.live is not None and any(
        not deferred.done for deferred in self.behind))
    @rule(which=st.integers(0, 1), crash=st.sampled_from(BEHIND_CRASHES))
    def commit_behind_runs(self, which: int, crash: str) -> None:
        """One of the live run's commits behind the next batch runs (a pipeline keeps at
        most one; the model may run any), meanwhile Spark runs the next batch; the driver
        may die in it, or the sink fail (the next batch's commit finishes it then)."""
        waiting = [deferred for deferred in self.behind if not deferred.done]
        deferred = waiting[which % len(waiting)]
        outage = crash.startswith(SINK_FAILS)
        point = crash.removeprefix(SINK_FAILS)
        if point in BEHIND_POINTS:
            self.traps.arm(point, deferred.batch, sink_fails if outage else process_dies)
        self.say(f"the commit of batch {deferred.batch} runs behind the next batch"
                 + ("" if crash == NO_CRASH else f", {crash.replace('_', ' ')}"))
        try:
            with _lost_is_a_violation():
                deferred.run()
        except SimulatedCrash:
            self.fault("driver kill")
            self.live = None
        finally:
            self.traps.clear()
        if deferred.error is not None:
            self.fault("commit failure")
            self.say(f"  it failed: {deferred.error.cause}")

    # -- tasks -------------------------------------------------------------------------------

    @precondition(lambda self: self.live is not None and not self.live.complete())
    @rule(partition=st.integers(0, PARTITIONS - 1), how=st.sampled_from(TASK_OUTCOMES))
    def task_runs(self, partition: int, how: str) -> None:
        assert self.live is not None
        self.task(self.live, partition, how)

    # -- zombies -----------------------------------------------------------------------------

    @precondition(lambda self: self.live is not None and len(self.zombies) < MAX_ZOMBIES)
    @rule()
    def newer_run_takes_over(self) -> None:
        assert self.live is not None
        self.say(f"a newer run takes over; epoch {self.live.epoch} lives on as a zombie")
        self.fault("zombie")
        self.zombies.append(self.live)
        self.live = None
        self.live = self.new_run()

    @precondition(lambda self: self.live is not None and len(self.zombies) < MAX_ZOMBIES)
    @rule(point=st.sampled_from(TAKEOVER_POINTS))
    def newer_run_takes_over_mid_commit(self, point: str) -> None:
        old = self.live
        assert old is not None
        self.complete(old)
        batch, handles = old.batch, old.handles()

        def takeover() -> None:
            self.fault("zombie")
            if point in DECIDED_AT:
                self.record_decision(batch, handles)
            self.zombies.append(old)
            self.live = self.new_run()

        self.traps.arm(point, batch, takeover)
        self.say(f"epoch {old.epoch} commits batch {batch}; at {point} a newer run takes "
                 "over, the older one goes on")
        try:
            with _lost_is_a_violation():
                old.coordinator.commit_batch(batch, self.query_id, handles)
        except FencedError:
            self.say(f"epoch {old.epoch} was fenced")
            return
        finally:
            self.traps.clear()
        if old is self.live:  # a replay: it never reached the point, nobody took over
            self.say(f"  batch {batch} was a replay: committed without reaching {point}")
            self.record_decision(batch, handles)
            self.spark_done = batch
        elif point == BEFORE_DECISION:
            raise ExactlyOnceError(f"epoch {old.epoch} committed batch {batch} after a newer "
                                   "run took over, before its decision")
        old.next_batch()

    def zombie(self, which: int) -> Run:
        return self.zombies[which % len(self.zombies)]

    @precondition(lambda self: bool(self.zombies))
    @rule(which=st.integers(0, MAX_ZOMBIES - 1), partition=st.integers(0, PARTITIONS - 1),
          how=st.sampled_from(TASK_OUTCOMES))
    def zombie_task_runs(self, which: int, partition: int, how: str) -> None:
        self.task(self.zombie(which), partition, how)

    @precondition(lambda self: bool(self.zombies))
    @rule(which=st.integers(0, MAX_ZOMBIES - 1))
    def zombie_commits_batch(self, which: int) -> None:
        run = self.zombie(which)
        self.complete(run)
        if run.stopped:
            return
        batch, handles = run.batch, run.handles()
        self.say(f"zombie epoch {run.epoch} commits batch {batch} with "
                 f"{[str(h.txn_id) for h in handles]}")
        try:
            with _lost_is_a_violation():
                run.coordinator.commit_batch(batch, self.query_id, handles)
        except FencedError:
            self.say(f"zombie epoch {run.epoch} was fenced")
            return
        except TwoPhaseError as exc:
            raise ExactlyOnceError(f"zombie epoch {run.epoch} was not fenced: {exc}") from exc
        raise ExactlyOnceError(f"zombie epoch {run.epoch} was not fenced: it committed batch "
                               f"{batch}")

    @precondition(lambda self: bool(self.zombies))
    @rule(which=st.integers(0, MAX_ZOMBIES - 1))
    def zombie_aborts_batch(self, which: int) -> None:
        run = self.zombie(which)
        self.say(f"zombie epoch {run.epoch} aborts batch {run.batch} "
                 f"({len(run.handles())} handles)")
        with _lost_is_a_violation():
            run.coordinator.abort_batch(run.batch, self.query_id, run.handles())

    @precondition(lambda self: bool(self.zombies))
    @rule(which=st.integers(0, MAX_ZOMBIES - 1))
    def zombie_recovers(self, which: int) -> None:
        run = self.zombie(which)
        self.say(f"zombie epoch {run.epoch} recovers decided batches")
        with contextlib.suppress(FencedError), _lost_is_a_violation():
            run.coordinator.recover()

    @precondition(lambda self: bool(self.zombies))
    @rule(which=st.integers(0, MAX_ZOMBIES - 1))
    def zombie_dies(self, which: int) -> None:
        run = self.zombie(which)
        self.say(f"zombie epoch {run.epoch} dies")
        self.zombies.remove(run)

    # -- cleanup -----------------------------------------------------------------------------

    @precondition(lambda self: self.started)
    @rule()
    def cleanup_runs(self) -> None:
        report = cleanup.Report()
        cleanup.clean(cleanup.Target(sink=self.target.build(), states=(self.store,),
                                     namespace=self.namespace), report, dry_run=False)
        done = [f"{a.action} {a.subject}" for a in report.actions if a.action != "purge"]
        self.say(f"cleanup ran: {done or 'nothing to do'}")
        failed = [f"{a.action} {a.subject}: {a.error}" for a in report.actions if a.error]
        if failed or report.attention:
            raise ExactlyOnceError(f"cleanup failed or needs attention: {failed}")

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def only_decided_rows_are_visible_once_and_in_batch_order(self) -> None:
        """visible ⊆ decided, nothing twice, no batch before a decided row of an earlier one
        (one read of the system per step: reading it is the slow part over a remote store)."""
        seen = Counter(self.target.visible())
        twice = sorted(event for event, count in seen.items() if count > 1)
        undecided = sorted((seen - Counter(self.decided_rows())).elements())
        if twice or undecided:
            raise ExactlyOnceError(f"visible twice {twice}; visible but not decided "
                                   f"{undecided}")
        shown = [batch for batch, rows in sorted(self.decided.items()) if seen.keys() & rows]
        for batch in range(max(shown, default=-1)):
            hidden = sorted(set(self.decided.get(batch, ())) - seen.keys())
            if hidden:
                raise ExactlyOnceError(f"rows of batch {max(shown)} are visible before rows "
                                       f"{hidden} of batch {batch}")

    def teardown(self) -> None:
        self.stats.decided_batches[len(self.decided)] += 1
        try:
            if self.started:
                self.say("every process dies; a last run starts")
                self.live, self.zombies = None, []
                self.new_run()
        finally:
            shutil.rmtree(self.state_dir, ignore_errors=True)


def _key(txn_id: TxnId) -> tuple[int, int, int, int]:
    """What names a task attempt's transaction within one query."""
    return txn_id.epoch, txn_id.batch, txn_id.partition, txn_id.attempt


@contextlib.contextmanager
def _lost_is_a_violation() -> Iterator[None]:
    try:
        yield
    except TransactionLostError as exc:
        raise ExactlyOnceError(f"a decided transaction was lost: {exc.cause}") from exc


def model_machine(new_target: Callable[[], Target], *,
                  coordinator_class: type[Coordinator] = Coordinator,
                  store_class: type[StateStore] = StateStore,
                  pipeline_class: type[CommitPipeline] | None = None,
                  state_root: str | None = None,
                  stats: ModelStats | None = None) -> type[ProtocolModel]:
    """The model bound to ``new_target`` (and a protocol variant, for tests of the model).

    ``state_root``: where the examples' state directories go (default: the temp directory).
    """
    return type("ProtocolModel", (ProtocolModel,), {
        "new_target": staticmethod(new_target), "coordinator_class": coordinator_class,
        "store_class": store_class, "pipeline_class": pipeline_class,
        "state_root": state_root, "stats": stats or ModelStats()})


def run_model(new_target: Callable[[], Target], *, max_examples: int | None = None,
              coordinator_class: type[Coordinator] = Coordinator,
              store_class: type[StateStore] = StateStore,
              pipeline_class: type[CommitPipeline] | None = None,
              state_root: str | None = None,
              **overrides: Any) -> ModelStats:
    """Run the model over fresh targets from ``new_target``; raise on the first violation.

    ``max_examples`` overrides the profile's (the CI profile bounds it per sink); further
    keyword arguments are hypothesis settings.
    """
    stats = ModelStats()
    machine = model_machine(new_target, coordinator_class=coordinator_class,
                            store_class=store_class, pipeline_class=pipeline_class,
                            state_root=state_root, stats=stats)
    chosen = profile()
    if max_examples is not None:
        overrides["max_examples"] = max_examples
    started = time.monotonic()
    with _young_heap_only():
        run_state_machine_as_test(machine, settings=settings(chosen, **overrides))
    stats.seconds = time.monotonic() - started
    return stats


@contextlib.contextmanager
def _young_heap_only() -> Iterator[None]:
    """Keep what the process holds before the model out of the model's collections.

    Every simulated executor death runs ``gc.collect()`` (its connections close, as the OS
    closes them); a full collection walks the whole heap, which in a long-lived process (a
    test session with Spark, pandas and its servers' clients loaded) is hundreds of MB: the
    model ran ten times slower there than alone. Frozen, the old objects are not walked;
    everything the model creates still is.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
