"""DeltaSink's driver-side costs as a table ages: the "already committed?" proof and the listing
in doubt at batch 10 and at batch 1,000, the snapshot load reported apart. One run.

Run from the repository root (about a minute on a local path; ``--s3``: on a private
``moto_server``, a few minutes)::

    nice .venv/bin/python -m bench.delta_proof [--batches 1000] [--partitions 2] [--s3]

Batches of ``--partitions`` transactions (10 rows each: the file count is what ages a table, not
the rows) are pre-committed and committed as the driver does (the committer's stages, then
``finish_batch``); at each checkpoint (batch 10, then ``--batches``) the next batch is left
pre-committed (its intents present, as during a batch) and, ``--repeats`` times each, timed:

- ``load``: loading the table's latest snapshot (deltalake; bounded by Delta's checkpoints);
- ``proof``: ``transaction_version(app id)`` on that snapshot (the committed check);
- ``list in doubt``: the committer's whole listing (the namespace's intents, the table brought
  up to date, the proof per query);
- ``re-commit``: committing the previous, committed batch again through a new committer, as a
  restarted driver's recovery does (a full load, the proof, the files found referenced:
  ALREADY_COMMITTED).

The committer is one for the run, as the driver's lives as long as its query: it reads the
table once, then only the commits made since.

Prints the medians at both checkpoints and their ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from setups.delta import s3_storage_options
from setups.lake import commit_decided
from setups.servers.moto import private_server
from sinks.delta import DeltaSink
from twophase import CommitOutcome, Committer, Handle, TwoPhaseCommitSink
from twophase.testing.contract import NAMESPACE, ORDER_COLUMNS, orders, prepare

ROWS_PER_TRANSACTION = 10
CHECKPOINT = 10


def prepared(sink: TwoPhaseCommitSink[Any], batch: int, partitions: int) -> list[Handle]:
    return [prepare(sink, orders((batch * partitions + p) * ROWS_PER_TRANSACTION,
                                 ROWS_PER_TRANSACTION), batch=batch, partition=p)
            for p in range(partitions)]


def median_ms(action: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def measure(sink: DeltaSink, committer: Committer, batch: int, partitions: int, repeats: int,
            last: list[Handle]) -> dict[str, float]:
    """The four costs with batch ``batch`` pre-committed (in flight), through the run's
    committer (as the driver's, which lives as long as the query)."""
    in_flight = prepared(sink, batch, partitions)
    app_id = sink.app_id_of(in_flight[0].txn_id)
    snapshot = sink.snapshot()
    listed = committer.list_in_doubt(NAMESPACE)
    assert {handle.txn_id for handle in listed} == {h.txn_id for h in in_flight}, listed

    def recommit() -> None:
        with sink.committer() as fresh:
            assert set(commit_decided(fresh, last)) == {CommitOutcome.ALREADY_COMMITTED}

    costs = {
        "load": median_ms(sink.snapshot, repeats),
        "proof": median_ms(lambda: snapshot.batch_of(app_id), repeats),
        "list in doubt": median_ms(lambda: committer.list_in_doubt(NAMESPACE), repeats),
        "re-commit": median_ms(recommit, repeats),
    }
    commit_decided(committer, in_flight)
    last[:] = in_flight
    return costs


#: What a checkpoint times: (sink, the run's committer, batch, partitions, repeats, the last
#: committed batch's handles) -> median ms by cost.
Measure = Callable[[Any, Committer, int, int, int, list[Handle]], dict[str, float]]


def run(sink: TwoPhaseCommitSink[Any], batches: int, partitions: int, repeats: int,
        measure: Measure) -> dict[int, dict[str, float]]:
    """Commit ``batches`` batches through one committer; at batch 10 and at the last, time
    ``measure``."""
    sink.check_schema(ORDER_COLUMNS)
    results: dict[int, dict[str, float]] = {}
    last: list[Handle] = []
    with sink.committer() as committer:
        for batch in range(batches + 1):
            if batch in (CHECKPOINT, batches):
                results[batch] = measure(sink, committer, batch, partitions, repeats, last)
                continue
            last[:] = prepared(sink, batch, partitions)
            commit_decided(committer, last)
    return results


@contextlib.contextmanager
def table(workdir: Path, on_s3: bool) -> Iterator[DeltaSink]:
    if not on_s3:
        yield DeltaSink(str(workdir / "orders"), create=True)
        return
    with private_server(workdir / "moto") as server:
        bucket = server.new_bucket("lake")
        yield DeltaSink(f"s3://{bucket}/orders", create=True,
                        storage_options=s3_storage_options(server))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--s3", action="store_true", help="the table on a private moto_server")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir, table(Path(workdir), args.s3) as sink:
        started = time.perf_counter()
        results = run(sink, args.batches, args.partitions, args.repeats, measure)
        elapsed = time.perf_counter() - started
    print(f"DeltaSink on {'S3 (moto)' if args.s3 else 'a local path'}: {args.batches} batches of "
          f"{args.partitions} transactions in {elapsed:.0f} s; medians of {args.repeats}")
    print(report(results, args.batches, "batch"))


def report(results: dict[int, dict[str, float]], batches: int, unit: str) -> str:
    """The costs at the checkpoints and their ratio, as a Markdown table."""
    first, last = results[CHECKPOINT], results[batches]
    lines = [f"| cost | {unit} {CHECKPOINT} | {unit} {batches} | ratio |", "|---|---|---|---|"]
    lines += [f"| {name} | {first[name]:.2f} ms | {last[name]:.2f} ms | "
              f"{last[name] / first[name]:.2f} |" for name in first]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
