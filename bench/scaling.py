"""Cost as work grows: the framework's per-batch overhead, recovery time and state file size.

Run from the repository root (never in CI; a few minutes on 2 cores)::

    nice .venv/bin/python -m bench.scaling [--batches 30] [--plot docs/scaling.png]

Three measurements, printed as markdown tables and drawn into one PNG (matplotlib):

1. **Per-batch overhead** against partitions per batch (2 to 256, rows per batch 100,000) and
   against rows per batch (1,000 to 1,000,000, 2 partitions): ``Coordinator.commit_batch``, as
   Spark's commit of a micro-batch calls it, over a sink whose commits return at once
   (:class:`bench.state_store.NullSink`), so what is timed is the framework's own work: reading
   the state, the sweep, the decision write, the commit fan-out over the committer's threads and
   the "done" write. State on local disk and on S3 (a private ``moto_server`` on loopback).
   ``--batches`` batches per point after 3 warm-up batches; p50 and p90. Goals: p50 < 5 ms at 2
   partitions with local state, no worse than linear in partitions.
2. **Recovery at start** against pending handles (1 to 1,000), on :class:`sinks.sqlite.SQLiteSink`
   with real pre-committed transactions (one row each) in one decided batch whose run crashed
   before committing: the time a new run's ``Coordinator.start`` takes to commit them all and
   mark the batch done (the sweep's listing included). Goal: < 1 s for 100 handles.
3. **State file size** with one decided batch pending, against its handles (partitions of a
   batch, or pending handles: the same thing to the file) for the SQLite handles of 2., and
   with no batch pending (after a commit), which is what a healthy query's file stays at.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.state_store import NullSink
from setups.servers.moto import private_server
from sinks.sqlite import SQLiteSink
from twophase import Handle, TxnId
from twophase.testing.contract import NAMESPACE, QUERY_ID, context, list_in_doubt, orders
from twophase.testing.protocol import Coordinator, Decision, State, StateStore

PARTITIONS = (2, 4, 8, 16, 32, 64, 128, 256)
ROWS_PER_BATCH = (1_000, 10_000, 100_000, 1_000_000)
PENDING_HANDLES = (1, 10, 100, 1_000)
DEFAULT_ROWS = 100_000
DEFAULT_PARTITIONS = 2
WARM_UP_BATCHES = 3
GOAL_P50_MS = 5.0
GOAL_RECOVERY_S = 1.0
ORDERS_DDL = ("CREATE TABLE orders (event_id INTEGER NOT NULL, order_id INTEGER NOT NULL, "
               "status TEXT NOT NULL, ts TEXT)")


def null_handles(sink: NullSink, epoch: int, batch: int, partitions: int, rows: int
                 ) -> list[Handle]:
    return [sink.handle(TxnId.open(namespace=NAMESPACE, query_id=QUERY_ID, epoch=epoch,
                                   batch=batch, partition=p, attempt=0), rows // partitions)
            for p in range(partitions)]


def overhead_ms(store: StateStore, batches: int, partitions: int, rows: int) -> list[float]:
    """Milliseconds of ``commit_batch`` per batch, after the warm-up batches."""
    sink = NullSink()
    epoch = store.start_run(NAMESPACE, {}).epoch
    timings = []
    with Coordinator(sink, store, namespace=NAMESPACE, epoch=epoch) as coordinator:
        start = store.read_existing().last_done_batch + 1
        for batch in range(start, start + WARM_UP_BATCHES + batches):
            handles = null_handles(sink, epoch, batch, partitions, rows)
            started = time.perf_counter()
            coordinator.commit_batch(batch, QUERY_ID, handles)
            timings.append((time.perf_counter() - started) * 1000)
    return timings[WARM_UP_BATCHES:]


def stores(tmp: Path, bucket: str, options: dict[str, Any]) -> dict[str, Any]:
    """Fresh-store factories: local disk and S3 (moto)."""
    counter = iter(range(1_000_000))
    return {
        "local": lambda: StateStore(tmp / f"state-{next(counter)}"),
        "s3 (moto)": lambda: StateStore(f"s3://{bucket}/scaling/{next(counter)}/twophase",
                                        options),
    }


def overhead_table(factories: dict[str, Any], batches: int) -> dict[str, dict[str, list[float]]]:
    """p50/p90 per point: {"partitions"|"rows": {store: [(x, p50, p90), ...]}}."""
    results: dict[str, dict[str, list[Any]]] = {"partitions": {}, "rows": {}}
    for name, factory in factories.items():
        results["partitions"][name] = [
            (p, *_p50_p90(overhead_ms(factory(), batches, p, DEFAULT_ROWS))) for p in PARTITIONS]
        results["rows"][name] = [
            (r, *_p50_p90(overhead_ms(factory(), batches, DEFAULT_PARTITIONS, r)))
            for r in ROWS_PER_BATCH]
    return results


def _p50_p90(values: Sequence[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(values, n=10)
    return statistics.median(values), cuts[8]


def prepared_sqlite(workdir: Path, handles: int) -> tuple[SQLiteSink, list[Handle]]:
    """``handles`` pre-committed SQLite transactions of batch 0 (one row each)."""
    with sqlite3.connect(workdir / "orders.db") as connection:
        connection.execute(ORDERS_DDL)
    sink = SQLiteSink(workdir / "orders.db", "orders")
    prepared = []
    for partition in range(handles):
        txn = sink.begin_transaction(context(batch=0, partition=partition, query_id=QUERY_ID))
        sink.write(txn, orders(partition, 1))
        prepared.append(sink.pre_commit(txn))
    return sink, prepared


def recovery_s(workdir: Path, handles: int) -> tuple[float, int]:
    """Seconds a new run's start takes to finish a decided batch of ``handles`` SQLite
    transactions; and the state file's size while that batch is pending."""
    sink, prepared = prepared_sqlite(workdir, handles)
    store = StateStore(workdir / "state")
    epoch = store.start_run(NAMESPACE, {}).epoch
    decision = Decision(0, epoch, time.time(), tuple(prepared))
    store.update(lambda state: replace(state, query_id=QUERY_ID, pending=(decision,)),
                 epoch=epoch)
    size = Path(store.path).stat().st_size
    started = time.perf_counter()
    new_epoch = store.start_run(NAMESPACE, {}).epoch
    with Coordinator(sink, store, namespace=NAMESPACE, epoch=new_epoch) as coordinator:
        coordinator.start(QUERY_ID)
    seconds = time.perf_counter() - started
    state: State = store.read_existing()
    if state.pending or list_in_doubt(sink, NAMESPACE):
        raise SystemExit(f"recovery of {handles} handles left something pending")
    return seconds, size


def idle_state_size(tmp: Path) -> int:
    """The state file of a query after 300 committed batches (history bounded)."""
    store = StateStore(tmp / "idle")
    overhead_ms(store, 300, DEFAULT_PARTITIONS, DEFAULT_ROWS)
    return Path(store.path).stat().st_size


def plot(path: Path, overhead: dict[str, dict[str, list[Any]]],
         recovery: list[tuple[int, float, int]], idle_size: int) -> None:
    import matplotlib  # noqa: PLC0415 - only the plot needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    figure, axes = plt.subplots(2, 2, figsize=(11, 8))
    for (axis, dimension, label) in ((axes[0][0], "partitions", "partitions per batch"),
                                     (axes[0][1], "rows", "rows per batch")):
        for name, points in overhead[dimension].items():
            xs = [point[0] for point in points]
            axis.plot(xs, [point[1] for point in points], marker="o", label=f"{name} p50")
            axis.plot(xs, [point[2] for point in points], linestyle="--", label=f"{name} p90")
        axis.set(xscale="log", yscale="log", xlabel=label, ylabel="ms per batch",
                 title=f"framework overhead per batch vs {label}")
        axis.axhline(GOAL_P50_MS, color="grey", linewidth=0.8)
        axis.legend(fontsize=8)
    handles = [point[0] for point in recovery]
    axes[1][0].plot(handles, [point[1] for point in recovery], marker="o")
    axes[1][0].axhline(GOAL_RECOVERY_S, color="grey", linewidth=0.8)
    axes[1][0].set(xscale="log", yscale="log", xlabel="pending handles (SQLite)",
                   ylabel="seconds", title="recovery at start vs pending handles")
    axes[1][1].plot(handles, [point[2] / 1024 for point in recovery], marker="o",
                    label="one batch pending")
    axes[1][1].axhline(idle_size / 1024, color="grey", linewidth=0.8,
                       label="nothing pending (300 batches done)")
    axes[1][1].set(xscale="log", yscale="log", xlabel="handles of the pending batch",
                   ylabel="KiB", title="state file size")
    axes[1][1].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def report(overhead: dict[str, dict[str, list[Any]]], recovery: list[tuple[int, float, int]],
           idle_size: int) -> None:
    for dimension, label in (("partitions", "partitions"), ("rows", "rows per batch")):
        names = list(overhead[dimension])
        print(f"\n| {label} | " + " | ".join(f"{name} p50 / p90 ms" for name in names) + " |")
        print("|---|" + "---|" * len(names))
        for index, point in enumerate(overhead[dimension][names[0]]):
            cells = [f"{overhead[dimension][name][index][1]:.1f} / "
                     f"{overhead[dimension][name][index][2]:.1f}" for name in names]
            print(f"| {point[0]:,} | " + " | ".join(cells) + " |")
    print("\n| pending handles (SQLite) | recovery s | state file bytes |")
    print("|---|---|---|")
    for handles, seconds, size in recovery:
        print(f"| {handles:,} | {seconds:.3f} | {size:,} |")
    print(f"\nstate file with nothing pending (300 batches done): {idle_size:,} bytes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--plot", type=Path, default=Path("docs/scaling.png"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="twophase-scaling-") as name, \
            private_server(Path(name) / "moto") as server:
        tmp = Path(name)
        bucket = server.new_bucket("state")
        options = {key: server.options()[key] for key in (
            "endpoint_url", "region", "path_style", "access_key_id", "secret_access_key")}
        overhead = overhead_table(stores(tmp, bucket, options), args.batches)
        recovery = []
        for handles in PENDING_HANDLES:
            workdir = tmp / f"recovery-{handles}"
            workdir.mkdir()
            recovery.append((handles, *recovery_s(workdir, handles)))
        idle_size = idle_state_size(tmp)
    report(overhead, recovery, idle_size)
    plot(args.plot, overhead, recovery, idle_size)
    print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
