"""Chaos rounds of the real Debezium pipeline:
``scripts/chaos-debezium [--changes 10000] [--runs 50] [--keys 200] [--seed N]``.

The pipeline of ``tests/spark/test_debezium_pipeline.py``, its parts from
:mod:`setups.debezium`: PostgreSQL (``wal_level=logical``) -> Debezium's PostgreSQL connector on
a Kafka Connect worker -> a Kafka broker -> ``examples/debezium_pipeline.py`` (the Spark driver,
run as a user runs it) -> twophase into a sink group of a keyed MariaDB table, a keyed
PostgreSQL table, a keyed Delta table, a keyed Iceberg table and a compacted changelog topic,
committed in that order.

The servers are started once, privately (nothing of the machine's is used): the source
PostgreSQL (logical decoding), the targets' PostgreSQL, MariaDB, the Kafka broker and a Connect
worker with Debezium's connector. Then rounds are played until ``--runs`` runs had a fault
injected. A round takes a fresh source table with its own connector, slot and topic, fresh
target tables and a fresh checkpoint; a workload of ``--changes`` changes of ``--keys`` keys
(inserts, many updates per key, deletes, re-inserts) runs while drivers stream the topic, one
run after the other until the workload is done, each run with a fault drawn:

===========================  =================================================================
fault                        what happens
===========================  =================================================================
driver kill                  the driver is armed at a random crash point of one of its next
                             batches (:data:`~twophase.testing.crash_points.GROUP_CRASH_POINTS`,
                             and ``committing_behind``: the stream runs until stopped, so each
                             batch commits behind the next) and SIGKILLs its whole session
                             there; the next run starts it again on the same checkpoint
worker kill, unsent offsets  once the driver has done a batch, the Connect worker is frozen at
                             a moment when the topic holds records its committed offset does
                             not cover, SIGKILLed and started again: Debezium sends them again.
                             The driver streams on meanwhile and is SIGKILLed (at no named
                             point) once it has done batches after the restart
worker kill                  the same without the freeze: SIGKILL, down for a few seconds,
                             started again (what it sent since its last offset commit, if
                             anything, it sends again)
===========================  =================================================================

A driver whose armed batch does not come (the workload done, the topic drained) is SIGKILLed
after a while, at no named point: ``driver kill, no point``. Once the workload is done, the
topic must hold every change; a last run (``availableNow``) drains it; then each target table
must equal the source table row for row (each read whole, the lake tables by DuckDB and the
topic folded by key, and compared key by key, not counted), every row's ``version`` must be its
key's newest LSN on the topic, nothing may be in doubt (``XA RECOVER``, ``pg_prepared_xacts``)
and the state file must have nothing pending.

Prints a line per run and per round, then a table (a row per round, and the total): runs, fault
runs by kind, runs that failed by themselves, source changes, events and duplicates on the
topic, rows, rows differing, versions differing, in doubt, pending, verdict. Exits 1 on any
difference, anything in doubt or pending, a run that failed or hung by itself, a round that did
not finish, or fewer fault runs than ``--runs``; a failed round's files (its driver log and
checkpoint, the Connect worker's log) are kept. Run from the repository root (as
``scripts/chaos-debezium`` does): it starts the test suite's servers (:mod:`setups.servers`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from setups.debezium import (
    DELIVERY_TIMEOUT_S,
    CdcSource,
    Event,
    LakeMirror,
    Mirror,
    NothingUnsentError,
    PipelineRun,
    Workload,
    differing_keys,
    duplicates,
    fresh_source,
    kill_worker_with_unsent_offsets,
    newest_versions,
    run_pipeline,
    wait_for,
)
from setups.servers.kafka import KafkaBroker, private_broker
from setups.servers.kafka_connect import ConnectWorker, start_worker
from setups.servers.mariadb import Db, MariaDBServer
from setups.servers.mariadb import private_server as private_mariadb
from setups.servers.postgres import PgView, PostgresServer, logical_server
from setups.servers.postgres import private_server as private_postgres
from twophase.testing.crash_points import COMMITTING_BEHIND, GROUP_CRASH_POINTS
from twophase.testing.protocol import StateStore

log = logging.getLogger("chaos.debezium")

#: The faults a run gets (see the module's table).
DRIVER_KILL = "driver kill"
WORKER_KILL_UNSENT = "worker kill, unsent offsets"
WORKER_KILL = "worker kill"
#: A driver SIGKILLed by the round at no named point: its armed batch did not come, or the
#: worker fault drawn for its run could not strike.
DRIVER_KILL_NO_POINT = "driver kill, no point"
#: How often each fault is drawn, relative to the others.
FAULT_WEIGHTS = {DRIVER_KILL: 3, WORKER_KILL_UNSENT: 1, WORKER_KILL: 1}
#: The points a driver is armed at: a sink group's, and the commit behind the next batch.
POINTS = (*GROUP_CRASH_POINTS, COMMITTING_BEHIND)
#: A driver is armed at one of the next this many batches.
ARM_AHEAD = 3
#: A worker fault strikes this many seconds after the run's first batch...
STRIKE_DELAY_S = (0.0, 3.0)
#: ...a plainly killed worker stays down this long...
WORKER_DOWN_S = (0.0, 5.0)
#: ...and the run ends once the driver has done this many batches after the worker's restart.
BATCHES_AFTER_RESTART = 2
#: Looks for unsent records before a worker kill falls back to a plain one.
UNSENT_ATTEMPTS = 20
#: A driver that has done no batch for this long once the workload is done is SIGKILLed.
IDLE_S = 30.0
#: The workload makes this many changes before the first driver starts.
FIRST_EVENTS = 20
LAST_RUN_MAX_OFFSETS = 1000
DEFAULT_CHANGES = 10_000
DEFAULT_RUNS = 50
DEFAULT_KEYS = 200
DEFAULT_PACE_S = 0.04
#: How many differing keys a round names.
SHOWN_KEYS = 10
STOPPED_CHARS = 300
QUIET_LOGGERS = ("twophase", "sinks", "kafka")


@dataclass(frozen=True)
class Servers:
    """The pipeline's servers, started once for every round."""

    source: PostgresServer
    target: PostgresServer
    mariadb: MariaDBServer
    broker: KafkaBroker
    worker: ConnectWorker


@contextlib.contextmanager
def started(scratch: Path) -> Iterator[Servers]:
    """Start the source PostgreSQL (logical decoding), the targets' PostgreSQL, MariaDB, a
    Kafka broker and a Connect worker (files under ``scratch``); stop them all on exit."""
    with contextlib.ExitStack() as stack:
        begun = time.monotonic()
        source = stack.enter_context(logical_server())
        target = stack.enter_context(private_postgres())
        mariadb = stack.enter_context(private_mariadb())
        broker = stack.enter_context(private_broker(scratch / "kafka"))
        worker = stack.enter_context(start_worker(scratch / "connect",
                                                  broker.bootstrap_servers))
        log.info("servers started in %.0f s", time.monotonic() - begun)
        yield Servers(source, target, mariadb, broker, worker)


@dataclass
class RoundResult:
    number: int
    changes: Counter[str] = field(default_factory=Counter)
    runs: int = 0
    #: Runs with a fault injected, and the faults by kind.
    fault_runs: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    #: Runs that ended non-zero by themselves (no SIGKILL), or hung.
    failed_runs: int = 0
    events: int = 0
    duplicates: int = 0
    #: The source table's rows at the end.
    rows: int = 0
    mysql_differing: int = 0
    pg_differing: int = 0
    #: Rows differing in the Delta table, the Iceberg table and the compacted topic.
    lake_differing: int = 0
    versions_differing: int = 0
    in_doubt: int = 0
    pending: int = 0
    #: The last run drained the topic and the state file was there to read.
    finished: bool = False
    #: Why the round stopped, if it did not finish.
    error: str | None = None
    seconds: float = 0.0

    @property
    def exactly_once(self) -> bool:
        return (self.finished and self.error is None and self.failed_runs == 0
                and self.mysql_differing == self.pg_differing == self.lake_differing == 0
                and self.versions_differing == 0
                and self.in_doubt == self.pending == 0)


@dataclass
class Round:
    """One source table mirrored through faulty driver runs, judged at the end."""

    servers: Servers
    number: int
    workdir: Path
    rng: random.Random
    changes: int
    keys: int
    pace_s: float
    result: RoundResult = field(init=False)
    store: StateStore = field(init=False)
    #: The driver's next batch as last read, and since when it is that.
    _batch: int = field(init=False, default=0)
    _moved_at: float = field(init=False, default=0.0)

    def play(self) -> RoundResult:
        begun = time.monotonic()
        self.result = RoundResult(self.number)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.store = StateStore.for_checkpoint(str(self.workdir / "ckpt"))
        servers = self.servers
        try:
            with fresh_source(servers.source, servers.broker, servers.worker) as source:
                try:
                    mirror = Mirror.create(Db(servers.mariadb), PgView(servers.target),
                                           LakeMirror.create(self.workdir / "lake",
                                                             servers.broker))
                    log.info("round %d: %s into `%s` and %s", self.number, source.topic,
                             mirror.mysql_table, mirror.pg_table)
                    self._stream(source, mirror)
                finally:
                    servers.worker.start()  # the connector is deleted through the worker
        except Exception as error:  # the round did not finish: a finding, its files kept
            log.exception("round %d stopped", self.number)
            self.result.error = f"{type(error).__name__}: {error}"[:STOPPED_CHARS]
        self.result.seconds = time.monotonic() - begun
        return self.result

    def _stream(self, source: CdcSource, mirror: Mirror) -> None:
        """Faulty runs while the workload runs; then the last run and the verdict."""
        result = self.result
        with Workload(source, self.keys, pace_s=self.pace_s, seed=self.rng.randrange(10**6),
                      changes=self.changes) as workload:
            wait_for(lambda: len(source.events()) >= min(FIRST_EVENTS, self.changes),
                     "first events on the topic", DELIVERY_TIMEOUT_S)
            while not workload.done:
                self._faulty_run(source, mirror, workload)
        result.changes = workload.counts
        source.worker.start()  # a no-op unless a run's fault left it down
        source.worker.wait_running(source.connector)
        events = source.wait_delivered()
        result.events, result.duplicates = len(events), duplicates(events)
        last = self._launch(source, mirror, available_now=True,
                            max_offsets_per_trigger=LAST_RUN_MAX_OFFSETS)
        self._tally("last run (availableNow)", last, Counter())
        result.finished = last is not None and last.returncode == 0 and self.store.exists()
        self._judge(source, mirror, events)

    # -- the runs ------------------------------------------------------------------------------

    def _faulty_run(self, source: CdcSource, mirror: Mirror, workload: Workload) -> None:
        kind = self.rng.choices(list(FAULT_WEIGHTS), weights=list(FAULT_WEIGHTS.values()))[0]
        injected: Counter[str] = Counter()
        self.touch()  # the driver's start counts as progress
        if kind == DRIVER_KILL:
            batch = self.next_batch() + self.rng.randrange(ARM_AHEAD)
            crash_at = f"{self.rng.choice(POINTS)}@{batch}"
            what = f"{DRIVER_KILL} at {crash_at}"
            run = self._launch(source, mirror, crash_at=crash_at,
                               kill_when=lambda: self.idle(workload))
            if run is not None and run.crashed:
                injected[DRIVER_KILL] += 1
        else:
            fault = WorkerFault(kind, self, source, workload)
            run = self._launch(source, mirror, kill_when=fault)
            what = fault.describe()
            if fault.struck is not None:
                injected[fault.struck] += 1
        if run is not None and run.killed and not injected:
            injected[DRIVER_KILL_NO_POINT] += 1
        self._tally(what, run, injected)

    def _launch(self, source: CdcSource, mirror: Mirror, *, crash_at: str | None = None,
                available_now: bool = False, max_offsets_per_trigger: int = 100,
                kill_when: Callable[[], bool] | None = None) -> PipelineRun | None:
        """A driver run; None if it hung (killed after ``DRIVER_TIMEOUT_S``)."""
        try:
            return run_pipeline(source, mirror, self.workdir, crash_at=crash_at,
                                available_now=available_now,
                                max_offsets_per_trigger=max_offsets_per_trigger,
                                kill_when=kill_when)
        except TimeoutError as error:
            log.error("    the driver hung: %s", str(error)[:STOPPED_CHARS])
            return None

    def _tally(self, what: str, run: PipelineRun | None, injected: Counter[str]) -> None:
        result = self.result
        result.runs += 1
        result.fault_runs += bool(injected)
        result.faults.update(injected)
        failed = run is None or (not run.crashed and not run.killed and run.returncode != 0)
        result.failed_runs += failed
        log.info("  run %d: %s -> %s", result.runs, what, _ending(run))
        if failed and run is not None:
            log.error("    %s", run.last_line()[:STOPPED_CHARS])

    def next_batch(self) -> int:
        """The driver's next batch as the state file says (the progress clock moves with it)."""
        state = self.store.read() if self.store.exists() else None
        batch = state.last_done_batch + 1 if state else 0
        if batch != self._batch:
            self._batch, self._moved_at = batch, time.monotonic()
        return batch

    def touch(self) -> None:
        """Count now as progress (after a wait of the round's own)."""
        self._moved_at = time.monotonic()

    def idle(self, workload: Workload) -> bool:
        """Whether the workload is done and the driver has done no batch for :data:`IDLE_S`:
        an armed batch that will not come."""
        self.next_batch()
        return workload.done and time.monotonic() - self._moved_at > IDLE_S

    # -- the verdict ---------------------------------------------------------------------------

    def _judge(self, source: CdcSource, mirror: Mirror, events: list[Event]) -> None:
        result = self.result
        expected = source.rows()
        result.rows = len(expected)
        assert mirror.lake is not None
        differing = {name: differing_keys(expected, rows) for name, rows in (
            ("MariaDB", mirror.mysql_rows()), ("PostgreSQL", mirror.pg_rows()),
            ("Delta", mirror.lake.delta_rows()), ("Iceberg", mirror.lake.iceberg_rows()),
            ("the changelog topic", mirror.lake.changelog_rows()))}
        result.mysql_differing = len(differing["MariaDB"])
        result.pg_differing = len(differing["PostgreSQL"])
        result.lake_differing = sum(len(keys) for name, keys in differing.items()
                                    if name not in ("MariaDB", "PostgreSQL"))
        for name, keys in differing.items():
            if keys:
                log.error("  %s: %d rows differ from the source, keys %s", name, len(keys),
                          keys[:SHOWN_KEYS])
        newest = newest_versions(events)
        for name, versions in zip(("MariaDB", "PostgreSQL", "Delta", "Iceberg", "the changelog"),
                                  [*mirror.versions(), *mirror.lake.versions()], strict=True):
            keys = sorted(key for key in newest.keys() | versions.keys()
                          if newest.get(key) != versions.get(key))
            if keys:
                log.error("  %s: %d versions are not their key's newest LSN, keys %s", name,
                          len(keys), keys[:SHOWN_KEYS])
            result.versions_differing += len(keys)
        in_doubt = [*mirror.db.xa_recover(), *mirror.pg.prepared()]
        if in_doubt:
            log.error("  in doubt: %s", in_doubt[:SHOWN_KEYS])
        result.in_doubt = len(in_doubt)
        state = self.store.read() if self.store.exists() else None
        pending = [decision.batch for decision in state.pending] if state is not None else []
        if pending:
            log.error("  batches left pending: %s", pending)
        result.pending = len(pending)


@dataclass
class WorkerFault:
    """A driver run's ``kill_when``: once the driver has done a batch (and a random moment
    more), strike the Connect worker (``kind``) and start it again; once the driver has done
    :data:`BATCHES_AFTER_RESTART` batches since, end the run (True). An idle driver
    (:meth:`Round.idle`) ends it too."""

    kind: str
    round: Round
    source: CdcSource
    workload: Workload
    #: The fault struck (a kill with unsent offsets falls back to a plain kill if the worker
    #: committed every record it sent, each time it was looked at); None before.
    struck: str | None = None
    unsent: int = 0
    restart_s: float = 0.0
    #: The run ended because the driver had nothing more to do (:meth:`Round.idle`).
    idled: bool = False
    _first: int | None = None
    _strike_at: float | None = None
    _after: int = 0

    def __call__(self) -> bool:
        batch = self.round.next_batch()
        if self._first is None:
            self._first = batch
        elif self._strike_at is None:
            if batch > self._first:
                self._strike_at = time.monotonic() + self.round.rng.uniform(*STRIKE_DELAY_S)
        elif self.struck is None:
            if time.monotonic() >= self._strike_at:
                self._strike()
                self._after = self.round.next_batch()
                self.round.touch()
        elif batch >= self._after + BATCHES_AFTER_RESTART:
            return True
        self.idled = self.round.idle(self.workload)
        return self.idled

    def _strike(self) -> None:
        worker = self.source.worker
        begun = time.monotonic()
        if self.kind == WORKER_KILL_UNSENT:
            try:
                self.unsent = kill_worker_with_unsent_offsets(self.source, UNSENT_ATTEMPTS)
                self.struck = WORKER_KILL_UNSENT
            except NothingUnsentError:
                worker.kill()
                self.struck = WORKER_KILL
        else:
            worker.kill()
            self.struck = WORKER_KILL
            time.sleep(self.round.rng.uniform(*WORKER_DOWN_S))
        worker.start()
        worker.wait_running(self.source.connector)
        self.restart_s = time.monotonic() - begun

    def describe(self) -> str:
        idle = ", then the driver idle" if self.idled else ""
        if self.struck is None:
            return f"{self.kind} (not struck){idle}"
        unsent = f", {self.unsent} records unsent" if self.unsent else ""
        fallback = " (every record was committed)" if self.struck != self.kind else ""
        return f"{self.struck}{fallback}{unsent}, back in {self.restart_s:.0f} s{idle}"


def _ending(run: PipelineRun | None) -> str:
    if run is None:
        return "hung"
    if run.crashed:
        ending = "killed at its point"
    elif run.killed:
        ending = "driver SIGKILLed"
    else:
        ending = "finished" if run.returncode == 0 else f"failed ({run.returncode})"
    return f"{ending} ({run.seconds:.0f} s)"


# -- the rounds --------------------------------------------------------------------------------


def play(*, changes: int, runs: int, keys: int, pace_s: float,
         rng: random.Random) -> list[RoundResult]:
    """Rounds until ``runs`` runs had a fault injected (or a round failed)."""
    results: list[RoundResult] = []
    with tempfile.TemporaryDirectory(prefix="twophase-chaos-debezium-") as scratch, \
            started(Path(scratch)) as servers:
        while sum(r.fault_runs for r in results) < runs:
            number = len(results)
            workdir = Path(scratch) / f"round-{number}"
            result = Round(servers, number, workdir, rng, changes, keys, pace_s).play()
            results.append(result)
            log.info("round %d: %s", number, _line(result))
            if not result.exactly_once:
                keep = Path(tempfile.mkdtemp(prefix="twophase-chaos-debezium-failed-"))
                _keep(workdir, servers.worker, keep)
                log.error("round %d FAILED; its files are copied to %s", number, keep)
                break
            if not result.fault_runs:
                log.error("round %d injected no fault: give it more --changes", number)
                break
    return results


def _keep(workdir: Path, worker: ConnectWorker, destination: Path) -> None:
    shutil.copytree(workdir, destination, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("tmp", "blockmgr-*"))
    for log_file in (worker.log, worker.home / "stdout.log"):
        if log_file.exists():
            (destination / "connect").mkdir(exist_ok=True)
            shutil.copy2(log_file, destination / "connect" / log_file.name)


def _line(result: RoundResult) -> str:
    verdict = "exactly once" if result.exactly_once else "FAILED"
    return (f"{sum(result.changes.values())} changes {dict(result.changes)}, {result.events} "
            f"events ({result.duplicates} sent again), {result.runs} runs "
            f"({result.fault_runs} with a fault), {result.rows} rows, "
            f"{result.mysql_differing} + {result.pg_differing} + {result.lake_differing} "
            f"differing -> {verdict} "
            f"({result.seconds:.0f} s)")


#: The table's column of each fault.
FAULT_COLUMNS = {DRIVER_KILL: "driver kills at a point", WORKER_KILL_UNSENT:
                 "worker kills, unsent offsets", WORKER_KILL: "worker kills",
                 DRIVER_KILL_NO_POINT: "driver kills, no point"}
HEADER = ("round", "runs", "fault runs", *FAULT_COLUMNS.values(), "failed runs",
          "source changes", "events on the topic", "duplicates on the topic", "rows",
          "rows differing (MariaDB / PostgreSQL / lake and topic)", "versions differing",
          "in doubt", "pending",
          "verdict")


def summary(results: list[RoundResult]) -> str:
    """A markdown table: a row per round and the total."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]

    def row(label: str, rounds: list[RoundResult]) -> str:
        faults: Counter[str] = sum((r.faults for r in rounds), Counter())
        verdict = ("exactly once" if rounds and all(r.exactly_once for r in rounds)
                   else "FAILED")
        cells = [label, sum(r.runs for r in rounds), sum(r.fault_runs for r in rounds),
                 *(faults[fault] for fault in FAULT_COLUMNS), sum(r.failed_runs for r in rounds),
                 sum(sum(r.changes.values()) for r in rounds), sum(r.events for r in rounds),
                 sum(r.duplicates for r in rounds), sum(r.rows for r in rounds),
                 f"{sum(r.mysql_differing for r in rounds)} / "
                 f"{sum(r.pg_differing for r in rounds)} / "
                 f"{sum(r.lake_differing for r in rounds)}",
                 sum(r.versions_differing for r in rounds), sum(r.in_doubt for r in rounds),
                 sum(r.pending for r in rounds), verdict]
        return "| " + " | ".join(map(str, cells)) + " |"

    lines += [row(str(r.number), [r]) for r in results]
    lines.append(row(f"all {len(results)}", results))
    return "\n".join(lines)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a positive number: {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=_positive, default=DEFAULT_CHANGES,
                        help="source changes per round")
    parser.add_argument("--runs", type=_positive, default=DEFAULT_RUNS,
                        help="runs with a fault injected, over all rounds")
    parser.add_argument("--keys", type=_positive, default=DEFAULT_KEYS,
                        help="keys of each round's source table")
    parser.add_argument("--pace", type=float, default=DEFAULT_PACE_S,
                        help="seconds between the workload's statements")
    parser.add_argument("--seed", type=int, default=random.SystemRandom().randrange(10**6))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
    logging.getLogger("chaos").setLevel(logging.INFO)
    for noisy in QUIET_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    log.info("seed %d: rounds of %d changes of %d keys until %d runs with a fault",
             args.seed, args.changes, args.keys, args.runs)
    begun = time.monotonic()
    results = play(changes=args.changes, runs=args.runs, keys=args.keys, pace_s=args.pace,
                   rng=random.Random(args.seed))
    fault_runs = sum(r.fault_runs for r in results)
    print(f"\nseed {args.seed}, {time.monotonic() - begun:.0f} s\n{summary(results)}")
    ok = bool(results) and all(r.exactly_once for r in results) and fault_runs >= args.runs
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
