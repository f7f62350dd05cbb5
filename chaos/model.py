"""The protocol model's long profile over every sink: ``scripts/chaos-model [--examples N] ...``.

Run from the repository root (``python -m chaos.model``: it starts each sink's setup,
:mod:`setups`). Runs :mod:`twophase.testing.model` (hypothesis crash schedules: task
failures, executors and drivers killed at every crash point, sink failures, replays, zombie
runs, cleanup, restarts) with the ``twophase-long`` profile against each sink's real server (a
private MariaDB and a private moto S3 are started here), in rounds of ``--round`` examples
until ``--examples`` per sink or ``--minutes`` per sink is reached. Prints examples, steps and
injected faults per sink, and the falsifying schedule of any violation; exits 1 if any sink
had one.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from setups import SETUPS
from twophase.testing.model import PROFILE_ENV, ModelStats, run_model
from twophase.testing.target import ExactlyOnceError

log = logging.getLogger("chaos.model")

SINKS = tuple(SETUPS)
QUIET_LOGGERS = ("twophase", "sinks")


@dataclass
class Tally:
    sink: str
    examples: int = 0  # hypothesis's examples (the rounds' max_examples, all run)
    runs: int = 0  # state machines run (also the examples hypothesis does not count)
    steps: int = 0
    seconds: float = 0.0
    faults: dict[str, int] = field(default_factory=dict)
    violation: str | None = None

    def add(self, examples: int, stats: ModelStats) -> None:
        self.examples += examples
        self.runs += stats.examples
        self.steps += stats.steps
        self.seconds += stats.seconds
        for kind, count in stats.faults.items():
            self.faults[kind] = self.faults.get(kind, 0) + count


def run_sink(sink: str, *, examples: int, minutes: float, per_round: int) -> Tally:
    tally = Tally(sink)
    deadline = time.monotonic() + minutes * 60
    with tempfile.TemporaryDirectory(prefix="twophase-chaos-model-",
                                     dir=_memory_fs()) as scratch, \
            SETUPS[sink].started(Path(scratch)) as setup:
        while tally.examples < examples and time.monotonic() < deadline:
            wanted = min(per_round, examples - tally.examples)
            try:
                stats = run_model(setup.model_target, max_examples=wanted, state_root=scratch)
            except ExactlyOnceError as exc:
                tally.violation = str(exc)
                schedule = "\n".join(getattr(exc, "__notes__", ()))  # hypothesis's shrunk steps
                log.error("%s: VIOLATION: %s\n%s", sink, exc, schedule)
                break
            tally.add(wanted, stats)
            log.info("%s: %d examples (%d machines run), %d steps, %.0fs so far", sink,
                     tally.examples, tally.runs, tally.steps, tally.seconds)
    return tally


def _memory_fs() -> str | None:
    return "/dev/shm" if Path("/dev/shm").is_dir() else None


def summary(tallies: list[Tally]) -> str:
    lines = ["| sink | examples | machines run | steps | time | faults injected | verdict |",
             "|---|---|---|---|---|---|---|"]
    for t in tallies:
        faults = ", ".join(f"{kind} {count}" for kind, count in sorted(t.faults.items()))
        verdict = f"VIOLATION: {t.violation}" if t.violation else "exactly once"
        lines.append(f"| {t.sink} | {t.examples} | {t.runs} | {t.steps} | {t.seconds:.0f}s | "
                     f"{faults} | {verdict} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sinks", default=",".join(SINKS), help="comma-separated: " +
                        ", ".join(SINKS))
    parser.add_argument("--examples", type=int, default=1000, help="per sink")
    parser.add_argument("--minutes", type=float, default=60.0, help="per sink, at most")
    parser.add_argument("--round", type=int, default=50, help="examples per hypothesis run")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
    log.setLevel(logging.INFO)
    for noisy in QUIET_LOGGERS:  # the protocol's warnings about orphans it aborts, by the 1000
        logging.getLogger(noisy).setLevel(logging.ERROR)
    os.environ[PROFILE_ENV] = "long"
    tallies = [run_sink(sink, examples=args.examples, minutes=args.minutes,
                        per_round=args.round)
               for sink in args.sinks.split(",")]
    log.info("\n%s", summary(tallies))
    return 1 if any(t.violation for t in tallies) else 0


if __name__ == "__main__":
    sys.exit(main())
