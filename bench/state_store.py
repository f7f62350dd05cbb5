"""The framework's cost per batch with the state on S3 against the state on local disk, one run.

Run from the repository root (about half a minute)::

    .venv/bin/python -m bench.state_store [--batches 200] [--partitions 4]

A sink that does nothing (its commits and listings return at once) isolates what twophase adds
to every batch on the driver: reading the state, the sweep, the decision (a conditional
replace of the state file) and marking the batch done (another one). Measured per batch with
``Coordinator.commit_batch``, as Spark's commit of a micro-batch calls it, for a local state
directory and for an S3 prefix of a private ``moto_server`` (``setups.servers.moto``) on loopback;
the decision write alone is timed by the coordinator itself (``decision_ms`` in the history).
Prints p50 / p90 per batch for both and their ratio. Goal: under 30 ms p50 per batch on moto.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from setups.servers.moto import private_server
from twophase import (
    AbortOutcome,
    CommitOutcome,
    Handle,
    TransactionContext,
    TwoPhaseCommitSink,
    TxnId,
)
from twophase.testing.contract import NAMESPACE, QUERY_ID
from twophase.testing.protocol import Coordinator, StateStore


class NullSink(TwoPhaseCommitSink[TxnId]):
    """Commits nothing, instantly: what remains of a batch is the framework's own work."""

    kind: ClassVar[str] = "null"

    def begin_transaction(self, ctx: TransactionContext) -> TxnId:
        return ctx.txn_id

    def write(self, txn: TxnId, rows: Iterable[Sequence[Any]]) -> None:
        """Nothing to write."""

    def pre_commit(self, txn: TxnId) -> Handle:
        return self.handle(txn, 0)

    def commit(self, handle: Handle) -> CommitOutcome:
        return CommitOutcome.COMMITTED

    def abort(self, handle: Handle) -> AbortOutcome:
        return AbortOutcome.NOT_FOUND

    def list_in_doubt(self, namespace: str) -> list[Handle]:
        return []


def run(store: StateStore, batches: int, partitions: int) -> tuple[list[float], list[float]]:
    """Milliseconds per batch (commit_batch) and per decision write, after 5 warm-up batches."""
    sink = NullSink()
    epoch = store.start_run(NAMESPACE, {}).epoch
    per_batch = []
    with Coordinator(sink, store, namespace=NAMESPACE, epoch=epoch) as coordinator:
        for batch in range(batches + 5):
            handles = [sink.handle(TxnId.open(namespace=NAMESPACE, query_id=QUERY_ID,
                                              epoch=epoch, batch=batch, partition=p,
                                              attempt=p), 0) for p in range(partitions)]
            started = time.perf_counter()
            coordinator.commit_batch(batch, QUERY_ID, handles)
            per_batch.append((time.perf_counter() - started) * 1000)
    state = store.read_existing()
    decisions = [record.decision_ms for record in state.history]
    return per_batch[5:], decisions[5:]


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, private_server(Path(tmp) / "moto") as server:
        bucket = server.new_bucket("state")
        options = {key: server.options()[key] for key in (
            "endpoint_url", "region", "path_style", "access_key_id", "secret_access_key")}
        results = {
            "local": run(StateStore(Path(tmp) / "state"), args.batches, args.partitions),
            "s3 (moto)": run(StateStore(f"s3://{bucket}/checkpoints/orders/twophase", options),
                             args.batches, args.partitions),
        }
    print(f"{args.batches} batches of {args.partitions} handles, null sink")
    print("| state | per batch p50 ms | p90 ms | decision write p50 ms | p90 ms |")
    print("|---|---|---|---|---|")
    for name, (per_batch, decisions) in results.items():
        print(f"| {name} | {pct(per_batch, 50):.1f} | {pct(per_batch, 90):.1f} | "
              f"{pct(decisions, 50):.1f} | {pct(decisions, 90):.1f} |")
    local, remote = (statistics.median(r[0]) for r in results.values())
    print(f"S3 / local per batch (p50): {remote / local:.1f}x")


if __name__ == "__main__":
    main()
