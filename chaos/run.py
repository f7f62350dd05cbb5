"""Long crash scenarios, run on their own: ``scripts/chaos [--rounds N] ...``.

Each round streams a fresh order feed into SQLite through a real Spark driver that is
SIGKILLed many times at random named crash points (every point equally often, at random
batches), alternating the Data Source and foreachBatch adapters, and judges SQLite's own view.
The CI runs the short subset of this (tests/test_crash.py: each point once).
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import tempfile
import time
from pathlib import Path

from twophase.demo import DriverError, Verdict, plan_crashes, run_scenario

log = logging.getLogger("chaos")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--rows-per-batch", type=int, default=1_000)
    parser.add_argument("--crashes", type=int, default=10, help="crashes per round")
    parser.add_argument("--seed", type=int, default=random.SystemRandom().randrange(10**6))
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
    log.setLevel(logging.INFO)
    rng = random.Random(args.seed)
    rows: list[tuple[int, str, Verdict | str, float]] = []
    for number in range(args.rounds):
        adapter = "foreachBatch" if number % 2 else "data source"
        crashes = plan_crashes(args.batches, rng, count=args.crashes)
        log.info("round %d (%s): crashes at %s", number, adapter,
                 ", ".join(f"{point}@{batch}" for point, batch in crashes))
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="twophase-chaos-") as workdir:
            try:
                outcome: Verdict | str = run_scenario(
                    Path(workdir), batches=args.batches, rows_per_batch=args.rows_per_batch,
                    crashes=crashes, seed=rng.randrange(10**6),
                    foreach_batch=adapter == "foreachBatch")
            except DriverError as exc:
                outcome = str(exc)
        rows.append((number, adapter, outcome, time.monotonic() - started))
    log.info("\nseed %d\n%s", args.seed, summary(rows))
    return 0 if all(isinstance(o, Verdict) and o.exactly_once for _, _, o, _ in rows) else 1


def summary(rows: list[tuple[int, str, Verdict | str, float]]) -> str:
    lines = ["| round | adapter | crashes | rows in | visible | dup | missing | in doubt | "
             "verdict | time |", "|---|---|---|---|---|---|---|---|---|---|"]
    for number, adapter, outcome, seconds in rows:
        if isinstance(outcome, str):
            lines.append(f"| {number} | {adapter} | | | | | | | DRIVER FAILED: {outcome} | |")
            continue
        verdict = "exactly once" if outcome.exactly_once else "FAILED"
        lines.append(f"| {number} | {adapter} | {outcome.crashes} | {outcome.rows_in} | "
                     f"{outcome.visible} | {outcome.duplicates} | {outcome.missing} | "
                     f"{outcome.in_doubt} | {verdict} | {seconds:.0f}s |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
