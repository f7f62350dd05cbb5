"""One chaos round: a real Spark job streams a feed into a sink while faults are injected.

The driver (:func:`twophase.testing.driver.launch`, a process session of its own) is started
again and again until every batch of the feed is done; before each start the round draws the
fault of that run (until its budget is spent):

============== ==========================================================================
fault          what happens
============== ==========================================================================
driver kill    the driver is armed at a random crash point for one of its next batches
               and SIGKILLs its whole session there (driver, JVM, Python workers)
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
============== ==========================================================================

After every run nothing may be visible twice; at the end every row of the feed must be visible
exactly once, the state must have nothing pending and the sink nothing in doubt.
"""

from __future__ import annotations

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
    NETWORK_CUT,
    NETWORK_RESET,
    NETWORK_SLOW,
    SERVER_KILL,
    ZOMBIE,
    System,
    in_doubt,
)
from setups import Target
from twophase.testing.crash_points import CRASH_POINTS, signal_session
from twophase.testing.driver import DriverSpec, RunResult, generate_feed, launch
from twophase.testing.protocol import StateStore

log = logging.getLogger(__name__)

#: How often a run's fault is a driver kill, relative to each other kind.
DRIVER_KILL_WEIGHT = 3
#: Share of rounds run through the foreachBatch adapter instead of the Data Source.
FOREACH_BATCH_SHARE = 0.3
#: A server or network fault strikes this many seconds after the run's first batch is done.
FAULT_DELAY_S = (0.0, 1.5)
#: ...and lasts this long (a reset is instant).
OUTAGE_S = (1.0, 5.0)
SLOW_CHUNK_DELAY_S = (0.05, 0.3)
#: A zombie is thawed this many seconds after its successor took the query over.
THAW_AFTER_S = (0.0, 4.0)
ZOMBIE_PROGRESS_TIMEOUT_S = 120.0
#: A round that needs more runs than this per batch has stopped making progress.
MAX_RUNS_PER_BATCH = 3
#: The return code recorded for a driver that had to be killed because it hung.
HUNG_RETURNCODE = 124


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
    faults: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    logs: Path | None = None

    @property
    def exactly_once(self) -> bool:
        return (self.finished and self.duplicates == self.missing == self.in_doubt == 0
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
    target: Target = field(init=False)
    spec: DriverSpec = field(init=False)
    store: StateStore = field(init=False)

    def play(self) -> RoundResult:
        started = time.monotonic()
        self.target = self.system.new_target()
        foreach_batch = self.rng.random() < FOREACH_BATCH_SHARE
        result = RoundResult(self.system.name, "foreachBatch" if foreach_batch else "data source",
                             logs=self.workdir)
        result.rows_in = generate_feed(self.workdir / "feed", files=self.batches,
                                       rows_per_file=self.rows_per_batch,
                                       seed=self.rng.randrange(10**6))
        self.spec = DriverSpec.into(self.target, self.workdir,
                                    checkpoint=str(self.workdir / "checkpoint"),
                                    foreach_batch=foreach_batch)
        self.store = self.spec.state_store()
        while self._next_batch() < self.batches and \
                result.runs < self.batches * MAX_RUNS_PER_BATCH:
            kind = self._draw() if result.crash_runs < self.budget else None
            self._run(kind, result)
            self._restore()
            seen = self.target.visible()
            result.duplicates = max(result.duplicates, len(seen) - len(set(seen)))
        self._judge(result)
        result.seconds = time.monotonic() - started
        return result

    # -- faults ------------------------------------------------------------------------------

    def _draw(self) -> str:
        kinds = [DRIVER_KILL] * DRIVER_KILL_WEIGHT + [ZOMBIE, *self.system.server_faults]
        return self.rng.choice([kind for kind in kinds if kind in (self.kinds or kinds)])

    def _run(self, kind: str | None, result: RoundResult) -> None:
        injected: Counter[str] = Counter()
        if kind == ZOMBIE:
            outcomes = self._zombie(injected)
        elif kind == DRIVER_KILL:
            outcomes = [self._launch(self._armed(), injected=injected)]
        elif kind is None:
            outcomes = [self._launch()]
        else:
            outcomes = [self._launch(while_running=self._server_fault(kind, injected))]
        for outcome in outcomes:
            result.runs += 1
            result.failed_runs += not outcome.crashed and outcome.returncode != 0
        if kind == ZOMBIE and injected and outcomes[0].returncode != 0:
            result.zombies_fenced += 1
        result.crash_runs += bool(injected)
        result.faults.update(injected)
        log.info("  run %d: %s -> %s", result.runs,
                 ", ".join(injected) or "no fault", _ending(outcomes[-1]))

    def _armed(self) -> str:
        batch = min(self._next_batch() + self.rng.randrange(2), self.batches - 1)
        return f"{self.rng.choice(CRASH_POINTS)}@{batch}"

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

    def _server_fault(self, kind: str, injected: Counter[str]) -> Callable[[], None]:
        """A ``while_running`` hook that strikes once, mid-batch: ``FAULT_DELAY_S`` after the
        run has done its first batch."""
        first_batch = self._next_batch()
        outage_s = self.rng.uniform(*OUTAGE_S)
        delay_s = self.rng.uniform(*self.fault_delay_s)
        strike_at: list[float] = []
        heal_at: list[float] = []

        def tick() -> None:
            now = time.monotonic()
            if not strike_at and self._next_batch() > first_batch:
                strike_at.append(now + delay_s)
            elif strike_at and not heal_at and now >= strike_at[0]:
                self._strike(kind)
                injected[kind] += 1
                heal_at.append(now + outage_s)
            elif heal_at and now >= heal_at[0]:
                self._restore()

        return tick

    def _strike(self, kind: str) -> None:
        proxy = self.system.proxy
        if kind == SERVER_KILL:
            self.system.kill_server()
        elif proxy is None:
            raise ValueError(f"{self.system.name} has no network to fault")
        elif kind == NETWORK_CUT:
            proxy.cut()
        elif kind == NETWORK_RESET:
            proxy.reset()
        elif kind == NETWORK_SLOW:
            proxy.slow(self.rng.uniform(*SLOW_CHUNK_DELAY_S))

    def _restore(self) -> None:
        if self.system.proxy is not None:
            self.system.proxy.heal()
        self.system.start_server()

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

    def _judge(self, result: RoundResult) -> None:
        seen = self.target.visible()
        expected = set(range(result.rows_in))
        result.visible = len(seen)
        result.duplicates = max(result.duplicates, len(seen) - len(set(seen)) +
                                len(set(seen) - expected))
        result.missing = len(expected - set(seen))
        state = self.store.read() if self.store.exists() else None
        if state is not None:
            result.finished = state.last_done_batch == self.batches - 1
            result.in_doubt = len(state.pending) + len(in_doubt(self.target, state.namespace))


def _thaw(session: int) -> None:
    signal_session(session, signal.SIGCONT)


def _ending(outcome: RunResult) -> str:
    if outcome.crashed:
        return "killed"
    return "finished" if outcome.returncode == 0 else f"failed ({outcome.returncode})"
