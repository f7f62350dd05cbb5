"""One chaos round: a real Spark job streams a feed into a sink while faults are injected.

The driver (:func:`twophase.testing.driver.launch`, a process session of its own) is started
again and again until every batch of the feed is done; before each start the round draws the
fault of that run (until its budget is spent):

============== ==========================================================================
fault          what happens
============== ==========================================================================
driver kill    the driver is armed at a random crash point for one of its next batches
               and SIGKILLs its whole session there (driver, JVM, Python workers); over a
               group, between two members' commits too
zombie driver  a driver is frozen (SIGSTOP of its whole session) after it has done a
               batch; a second driver starts on the same checkpoint and state, and once
               it has taken the query over (a newer epoch) the first is thawed (SIGCONT):
               a zombie whose epoch is stale, running beside (or after) its successor
server kill    the sink's server is SIGKILLed mid-batch (soon after the run's first batch)
               and started again on the same data a few seconds later
network cut    the proxy resets every connection to the server and refuses new ones for a
               few seconds (mid-batch, as a server kill)
network reset  the proxy resets every open connection once (mid-batch)
network slowed every chunk through the proxy waits a few hundred ms, for a few seconds
member down    (groups) a member's server is SIGKILLed mid-batch and kept down for longer
               than a batch: while it is down no batch may be decided (none can pre-commit
               on it), so the state's last decided batch and what a reader of the first
               member sees must not move past where they were as it went down
============== ==========================================================================

Over a group (:class:`~chaos.systems.GroupSystem`) each server or network fault strikes at one
member, drawn among those it applies to; a member with no server (a Delta table, a local path)
gets the driver kills and zombie drivers only, the group's other members their server and
network faults.

After every run nothing may be visible twice, and no member of a group may show a row that a
member committing before it lacks (an event in the topic before its row in the table); at the
end every row of the feed must be visible exactly once in every member (a member lacking rows
of a batch the first one shows is a split batch), the state must have nothing pending and the
sinks nothing in doubt.
"""

from __future__ import annotations

import itertools
import logging
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from chaos.systems import (
    DRIVER_KILL,
    MEMBER_DOWN,
    NETWORK_CUT,
    NETWORK_RESET,
    NETWORK_SLOW,
    SERVER_KILL,
    ZOMBIE,
    System,
    in_doubt,
)
from twophase.testing import ExactlyOnceError, GroupTarget, Target
from twophase.testing.crash_points import (
    COMMITTING_BEHIND,
    CRASH_POINTS,
    GROUP_CRASH_POINTS,
    signal_session,
)
from twophase.testing.driver import POLL_INTERVAL_S, DriverSpec, RunResult, generate_feed, launch
from twophase.testing.protocol import StateStore

log = logging.getLogger(__name__)

#: How often a run's fault is a driver kill, relative to each other kind.
DRIVER_KILL_WEIGHT = 3
#: Share of rounds run through the foreachBatch adapter instead of the Data Source.
FOREACH_BATCH_SHARE = 0.3
#: Share of rounds whose stream runs until stopped (each batch committing behind the next)
#: instead of ending by itself (``availableNow``: each batch committed inside it).
PIPELINED_SHARE = 0.5
#: The trigger of such a round: as fast as possible (the driver stops it once the feed is in).
PIPELINED_TRIGGER = {"processingTime": "0 seconds"}
#: A server or network fault strikes this many seconds after the run's first batch is done.
FAULT_DELAY_S = (0.0, 1.5)
#: ...and lasts this long (a reset is instant).
OUTAGE_S = (1.0, 5.0)
#: A member down stays down this long (a batch takes a second or two)...
MEMBER_DOWN_S = (8.0, 12.0)
#: ...and its checks start this long after it went down (a batch whose every pre-commit was
#: done may still be decided then).
DOWN_GRACE_S = 2.0
SLOW_CHUNK_DELAY_S = (0.05, 0.3)
#: A zombie is thawed this many seconds after its successor took the query over.
THAW_AFTER_S = (0.0, 4.0)
ZOMBIE_PROGRESS_TIMEOUT_S = 120.0
#: A round that needs more runs than this per batch has stopped making progress.
MAX_RUNS_PER_BATCH = 3
#: The return code recorded for a driver that had to be killed because it hung.
HUNG_RETURNCODE = 124
#: How a run's part of the round's driver log starts (twophase.testing.driver.launch).
RUN_HEADER = "=== driver run, crash point "
#: How much of a failed run's reason the round prints.
STOPPED_CHARS = 240


@dataclass
class RoundResult:
    sink: str
    adapter: str
    rows_in: int = 0
    visible: int = 0
    duplicates: int = 0
    missing: int = 0
    in_doubt: int = 0
    finished: bool = False
    runs: int = 0
    crash_runs: int = 0  # runs with at least one fault injected
    failed_runs: int = 0  # ended non-zero without a SIGKILL: a fault it could not ride out
    zombies_fenced: int = 0
    #: Groups: the most rows a member showed that a member committing before it lacked
    #: ("events seen before their row"), after any run.
    before_their_row: int = 0
    #: Groups, at the end: batches that the first member shows and a later one lacks rows of.
    split_batches: int = 0
    #: The most feed files with a row missing while a later file's rows were visible, after
    #: any run (batches visible out of order).
    out_of_order: int = 0
    #: Member down: batches decided (or shown by the first member) while a member was down,
    #: beyond those decided as it went down; and how many times that was checked.
    ahead_while_down: int = 0
    checks_while_down: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    logs: Path | None = None

    @property
    def exactly_once(self) -> bool:
        return (self.finished and self.duplicates == self.missing == self.in_doubt == 0
                and self.before_their_row == self.split_batches == self.ahead_while_down == 0
                and self.out_of_order == 0
                and self.visible == self.rows_in)


@dataclass
class Round:
    """One feed through one fresh target of ``system``, with ``budget`` faulty runs."""

    system: System
    workdir: Path
    rng: random.Random
    batches: int
    rows_per_batch: int
    budget: int
    #: The fault kinds to draw from; None: every kind the system supports.
    kinds: tuple[str, ...] | None = None
    #: A server or network fault strikes this many seconds after the run's first batch.
    fault_delay_s: tuple[float, float] = FAULT_DELAY_S
    #: How long a member down stays down.
    down_s: tuple[float, float] = MEMBER_DOWN_S
    #: A group's member that server and network faults strike at; None: drawn per fault.
    strike: str | None = None
    #: Whether the stream runs until stopped, committing each batch behind the next; None:
    #: drawn (:data:`PIPELINED_SHARE`).
    commits_behind: bool | None = None
    target: Target = field(init=False)
    #: The member system the run's server or network fault strikes at.
    victim: System = field(init=False)
    _down_until: float = field(init=False, default=0.0)
    #: The last run ended by itself with exit 0: the feed is done (``availableNow`` stops a
    #: query once every file is in), however many micro-batches it took.
    _feed_done: bool = field(init=False, default=False)
    #: The round's stream runs until stopped: each batch commits behind the next.
    pipelined: bool = field(init=False, default=False)
    spec: DriverSpec = field(init=False)
    store: StateStore = field(init=False)

    def play(self) -> RoundResult:
        started = time.monotonic()
        self.target = self.system.new_target()
        foreach_batch = self.rng.random() < FOREACH_BATCH_SHARE
        drawn = self.rng.random() < PIPELINED_SHARE
        self.pipelined = drawn if self.commits_behind is None else self.commits_behind
        adapter = ("foreachBatch" if foreach_batch else "data source") + (
            ", commits behind" if self.pipelined else "")
        result = RoundResult(self.system.name, adapter, logs=self.workdir)
        result.rows_in = generate_feed(self.workdir / "feed", files=self.batches,
                                       rows_per_file=self.rows_per_batch,
                                       seed=self.rng.randrange(10**6))
        self.spec = DriverSpec.into(self.target, self.workdir,
                                    checkpoint=str(self.workdir / "checkpoint"),
                                    foreach_batch=foreach_batch,
                                    **({"trigger": PIPELINED_TRIGGER, "stop_when_done": True}
                                       if self.pipelined else {}))
        self.store = self.spec.state_store()
        while not self._feed_done and result.runs < self.batches * MAX_RUNS_PER_BATCH:
            kind = self._draw() if result.crash_runs < self.budget else None
            self._run(kind, result)
            self._restore()
            self._look(result)
        self._judge(result)
        result.seconds = time.monotonic() - started
        return result

    # -- faults ------------------------------------------------------------------------------

    def _draw(self) -> str:
        kinds = [DRIVER_KILL] * DRIVER_KILL_WEIGHT + [ZOMBIE, *self.system.server_faults]
        kind = self.rng.choice([kind for kind in kinds if kind in (self.kinds or kinds)])
        down = SERVER_KILL if kind == MEMBER_DOWN else kind
        victims = [member for name, member in self.system.members.items()
                   if down in member.server_faults and self.strike in (None, name)]
        victims = victims or [self.system]
        self.victim = self.rng.choice(victims) if len(victims) > 1 else victims[0]
        return kind

    def _run(self, kind: str | None, result: RoundResult) -> None:
        injected: Counter[str] = Counter()
        if kind == ZOMBIE:
            outcomes = self._zombie(injected)
        elif kind == DRIVER_KILL:
            outcomes = [self._launch(self._armed(), injected=injected)]
        elif kind is None:
            outcomes = [self._launch()]
        else:
            tick = self._server_fault(kind, injected, result)
            outcomes = [self._launch(while_running=tick)]
            while kind == MEMBER_DOWN and time.monotonic() < self._down_until:
                tick()  # the driver gave up: the member stays down (and checked) all the same
                time.sleep(POLL_INTERVAL_S)
        self._feed_done = outcomes[-1].returncode == 0 and not outcomes[-1].crashed
        for outcome in outcomes:
            result.runs += 1
            result.failed_runs += not outcome.crashed and outcome.returncode != 0
        if kind == ZOMBIE and injected and outcomes[0].returncode != 0:
            result.zombies_fenced += 1
        result.crash_runs += bool(injected)
        result.faults.update(injected)
        at = f" at {self.victim.name}" if injected.keys() - {DRIVER_KILL, ZOMBIE} else ""
        log.info("  run %d: %s%s -> %s", result.runs,
                 ", ".join(injected) or "no fault", at, _ending(outcomes[-1]))
        for outcome in outcomes:
            if not outcome.crashed and outcome.returncode != 0:
                log.info("    %s", _stopped(outcome))

    def _armed(self) -> str:
        batch = min(self._next_batch() + self.rng.randrange(2), self.batches - 1)
        points = GROUP_CRASH_POINTS if len(self.system.members) > 1 else CRASH_POINTS
        if self.pipelined:
            points = (*points, COMMITTING_BEHIND)
        return f"{self.rng.choice(points)}@{batch}"

    def _launch(self, crash_at: str | None = None, *, injected: Counter[str] | None = None,
                while_running: Callable[[], None] | None = None,
                on_start: Callable[[int], None] | None = None,
                workdir: str = "runs") -> RunResult:
        try:
            outcome = launch(self.spec, workdir=self.workdir / workdir, crash_at=crash_at,
                             while_running=while_running, on_start=on_start)
        except TimeoutError as exc:  # killed by launch: a finding, but the round goes on
            log.error("  %s", exc)
            return RunResult(HUNG_RETURNCODE, crashed=False, log=self.workdir / workdir)
        if crash_at and outcome.crashed and injected is not None:
            injected[DRIVER_KILL] += 1
        return outcome

    def _server_fault(self, kind: str, injected: Counter[str],
                      result: RoundResult) -> Callable[[], None]:
        """A ``while_running`` hook that strikes once, mid-batch: ``FAULT_DELAY_S`` after the
        run has done its first batch (a member down: checked while it is down)."""
        first_batch = self._next_batch()
        outage_s = self.rng.uniform(*(self.down_s if kind == MEMBER_DOWN else OUTAGE_S))
        delay_s = self.rng.uniform(*self.fault_delay_s)
        strike_at: list[float] = []
        heal_at: list[float] = []
        decided_as_down: list[int] = []

        def tick() -> None:
            now = time.monotonic()
            if not strike_at and self._next_batch() > first_batch:
                strike_at.append(now + delay_s)
            elif strike_at and not heal_at and now >= strike_at[0]:
                self._strike(kind)
                injected[kind] += 1
                heal_at.append(now + outage_s)
                self._down_until = heal_at[0] if kind == MEMBER_DOWN else 0.0
            elif heal_at and now >= heal_at[0]:
                self._restore()
            elif kind == MEMBER_DOWN and heal_at and now >= heal_at[0] - outage_s + DOWN_GRACE_S:
                self._check_down(decided_as_down, result)

        return tick

    def _check_down(self, decided_as_down: list[int], result: RoundResult) -> None:
        """While a member is down: nothing decided past the batches decided as it went down,
        and (read if it is up) the first member shows no row of a later batch."""
        decided = self._last_decided()
        if not decided_as_down:
            decided_as_down.append(decided)
            return
        ahead = decided - decided_as_down[0]
        first = next(iter(self._members().items()))
        if first[0] != self.victim.name:
            shown = {row // self.rows_per_batch for row in first[1].visible()}
            ahead = max(ahead, len({batch for batch in shown if batch > decided_as_down[0]}))
        result.checks_while_down += 1
        if ahead > 0:
            log.error("  %d batches decided while %s was down", ahead, self.victim.name)
        result.ahead_while_down = max(result.ahead_while_down, ahead)

    def _strike(self, kind: str) -> None:
        proxy = self.victim.proxy
        if kind in (SERVER_KILL, MEMBER_DOWN):
            self.victim.kill_server()
        elif proxy is None:
            raise ValueError(f"{self.victim.name} has no network to fault")
        elif kind == NETWORK_CUT:
            proxy.cut()
        elif kind == NETWORK_RESET:
            proxy.reset()
        elif kind == NETWORK_SLOW:
            proxy.slow(self.rng.uniform(*SLOW_CHUNK_DELAY_S))

    def _restore(self) -> None:
        for member in self.system.members.values():
            if member.proxy is not None:
                member.proxy.heal()
            member.start_server()

    def _zombie(self, injected: Counter[str]) -> list[RunResult]:
        """Freeze a driver after a batch, run a successor, thaw the zombie during it."""
        pids: list[int] = []
        ended: list[RunResult] = []
        zombie = threading.Thread(target=lambda: ended.append(self._launch(
            on_start=pids.append, workdir="zombie")), daemon=True)
        done_before = self._next_batch()
        zombie.start()
        deadline = time.monotonic() + ZOMBIE_PROGRESS_TIMEOUT_S
        while zombie.is_alive() and self._next_batch() == done_before \
                and time.monotonic() < deadline:
            time.sleep(0.2)
        if not zombie.is_alive() or not pids:
            zombie.join()
            return ended  # it finished the feed before it could be frozen: a plain run
        time.sleep(self.rng.uniform(0, 1))
        for _ in range(2):  # the second catches a process forked while the first went round
            signal_session(pids[0], signal.SIGSTOP)
        injected[ZOMBIE] += 1
        frozen_epoch = self._epoch()
        thaw_after_s = self.rng.uniform(*THAW_AFTER_S)
        thaw_at: list[float] = []

        def thaw_in_time() -> None:
            """Thaw the zombie once the successor has taken the query over (a newer epoch)."""
            if not thaw_at and self._epoch() > frozen_epoch:
                thaw_at.append(time.monotonic() + thaw_after_s)
            elif thaw_at and time.monotonic() >= thaw_at[0]:
                _thaw(pids[0])

        crash_at = self._armed() if self.rng.random() < 0.5 else None
        try:
            successor = self._launch(crash_at, injected=injected, while_running=thaw_in_time)
        finally:
            _thaw(pids[0])
        zombie.join()
        return [*ended, successor]

    # -- the verdict ---------------------------------------------------------------------------

    def _epoch(self) -> int:
        state = self.store.read() if self.store.exists() else None
        return state.epoch if state else 0

    def _next_batch(self) -> int:
        state = self.store.read() if self.store.exists() else None
        return state.last_done_batch + 1 if state else 0

    def _last_decided(self) -> int:
        state = self.store.read() if self.store.exists() else None
        return state.last_decided_batch if state else -1

    def _members(self) -> dict[str, Target]:
        """The target of each member in commit order (a sink's own target: just that)."""
        if isinstance(self.target, GroupTarget):
            return {name: self.target.members[name] for name in self.target.commit_order}
        return {self.system.name: self.target}

    def _look(self, result: RoundResult) -> list[int]:
        """What a reader of the (first) member sees, judged by the target: no row twice, and
        in a group no row in a member that one committing before it lacks. A violation is
        counted, from each member's reader, and the first member's rows returned."""
        try:
            seen = self.target.visible()
        except ExactlyOnceError as error:
            log.error("  %s", error)
        else:
            result.duplicates = max(result.duplicates, len(seen) - len(set(seen)))
            result.out_of_order = max(result.out_of_order, self._out_of_order(seen))
            return seen
        members = [target.visible() for target in self._members().values()]
        result.duplicates = max([result.duplicates] + [len(r) - len(set(r)) for r in members])
        result.before_their_row = max([result.before_their_row] + [
            len(set(later) - set(earlier)) for earlier, later in itertools.pairwise(members)])
        return members[0]

    def _out_of_order(self, seen: list[int]) -> int:
        """Feed files with a row missing before the last file with a visible row (each file
        is a batch, or part of one: a batch is visible whole, its files together)."""
        files = {row // self.rows_per_batch for row in seen}
        complete = Counter(row // self.rows_per_batch for row in set(seen))
        return sum(complete[file] < self.rows_per_batch for file in range(max(files, default=0)))

    def _judge(self, result: RoundResult) -> None:
        seen = self._look(result)
        expected = set(range(result.rows_in))
        result.visible = len(seen)
        result.duplicates = max(result.duplicates, len(seen) - len(set(seen)) +
                                len(set(seen) - expected))
        result.missing = len(expected - set(seen))
        state = self.store.read() if self.store.exists() else None
        if isinstance(self.target, GroupTarget):
            members = [set(target.visible()) for target in self._members().values()]
            result.split_batches = len({row // self.rows_per_batch for later in members[1:]
                                        for row in members[0] - later})
            result.in_doubt += sum(len(target.in_doubt()) for target in self._members().values())
        if state is not None:
            # not last_done_batch == batches - 1: a driver killed between Spark's source log
            # and its offset log makes the next micro-batch take two files
            result.finished = self._feed_done and not state.pending
            result.in_doubt += len(state.pending) + len(in_doubt(self.target, state.namespace))


def _thaw(session: int) -> None:
    signal_session(session, signal.SIGCONT)


def _stopped(outcome: RunResult) -> str:
    """Why a run that failed stopped: the last ``stopped:`` line of its log since it started
    (the logs of a round's runs go to one file), shortened."""
    try:
        run = outcome.log.read_text(errors="replace").rsplit(RUN_HEADER, 1)[-1]
    except OSError as exc:
        return f"(its log: {exc})"
    reasons = [line.split(" stopped: ", 1)[1] for line in run.splitlines() if " stopped: " in line]
    return (reasons[-1][:STOPPED_CHARS] if reasons
            else f"(no reason in {outcome.log}, exit {outcome.returncode})")


def _ending(outcome: RunResult) -> str:
    if outcome.crashed:
        return "killed"
    return "finished" if outcome.returncode == 0 else f"failed ({outcome.returncode})"
