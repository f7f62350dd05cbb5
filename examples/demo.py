"""The main job: ``python examples/demo.py`` (what ``scripts/demo`` runs).

Streams a generated order-status feed ("orders_live": event id, order id, status, timestamp)
through Spark into the embedded SQLite sink, SIGKILLs the driver at random named crash points
along the way (once at each point, in random order, at random batches), restarts it each time,
and ends with a verification table read from SQLite itself. Exits 1 if a single row is lost or
duplicated, or anything is left in doubt. Like any job of a user, it takes twophase through
its public modules only (the harness from :mod:`twophase.testing`).
"""

from __future__ import annotations

import argparse
import logging
import random
import sqlite3
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from sinks.sqlite import SQLiteSink
from twophase.testing.crash_points import CRASH_POINTS
from twophase.testing.driver import DriverSpec, generate_feed, launch
from twophase.testing.protocol import BatchRecord, StateStore

log = logging.getLogger(__name__)

DEFAULT_BATCHES = 24
DEFAULT_ROWS_PER_BATCH = 2_000
#: The embedded default sink, by the name the driver process builds it from.
DEMO_SINK = f"{SQLiteSink.__module__}:{SQLiteSink.__qualname__}"
TABLE = "orders_live"
TABLE_DDL = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} (event_id INTEGER NOT NULL, order_id INTEGER NOT NULL, "
    "status TEXT NOT NULL, ts TEXT NOT NULL)"
)


@dataclass
class Progress:
    """Prints one line per committed batch, read from the state file while the driver runs."""

    store: StateStore
    reported: set[int] = field(default_factory=set)
    records: dict[int, BatchRecord] = field(default_factory=dict)

    def __call__(self) -> None:
        state = self.store.read()
        for record in state.history if state else ():
            self.records[record.batch] = record
            if record.batch not in self.reported:
                self.reported.add(record.batch)
                log.info("  batch %3d  %6d rows  %d txns  decide+commit %6.1f ms%s",
                         record.batch, record.rows, record.txns,
                         record.decision_ms + record.commit_ms,
                         f"  (recovered, {record.already_committed} already committed)"
                         if record.decision_ms == 0 else "")


CrashPlan = list[tuple[str, int]]


def plan_crashes(batches: int, rng: random.Random) -> CrashPlan:
    """One crash at every named point, in random order, at increasing random batches."""
    points = rng.sample(CRASH_POINTS, len(CRASH_POINTS))
    at = sorted(rng.sample(range(1, batches - 1), len(points)))
    return list(zip(points, at, strict=True))


@dataclass(frozen=True)
class Verdict:
    """What SQLite itself holds at the end of a scenario."""

    rows_in: int
    visible: int
    duplicates: int
    missing: int
    batches_done: int
    batches: int
    crashes: int
    in_doubt: int
    pending: int
    median_commit_ms: float | None

    @property
    def exactly_once(self) -> bool:
        return (self.duplicates == self.missing == self.in_doubt == self.pending == 0
                and self.visible == self.rows_in and self.batches_done == self.batches)

    def table(self) -> str:
        latency = f"{self.median_commit_ms:.1f} ms" if self.median_commit_ms else "n/a"
        rows = [("rows in", self.rows_in), ("rows visible", self.visible),
                ("duplicates", self.duplicates), ("missing", self.missing),
                ("batches", f"{self.batches_done} of {self.batches}"),
                ("crashes survived", self.crashes), ("left in doubt", self.in_doubt),
                ("median commit latency", latency)]
        return "\n".join(f"  {name:<22} {value:>12}" for name, value in rows)


class DriverError(RuntimeError):
    """The driver ended in a way the scenario did not plan (see its log)."""


def run_scenario(workdir: Path, *, batches: int, rows_per_batch: int, crashes: CrashPlan,
                 seed: int) -> Verdict:
    """Stream the feed into SQLite, SIGKILLing the driver as planned; judge the result."""
    database = workdir / "orders.db"
    with sqlite3.connect(database) as connection:
        connection.execute(TABLE_DDL)
    rows_in = generate_feed(workdir / "feed", files=batches, rows_per_file=rows_per_batch,
                            seed=seed)
    spec = DriverSpec(input_dir=str(workdir / "feed"), checkpoint=str(workdir / "checkpoint"),
                      sink_factory=DEMO_SINK, sink_kwargs={"path": str(database), "table": TABLE})
    progress = Progress(spec.state_store())
    log.info("%d order events in %d micro-batches -> %s:%s", rows_in, batches, database, TABLE)
    for point, batch in [*crashes, (None, None)]:
        crash_at = f"{point}@{batch}" if point else None
        log.info("starting the driver%s", f" (will be SIGKILLed at {point}, batch {batch})"
                 if point else " (no crash this time)")
        result = launch(spec, workdir=workdir / "driver", crash_at=crash_at,
                        while_running=progress)
        if result.crashed != bool(point) or (not point and result.returncode != 0):
            raise DriverError(f"driver armed at {crash_at} ended with {result.returncode}; "
                               f"see {result.log}")
        if point:
            log.info("  ** driver SIGKILLed at %s, batch %d: restarting", point, batch)
    return judge(database, progress, rows_in=rows_in, batches=batches, crashes=len(crashes))


def judge(database: Path, progress: Progress, *, rows_in: int, batches: int,
          crashes: int) -> Verdict:
    with sqlite3.connect(database) as connection:
        visible, distinct = connection.execute(
            f"SELECT count(*), count(DISTINCT event_id) FROM {TABLE}").fetchone()
        present = connection.execute(
            f"SELECT count(DISTINCT event_id) FROM {TABLE} WHERE event_id BETWEEN 0 AND ?",
            (rows_in - 1,)).fetchone()[0]
    with SQLiteSink(database, TABLE).committer() as committer:
        in_doubt = len(committer.list_in_doubt(TABLE))
    state = progress.store.read_existing()
    latencies = [r.decision_ms + r.commit_ms for r in progress.records.values()
                 if r.decision_ms > 0]
    return Verdict(rows_in=rows_in, visible=visible, duplicates=visible - distinct,
                   missing=rows_in - present, batches_done=state.last_done_batch + 1,
                   batches=batches, crashes=crashes, in_doubt=in_doubt,
                   pending=len(state.pending),
                   median_commit_ms=statistics.median(latencies) if latencies else None)


def run(workdir: Path, *, batches: int, rows_per_batch: int, seed: int) -> int:
    rng = random.Random(seed)  # noqa: S311 - picks crash points, not secrets
    log.info("twophase demo")
    try:
        verdict = run_scenario(workdir, batches=batches, rows_per_batch=rows_per_batch,
                               crashes=plan_crashes(batches, rng), seed=seed)
    except DriverError as exc:
        log.error("%s", exc)
        return 1
    log.info("\n%s", verdict.table())
    log.info("%s", "EXACTLY ONCE: every row visible once." if verdict.exactly_once
             else "FAILED: rows lost, duplicated or left in doubt.")
    return 0 if verdict.exactly_once else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=DEFAULT_BATCHES)
    parser.add_argument("--rows-per-batch", type=int, default=DEFAULT_ROWS_PER_BATCH)
    parser.add_argument("--seed", type=int, default=random.SystemRandom().randrange(10**6),
                        help="makes a run repeatable (default: random, printed)")
    parser.add_argument("--workdir", type=Path,
                        help="keep the database, feed and logs here (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.batches < len(CRASH_POINTS) + 2:
        parser.error(f"--batches must be at least {len(CRASH_POINTS) + 2}")
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
    log.info("seed %d", args.seed)
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
        return run(args.workdir, batches=args.batches, rows_per_batch=args.rows_per_batch,
                   seed=args.seed)
    with tempfile.TemporaryDirectory(prefix="twophase-demo-") as workdir:
        return run(Path(workdir), batches=args.batches, rows_per_batch=args.rows_per_batch,
                   seed=args.seed)


if __name__ == "__main__":
    sys.exit(main())
