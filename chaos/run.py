"""The Spark chaos suite: ``scripts/chaos [--sinks sqlite,mysql,s3,kafka,http] [--runs N] ...``.

A sink group is named like a sink: ``--sinks mysql+kafka`` streams into a group of the two
(the table, then the topic), its faults struck at either member, a member down among them.

For each sink, its real server is started behind a fault proxy (:mod:`chaos.systems`), and
rounds (:mod:`chaos.scenario`) stream fresh feeds through real Spark drivers into fresh targets
while drivers are SIGKILLed at random crash points, zombie drivers are thawed on the same state,
the server is SIGKILLed and restarted and the network to it is cut, reset and slowed, until
``--runs`` runs with a fault injected were made per sink. Prints a line per run and a table per
sink (runs, crashes injected, rows in, rows visible, duplicates, missing, left in doubt, faults
by kind; for a group also events seen before their row, batches split between its members and
batches decided while a member was down); exits 1 on any loss, duplicate, row left in doubt,
order violation, split batch or round that did not finish.
The CI runs a short subset (tests/spark/test_chaos.py).
"""

from __future__ import annotations

import argparse
import logging
import random
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

from chaos.scenario import Round, RoundResult
from chaos.systems import GROUPS, system
from setups import SETUPS

log = logging.getLogger("chaos")

DEFAULT_RUNS = 60
DEFAULT_BATCHES = 10
DEFAULT_ROWS_PER_BATCH = 200
#: Faulty runs per round: a round then ends with a few runs that have to finish the feed.
DEFAULT_FAULTS_PER_ROUND = 8
QUIET_LOGGERS = ("twophase", "sinks", "kafka", "botocore", "aiohttp")


def chaos_sink(sink: str, *, runs: int, batches: int, rows_per_batch: int,
               faults_per_round: int, rng: random.Random) -> list[RoundResult]:
    """Rounds against one sink until ``runs`` runs had a fault injected (or a round failed)."""
    results: list[RoundResult] = []
    with tempfile.TemporaryDirectory(prefix=f"twophase-chaos-{sink}-") as scratch, \
            system(sink)(Path(scratch)).running() as chaotic:
        while sum(r.crash_runs for r in results) < runs:
            number = len(results)
            log.info("%s round %d", sink, number)
            result = Round(chaotic, Path(scratch) / f"round-{number}", rng, batches,
                           rows_per_batch, faults_per_round).play()
            results.append(result)
            log.info("%s", summary([result]))
            if not result.exactly_once:
                keep = Path(tempfile.mkdtemp(prefix=f"twophase-chaos-{sink}-failed-"))
                log.error("%s round %d FAILED; its files are copied to %s", sink, number, keep)
                _keep(Path(scratch) / f"round-{number}", keep)
                break
    return results


def _keep(source: Path, destination: Path) -> None:
    shutil.copytree(source, destination, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("feed", "tmp", "blockmgr-*"))


def summary(results: list[RoundResult]) -> str:
    """A table per sink: totals over its rounds, and the faults by kind."""
    lines = ["| sink | rounds | runs | runs with faults | driver kills | zombies (fenced) | "
             "server kills | network cut / reset / slowed | member down (checks) | rows in | "
             "visible | duplicates | missing | in doubt | events before their row | "
             "split batches | decided while down | out of order | verdict |", "|" + "---|" * 19]
    for sink in dict.fromkeys(r.sink for r in results):
        mine = [r for r in results if r.sink == sink]
        faults: Counter[str] = sum((r.faults for r in mine), Counter())
        total = {name: sum(getattr(r, name) for r in mine) for name in (
            "runs", "crash_runs", "zombies_fenced", "rows_in", "visible", "duplicates",
            "missing", "in_doubt", "checks_while_down", "before_their_row", "split_batches",
            "ahead_while_down", "out_of_order")}
        verdict = "exactly once" if all(r.exactly_once for r in mine) else "FAILED"
        lines.append(
            f"| {sink} | {len(mine)} | {total['runs']} | {total['crash_runs']} | "
            f"{faults['driver kill']} | {faults['zombie driver']} ({total['zombies_fenced']}) | "
            f"{faults['server kill']} | {faults['network cut']} / {faults['network reset']} / "
            f"{faults['network slowed']} | {faults['member down']} "
            f"({total['checks_while_down']}) | {total['rows_in']} | {total['visible']} | "
            f"{total['duplicates']} | {total['missing']} | {total['in_doubt']} | "
            f"{total['before_their_row']} | {total['split_batches']} | "
            f"{total['ahead_while_down']} | {total['out_of_order']} | {verdict} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sinks", default=",".join(SETUPS),
                        help="comma-separated: " + ", ".join(SETUPS) + "; or a group of "
                        "them, committed in the order named: " + ", ".join(GROUPS) + "...")
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS,
                        help="runs with a fault injected, per sink")
    parser.add_argument("--batches", type=int, default=DEFAULT_BATCHES, help="per round")
    parser.add_argument("--rows-per-batch", type=int, default=DEFAULT_ROWS_PER_BATCH)
    parser.add_argument("--faults-per-round", type=int, default=DEFAULT_FAULTS_PER_ROUND)
    parser.add_argument("--seed", type=int, default=random.SystemRandom().randrange(10**6))
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
    logging.getLogger("chaos").setLevel(logging.INFO)
    for noisy in QUIET_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    rng = random.Random(args.seed)
    results: list[RoundResult] = []
    for sink in args.sinks.split(","):
        try:
            system(sink)
        except KeyError:
            parser.error(f"unknown sink {sink!r}; known: {', '.join(SETUPS)} and groups "
                         f"of them ({', '.join(GROUPS)})")
        results += chaos_sink(sink, runs=args.runs, batches=args.batches,
                              rows_per_batch=args.rows_per_batch,
                              faults_per_round=args.faults_per_round, rng=rng)
    log.info("\nseed %d\n%s", args.seed, summary(results))
    return 0 if results and all(r.exactly_once for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
