"""The driver side of the protocol, independent of Spark: decide, commit, recover, sweep.

One :class:`Coordinator` serves one run (one fencing epoch) of one query, in one process, for
one step (a batch, a recovery, a cleanup pass): it opens the sink's committer on first use and
closes it when it is closed (use it as a context manager). The committer is all it knows of
the sink's driver side: fencing, listing in doubt, the checks before a decision, the commit
stages, publishing and aborting all go through it (a sink group is a sink whose committer
gives one commit stage per member; nothing here knows more of groups). When the run starts
(:meth:`Coordinator.start`) it commits what earlier runs decided and aborts what they left
undecided, before its first task writes. Then, for every batch:

1. finish earlier decided batches that are not done (recovery after a crash);
2. if the batch is already decided, it is a replay: abort the new handles, finish the old ones;
3. abort in-doubt transactions of this query that no decision references and that belong to
   this or an earlier batch, or to an earlier run (orphans of failed attempts and crashes);
   then refuse to decide what could not be committed now (``check_committable``, retried
   within the policy) or may expire before its commit (``commit_deadline``): the batch's
   transactions are aborted and it is written again;
4. write the decision (batch + handles) to the state file, fenced by the epoch;
5. commit every handle, stage after stage as the committer orders them (``commit_stages``):
   each stage through its committer's ``commit_handles`` (by default the first handle, then
   the rest in parallel; a committer that settles a stage in one commit, once), retrying
   retryable errors; let the sink publish the
   batch as a whole (``Committer.finish_batch``, a manifest); mark the batch done.

A crash between 4 and 5 is finished by step 1 of the next run. Nothing ever aborts a
transaction that a decision references.

Each step counts what it did (decided, committed, orphans aborted, retries, ...) into the
query's cumulative metrics in the state file, in the writes it makes anyway (see
:mod:`twophase._metrics`); only rare events (a fenced run, a lost transaction, a given-up
batch's sweeps) make a write of counts alone, at the end of the step.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Concatenate, NamedTuple, ParamSpec, TypeVar

from twophase._aborts import abort_quietly
from twophase._crash import (
    AFTER_DECISION,
    BEFORE_DECISION,
    BEFORE_DONE,
    BETWEEN_MEMBERS,
    MID_COMMIT,
    crash_point,
)
from twophase._eligibility import is_orphan
from twophase._handle import Handle, TxnId
from twophase._metrics import (
    BATCHES_COMMITTED,
    BATCHES_DECIDED,
    BATCHES_EXPIRING,
    BATCHES_GIVEN_UP,
    COMMIT_SECONDS,
    DECISION_SECONDS,
    MEMBERS_LOST,
    ORPHANS_ABORTED,
    ORPHANS_FOUND,
    ROWS_COMMITTED,
    RUNS_FENCED,
    TRANSACTIONS_COMMITTED,
    TRANSACTIONS_LOST,
    Counts,
    Tally,
    key,
    observation,
    retry_key,
)
from twophase._retry import RetryPolicy
from twophase._state import HISTORY_LIMIT, BatchRecord, Decision, State, StateStore
from twophase.errors import (
    ConfigurationError,
    FatalError,
    FencedError,
    RetryableError,
    TransactionLostError,
    TwoPhaseError,
)
from twophase.sink import (
    AbortOutcome,
    CommitOutcome,
    CommitStage,
    Committer,
    StageCommits,
    TwoPhaseCommitSink,
    in_order,
)

log = logging.getLogger(__name__)

R = TypeVar("R")
P = ParamSpec("P")

#: How long a failed batch's abort waits before it sweeps a second time: longer than Spark
#: takes to end a cancelled Python task (``spark.python.task.killTimeout``, 2 s by default).
STRAGGLER_GRACE_S = 3.0
#: The deadline gate's margin: how long before a transaction's deadline (see
#: ``TwoPhaseCommitSink.commit_deadline``) a batch holding it is no longer decided. Longer than
#: a decision and the commits after it take, retries included.
DEADLINE_MARGIN_S = 30.0

#: How often a long-lived coordinator of a pipelined run (``twophase._pipeline``) sweeps for
#: orphans (see ``Coordinator._sweep_due``); its first batch, and the next after a failed one,
#: always do. A coordinator's default: every batch.
SWEEP_INTERVAL_S = 10.0

#: What a named crash point does when the driver reaches it (``twophase._crash.crash_point``:
#: SIGKILL the session if the environment arms it there; the model springs its traps instead).
CrashPoint = Callable[[str, int], None]


Step = Callable[Concatenate["Coordinator", P], R]


class Decided(NamedTuple):
    """A batch decided (durably) and not yet committed; how long the decision's write took."""

    decision: Decision
    decision_ms: float


def _step(step: Step[P, R]) -> Step[P, R]:
    """A driver-side step: a FencedError counts a fenced run; the step's counts that no
    write took are written at its end."""

    def counted(coordinator: Coordinator, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return step(coordinator, *args, **kwargs)
        except FencedError:
            coordinator.tally.add(RUNS_FENCED)
            raise
        finally:
            coordinator.write_counts()

    return functools.update_wrapper(counted, step)


class Coordinator:
    """Decides and commits the batches of one run of one query."""

    def __init__(
        self,
        sink: TwoPhaseCommitSink[Any],
        store: StateStore,
        *,
        namespace: str,
        epoch: int,
        retry: RetryPolicy | None = None,
        crash_point: CrashPoint = crash_point,
        straggler_grace_s: float = STRAGGLER_GRACE_S,
        deadline_margin_s: float = DEADLINE_MARGIN_S,
        sweep_interval_s: float = 0.0,
    ) -> None:
        self._open_committer = sink.committer  # the sink itself is not kept: see committer
        self.store = store
        self.namespace = namespace
        self.epoch = epoch
        self.retry = retry or RetryPolicy()
        self.crash_point = crash_point
        self.straggler_grace_s = straggler_grace_s
        self.deadline_margin_s = deadline_margin_s
        self.sweep_interval_s = sweep_interval_s
        self._swept_at: float | None = None  # when this coordinator's batches last swept
        self._committer: Committer | None = None  # opened on first use, closed by close()
        self._claimed: str | None = None  # the query the committer is fenced for
        #: Counts of this process not written yet (see twophase._metrics).
        self.tally = Tally()

    def __enter__(self) -> Coordinator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the sink's committer, if one was opened."""
        committer, self._committer = self._committer, None
        if committer is not None:
            committer.close()

    @property
    def committer(self) -> Committer:
        """The sink's driver side, opened on first use: all this coordinator reaches of it."""
        if self._committer is None:
            self._committer = self._open_committer()
        return self._committer

    # -- the two entry points of a batch ---------------------------------------------------

    @_step
    def commit_batch(self, batch: int, query_id: str, handles: Sequence[Handle]) -> None:
        """Decide ``batch`` with ``handles`` and make it visible (see the module docstring)."""
        decided = self._decide_batch(batch, query_id, handles)
        if decided is not None:
            self._finish(decided.decision, decision_ms=decided.decision_ms)

    @_step
    def decide_batch(self, batch: int, query_id: str, handles: Sequence[Handle]) -> Decided | None:
        """Steps 1 to 4 of :meth:`commit_batch`: the decision of ``batch``, durable, for
        :meth:`finish_decided` to commit (None: a replay, finished here)."""
        return self._decide_batch(batch, query_id, handles)

    @_step
    def finish_decided(self, decided: Decided) -> None:
        """Step 5 of :meth:`commit_batch`: commit a batch :meth:`decide_batch` decided."""
        self._finish(decided.decision, decision_ms=decided.decision_ms)

    def sweep_next_batch(self) -> None:
        """Sweep at the next decision whatever the interval says (a batch failed, so
        something may be in doubt)."""
        self._swept_at = None

    def _decide_batch(self, batch: int, query_id: str,
                      handles: Sequence[Handle]) -> Decided | None:
        state = self._owned_state(query_id)
        self._claim(query_id)
        self._finish_earlier(state, batch)
        if state.is_decided(batch):
            self._finish_replay(state, batch, handles)
            return None
        if batch <= state.aborted_batch:
            raise FatalError(f"batch {batch} was given up by this run and cannot be decided.",
                             fix="restart the query; it replays the batch")
        if self._sweep_due():
            self._sweep(state, query_id, up_to_batch=batch, keep=handles)
        self._refuse_uncommittable(batch, handles)
        self._refuse_expiring(batch, handles)
        self.crash_point(BEFORE_DECISION, batch)
        started = time.monotonic()
        decision = self._decide(batch, query_id, handles)
        decision_ms = (time.monotonic() - started) * 1000
        self.crash_point(AFTER_DECISION, batch)
        return Decided(decision, decision_ms)

    def _finish_earlier(self, state: State, batch: int) -> None:
        """Commit the decided batches before ``batch`` that are not done, oldest first:
        batches become visible in order."""
        for decision in _oldest_first(state.pending):
            if decision.batch < batch:
                self._finish(decision)

    def _sweep_due(self) -> bool:
        """Is a batch's sweep due? Always for a coordinator's first batch (or after a failed
        one); then once per ``sweep_interval_s`` (0: every batch). In a run whose batches
        succeed nothing of its own is left in doubt (a retried task aborts its failed attempts
        itself), so a pipelined run's long-lived coordinator asks the systems for their
        in-doubt transactions only as often as a zombie's or a straggler's could appear."""
        now = time.monotonic()
        if self._swept_at is not None and now - self._swept_at < self.sweep_interval_s:
            return False
        self._swept_at = now
        return True

    @_step
    def abort_batch(self, batch: int, query_id: str | None, handles: Sequence[Handle]) -> None:
        """Spark gave up on ``batch``: discard its transactions unless it is decided.

        Before sweeping, the run records that it gave up on the batch: a task that pre-commits
        after the sweep listed the batch's transactions sees the record and aborts its own
        (see ``_spark.write_partition``), and cleanup knows them for orphans at once. A second
        sweep, once cancelled tasks have ended, aborts what a task killed mid-write left.
        """
        state = self.store.read()
        if state is not None and state.query_id in (None, query_id) and state.is_decided(batch):
            log.warning("batch %d is decided: not aborting it; the next run finishes it", batch)
            return
        self._abort_all(handles)
        self.sweep_next_batch()
        if state is None or state.epoch != self.epoch or query_id is None:
            return  # fenced or never started: sweeping is the owner's job
        try:
            state = self._write(lambda current: _gave_up(current, batch, query_id),
                                epoch=self.epoch)
        except FencedError:
            self.tally.add(RUNS_FENCED)
            return
        self._claim(query_id)
        self._sweep(state, query_id, up_to_batch=batch, keep=())
        time.sleep(self.straggler_grace_s)  # cancelled tasks end meanwhile: sweep what they left
        self._sweep(state, query_id, up_to_batch=batch, keep=())
        log.warning("batch %d failed and was aborted: none of its rows are visible", batch)

    @_step
    def recover(self) -> None:
        """Finish every decided batch left pending by an earlier run, oldest first."""
        self._recover()

    def _recover(self) -> None:
        state = self.store.read_existing()
        if state.pending and state.query_id is not None:
            self._claim(state.query_id)
        for decision in _oldest_first(state.pending):
            log.info("recovering decided batch %d (%d transactions)",
                     decision.batch, len(decision.handles))
            self._finish(decision)

    def record_query(self, query_id: str) -> None:
        """Name the query in the state file as soon as it is known (before its first decision),
        so that cleanup recognises its transactions."""
        self.store.update(lambda s: s if s.query_id else replace(s, query_id=query_id),
                          epoch=self.epoch)

    @_step
    def start(self, query_id: str | None) -> None:
        """Begin a run: finish what earlier runs decided, abort what can never be decided.

        Earlier runs' undecided transactions can never be decided (those runs are fenced), nor
        can this epoch's of a batch that is done or given up; in a database they hold row locks
        that the replay of their batch would wait for: abort them before this run's first task
        writes. With the state's current epoch instead of a new one, this takes nothing over
        and is safe beside a live run (as cleanup is): a start that will refuse (a schema
        change) does it first, so that no lock of a crashed run blocks the change that fixes it.
        """
        self._recover()
        if query_id is not None:
            self._claim(query_id)
            state = self.store.read_existing()
            self._sweep(state, query_id, up_to_batch=state.settled_batch, keep=())

    def write_counts(self) -> None:
        """Write the counts that no other write took; a failure loses counts, nothing else."""
        counts = self.tally.snapshot()
        if not counts:
            return
        try:
            self.store.update(lambda state: state.counted(counts), epoch=None)
        except TwoPhaseError as exc:
            log.warning("could not record the metrics of query state %s: %s",
                        self.store.path, exc)
            return
        self.tally.settle(counts)

    # -- steps -----------------------------------------------------------------------------

    def _write(self, change: Callable[[State], State], *, epoch: int | None) -> State:
        """``store.update`` that also writes the counts gathered so far."""
        counts = self.tally.snapshot()
        state = self.store.update(lambda current: change(current).counted(counts), epoch=epoch)
        self.tally.settle(counts)
        return state

    def _retried(self, operation: str) -> Callable[[RetryableError], None]:
        """What counts one retry of ``operation``, by the kind of error that caused it."""
        return lambda error: self.tally.add(retry_key(operation, error))

    def _owned_state(self, query_id: str) -> State:
        state = self.store.read_existing()
        self.store.check_epoch(state, self.epoch)
        if state.query_id not in (None, query_id):
            raise ConfigurationError(
                f"the state file {self.store.path} belongs to query {state.query_id}, "
                f"but this is query {query_id} (a new checkpoint with an old state location?).",
                fix="give each checkpoint its own state location",
            )
        return state

    def _claim(self, query_id: str) -> None:
        """Fence the sink for this run's epoch, once per process (see TwoPhaseCommitSink.fence)."""
        if self._claimed != query_id:
            self.retry.call(lambda: self.committer.fence(self.namespace, query_id, self.epoch),
                            what=f"fencing query {query_id} at epoch {self.epoch}",
                            on_retry=self._retried("fence"))
            self._claimed = query_id

    def _finish_replay(self, state: State, batch: int, handles: Sequence[Handle]) -> None:
        log.info("batch %d is a replay of a decided batch: aborting its %d new transactions",
                 batch, len(handles))
        self._abort_all(handles)
        decision = state.decision(batch)
        if decision is not None:
            self._finish(decision)

    def _sweep(
        self, state: State, query_id: str, *, up_to_batch: int, keep: Iterable[Handle]
    ) -> None:
        """Abort this query's orphans: undecided, and from this or an earlier batch or run."""
        protected = state.decided_txns() | {handle.txn_id for handle in keep}
        in_doubt = self.retry.call(lambda: self.committer.list_in_doubt(self.namespace),
                                   what=f"listing in-doubt transactions of {self.namespace}",
                                   on_retry=self._retried("list_in_doubt"))
        orphans = [handle for handle in in_doubt
                   if handle.txn_id not in protected and is_orphan(
                       handle.txn_id, query_id=query_id, epoch=self.epoch,
                       up_to_batch=up_to_batch)]
        for orphan in orphans:
            log.info("aborting orphan transaction %s", orphan.txn_id)
        aborted = self._abort_all(orphans)
        self.tally.add_all({ORPHANS_FOUND: len(orphans),
                            ORPHANS_ABORTED: sum(outcome is not None for outcome in aborted)})

    def _decide(self, batch: int, query_id: str, handles: Sequence[Handle]) -> Decision:
        decision = Decision(batch, self.epoch, time.time(), tuple(handles))

        def add(state: State) -> State:
            return replace(state, query_id=query_id,
                           pending=(*state.pending, decision)).counted({BATCHES_DECIDED: 1})

        self._write(add, epoch=self.epoch)
        return decision

    def _finish(self, decision: Decision, *, decision_ms: float | None = None) -> None:
        """Commit a decided batch and mark it done (``decision_ms``: if decided just now)."""
        started = time.monotonic()
        outcomes = self._commit_all(decision)
        self.retry.call(lambda: self.committer.finish_batch(self.namespace, decision.batch,
                                                            decision.handles),
                        what=f"publishing batch {decision.batch}",
                        on_retry=self._retried("publish"))
        commit_ms = (time.monotonic() - started) * 1000
        self.crash_point(BEFORE_DONE, decision.batch)
        record = BatchRecord(
            batch=decision.batch,
            epoch=decision.epoch,
            txns=len(outcomes),  # a sink group's: one per member transaction
            rows=sum(handle.rows for handle in decision.handles),
            already_committed=outcomes.count(CommitOutcome.ALREADY_COMMITTED),
            decided_at=decision.decided_at,
            done_at=time.time(),
            decision_ms=decision_ms or 0.0,
            commit_ms=commit_ms,
        )
        counts = {BATCHES_COMMITTED: 1, ROWS_COMMITTED: record.rows,
                  TRANSACTIONS_COMMITTED: record.txns,
                  **observation(COMMIT_SECONDS, commit_ms / 1000)}
        if decision_ms is not None:
            counts.update(observation(DECISION_SECONDS, decision_ms / 1000))
        self._write(lambda current: _mark_done(current, record, counts), epoch=None)
        log.info("batch %d committed: %d rows in %d transactions (%d already committed), "
                 "commit %.1f ms", record.batch, record.rows, record.txns,
                 record.already_committed, commit_ms)

    def _commit_all(self, decision: Decision) -> list[CommitOutcome]:
        """Commit the decision stage by stage, as the committer orders them (a sink group's
        members one after the other, any other sink's handles in one stage); a lost
        transaction after an earlier stage committed splits the batch, and says so."""
        for handle in decision.handles:
            self.committer.require_own(handle)
        outcomes: list[CommitOutcome] = []
        committed: list[str] = []
        for number, stage in enumerate(self.committer.commit_stages(decision.handles)):
            if number:
                self.crash_point(BETWEEN_MEMBERS, decision.batch)
            try:
                outcomes.extend(self._commit_stage(decision.batch, stage))
            except TransactionLostError as exc:
                if stage.label is None:
                    raise
                self.tally.add(key(MEMBERS_LOST, stage.label))
                raise _split(decision.batch, committed, stage.label, exc) from exc
            committed.append(str(stage.label))
        return outcomes

    def _commit_stage(self, batch: int, stage: CommitStage) -> list[CommitOutcome]:
        """The stage's committer commits its handles (:meth:`Committer.commit_handles`), with
        this coordinator's commits: retried, counted, the mid-commit crash point passed."""
        if not stage.handles:
            return []
        commits = _CoordinatorCommits(stage.committer, self, batch, stage.parallelism)
        return stage.committer.commit_handles(stage.handles, commits)

    def _refuse_uncommittable(self, batch: int, handles: Sequence[Handle]) -> None:
        """Decide nothing that a system could not commit now (a sink group's HTTP member
        whose receiver is down): wait within the retry policy, else give the batch up."""
        try:
            self.retry.call(lambda: self.committer.check_committable(handles),
                            what=f"the check that batch {batch} can be committed",
                            on_retry=self._retried("check_committable"))
        except TwoPhaseError:
            self._abort_all(handles)
            raise

    def _refuse_expiring(self, batch: int, handles: Sequence[Handle]) -> None:
        """The deadline gate: a transaction that may expire before the batch's commit could
        end is not decided; the batch is given up instead (aborted, replayed by Spark)."""
        latest_safe = time.time() + self.deadline_margin_s
        expiring = [(handle, deadline) for handle in handles
                    if (deadline := self.committer.commit_deadline(handle)) is not None
                    and deadline < latest_safe]
        if not expiring:
            return
        handle, deadline = min(expiring, key=lambda pair: pair[1])
        self.tally.add(BATCHES_EXPIRING)
        self._abort_all(handles)
        raise RetryableError(
            f"batch {batch} is not decided: transaction {handle.txn_id} may expire in "
            f"{max(deadline - time.time(), 0):.0f} s, less than the {self.deadline_margin_s:.0f} s "
            "its commit may take; deciding it could leave the batch half-visible. Its "
            "transactions are aborted and the batch is written again.",
            fix="let the sink's transactions live longer (Kafka: transaction_timeout_ms) or "
            "make batches quicker to write (fewer rows per trigger, more partitions)")

    def commit_retried(self, action: Callable[[], R], what: str) -> R:
        """A commit (of one transaction or of a stage at once), retried within the policy; a
        lost transaction counted."""
        try:
            return self.retry.call(action, what=what, on_retry=self._retried("commit"))
        except TransactionLostError:
            self.tally.add(TRANSACTIONS_LOST)
            raise

    def abort_quietly(self, handle: Handle) -> AbortOutcome | None:
        """Abort an undecided transaction through the committer; a failure is logged (see
        :func:`twophase._aborts.abort_quietly`)."""
        return abort_quietly(self.committer, handle, self.retry, self._retried("abort"))

    def _abort_all(self, handles: Sequence[Handle]) -> list[AbortOutcome | None]:
        return self.in_parallel(self.abort_quietly, handles)

    def in_parallel(self, action: Callable[[Handle], R], items: Sequence[Handle],
                     parallelism: int | None = None) -> list[R]:
        parallelism = parallelism or self.committer.commit_parallelism
        if len(items) <= 1 or parallelism <= 1:
            return [action(item) for item in items]
        workers = min(parallelism, len(items))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="twophase") as pool:
            return list(pool.map(action, items))


@dataclass(frozen=True)
class _CoordinatorCommits(StageCommits):
    """A stage's commits as the coordinator runs them: the first alone, the ``mid_commit``
    crash point, then the rest in parallel; a stage settled at once is the first commit."""

    coordinator: Coordinator
    batch: int
    parallelism: int

    def one_by_one(self, handles: Sequence[Handle]) -> list[CommitOutcome]:
        first, *rest = handles
        outcomes = [self._commit(first)]
        self.coordinator.crash_point(MID_COMMIT, self.batch)
        outcomes.extend(self.coordinator.in_parallel(self._commit, rest, self.parallelism))
        return outcomes

    def at_once(self, settle: Callable[[], Mapping[TxnId, CommitOutcome]],
                handles: Sequence[Handle]) -> list[CommitOutcome]:
        outcomes = self.coordinator.commit_retried(
            lambda: in_order(settle(), handles),
            what=f"commit of batch {self.batch} ({len(handles)} transactions at once)")
        self.coordinator.crash_point(MID_COMMIT, self.batch)
        return outcomes

    def _commit(self, handle: Handle) -> CommitOutcome:
        return self.coordinator.commit_retried(lambda: self.committer.commit(handle),
                                               what=f"commit of transaction {handle.txn_id}")


def _split(batch: int, committed: Sequence[str], member: str,
           lost: TransactionLostError) -> TransactionLostError:
    return TransactionLostError(
        f"batch {batch} is split: member(s) {', '.join(map(repr, committed)) or 'none'} "
        f"committed it, but member {member!r} lost a decided transaction: {lost.cause}",
        fix=(lost.fix or "") + " The batch's rows are in the committed members and not in "
        f"{member!r}: reconcile {member!r} from them (see the docs, docs/groups.md, "
        "'A split batch').")


def _gave_up(current: State, batch: int, query_id: str) -> State:
    if current.is_decided(batch):
        return current  # cannot happen with Spark; a decision always wins
    return replace(current, query_id=current.query_id or query_id,
                   aborted_batch=max(current.aborted_batch, batch)).counted(
                       {BATCHES_GIVEN_UP: 1} if batch > current.aborted_batch else {})


def _oldest_first(decisions: Iterable[Decision]) -> list[Decision]:
    return sorted(decisions, key=lambda decision: decision.batch)


def _mark_done(current: State, record: BatchRecord, counts: Counts) -> State:
    if current.decision(record.batch) is None and record.batch <= current.last_done_batch:
        return current  # another process (a zombie, cleanup) finished it first: it counted
    return replace(
        current,
        pending=tuple(d for d in current.pending if d.batch != record.batch),
        last_done_batch=max(current.last_done_batch, record.batch),
        history=(*current.history, record)[-HISTORY_LIMIT:],
    ).counted(counts)
