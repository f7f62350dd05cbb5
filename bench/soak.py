"""A month in production, compressed: one query for many thousands of batches, its driver
SIGKILLed every few hundred batches, cleanup run between restarts.

Run from the repository root (never in CI)::

    .venv/bin/python -m bench.soak --sink sqlite --batches 100000 [--restart-every 500]
        [--partitions 2] [--rows 4] [--sample-every 1000] [--out docs/soak]

The driver here is the framework without Spark, driven as Spark drives it (as the protocol
model does, :mod:`twophase.testing.model`): a child process starts a run (a new epoch: fence,
recover, sweep), and for each batch runs every partition's task through the executors' real
``write_partition`` and the batch's commit through ``Coordinator.commit_batch``, then records
the batch in a commit log of its own (Spark's). Each child is armed at a random crash point
of a random batch within ``--restart-every`` (``TWOPHASE_CRASH_AT``: the real SIGKILL of its
process session), or, one time in three, SIGKILLed by this process at a random moment
instead; ``python -m twophase.cleanup`` then runs (with a short retention, so proofs of commit
are purged as a production cron does), and the next child goes on from Spark's commit log.

Sampled every ``--sample-every`` batches (a JSON line each, and a table at the end): decide +
commit latency p50/p99 of the batches since the last sample, the child's RSS, the state file's
size, the target's bookkeeping rows (the sink's proofs of commit and staging), the rows
visible. At the end every row must be visible exactly once and nothing left in doubt.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from setups import SETUPS
from setups.base import Target
from twophase import Handle, RetryPolicy, TwoPhaseCommitSink
from twophase.testing.contract import ORDER_COLUMNS, orders
from twophase.testing.crash_points import CRASH_ENV, CRASH_POINTS
from twophase.testing.protocol import (
    Coordinator,
    Delivery,
    RunConfig,
    StateStore,
    build_sink,
    write_partition,
)
from twophase.testing.simulated import FakeTask

log = logging.getLogger("bench.soak")

NAMESPACE = "soak"
QUERY_ID = "50a4c0de-0000-4000-8000-000000000000"
DEFAULT_BATCHES = 100_000
DEFAULT_RESTART_EVERY = 500
DEFAULT_PARTITIONS = 2
DEFAULT_ROWS = 4
DEFAULT_SAMPLE_EVERY = 1_000
#: One restart in this many is a SIGKILL at a random moment rather than at a crash point.
RANDOM_KILL_ONE_IN = 3
#: Proofs of commit older than this are purged by each cleanup (production: days).
CLEANUP_RETENTION = "30s"
SPARK_COMMIT_LOG = "spark-commits"
RETRY = RetryPolicy(max_attempts=20, initial_backoff_s=0.05, max_backoff_s=1.0)


# -- the child: one run of the query ----------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What a child runs (passed as JSON on its command line)."""

    factory: str
    options: dict[str, Any]
    state: str
    workdir: str
    batches: int
    partitions: int
    rows: int
    sample_every: int


def event_ids(plan: Plan, batch: int, partition: int) -> range:
    first = (batch * plan.partitions + partition) * plan.rows
    return range(first, first + plan.rows)


def run_child(plan: Plan) -> None:
    """Batches from the one after Spark's last committed, until ``plan.batches`` or killed."""
    workdir = Path(plan.workdir)
    commit_log = workdir / SPARK_COMMIT_LOG
    store = StateStore(plan.state)
    state = store.start_run(NAMESPACE, {})
    sink = build_sink(plan.factory, plan.options)
    sink.check_schema(ORDER_COLUMNS)
    batch = int(commit_log.read_text()) + 1 if commit_log.exists() else 0
    config = RunConfig(sink=sink, state_location=plan.state, namespace=NAMESPACE,
                       epoch=state.epoch, columns=ORDER_COLUMNS, retry=RETRY,
                       decided_through=state.last_decided_batch)
    attempts = iter(range(sys.maxsize))
    latencies: list[float] = []
    with Coordinator(sink, store, namespace=NAMESPACE, epoch=state.epoch) as coordinator, \
            (workdir / "samples.jsonl").open("a") as samples:
        coordinator.start(QUERY_ID)
        coordinator.record_query(QUERY_ID)
        while batch < plan.batches:
            handles = []
            for partition in range(plan.partitions):
                rows = orders(event_ids(plan, batch, partition)[0], plan.rows)
                message = write_partition(
                    config, delivering(rows), batch=batch, query_id=QUERY_ID,
                    task=FakeTask(partition, next(attempts), 0))
                if message.handle:
                    handles.append(Handle.loads(message.handle))
            started = time.perf_counter()
            coordinator.commit_batch(batch, QUERY_ID, handles)
            latencies.append((time.perf_counter() - started) * 1000)
            _replace(commit_log, str(batch))  # Spark's commit log: the batch is done for Spark
            batch += 1
            if batch % plan.sample_every == 0:
                samples.write(json.dumps(_sample(batch, latencies, plan)) + "\n")
                samples.flush()
                latencies.clear()


def delivering(rows: list[tuple[Any, ...]]) -> Delivery:
    """A task's delivery of ``rows`` into its transaction."""
    def deliver(sink: TwoPhaseCommitSink[Any], txn: Any) -> None:
        sink.write(txn, rows)
    return deliver


def _sample(batch: int, latencies: list[float], plan: Plan) -> dict[str, Any]:
    return {"batch": batch, "t": time.time(), **latency_percentiles(latencies),
            "rss_mb": round(rss_mb(os.getpid()), 1), "state_bytes": size(Path(plan.state))}


def latency_percentiles(latencies: list[float]) -> dict[str, float]:
    """``commit_ms_p50`` and ``commit_ms_p99`` of ``latencies`` (ms; none: nothing)."""
    if not latencies:
        return {}
    quantiles = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    return {"commit_ms_p50": round(quantiles[49], 3), "commit_ms_p99": round(quantiles[98], 3)}


def rss_mb(pid: int) -> float:
    """The resident set of process ``pid`` in MB (0 once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def size(path: Path) -> int:
    """The bytes of a file, or of every file under a directory (0 if missing)."""
    if path.is_file():
        return path.stat().st_size
    return sum(_file_size(p) for p in path.rglob("*")) if path.exists() else 0


def _file_size(path: Path) -> int:
    """A file's bytes, 0 for a directory or a file deleted meanwhile (Spark purges its logs)."""
    try:
        return path.stat().st_size if path.is_file() else 0
    except OSError:
        return 0


def _replace(path: Path, text: str) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


# -- the parent: restarts, cleanup, the verdict -----------------------------------------------


@dataclass
class Restart:
    """One child's end: how it was stopped, and where."""

    number: int
    how: str
    spark_batch: int
    seconds: float


def soak(target: Target, workdir: Path, *, batches: int, restart_every: int, partitions: int,
         rows: int, sample_every: int, rng: random.Random) -> list[Restart]:
    plan = Plan(target.factory, dict(target.options), str(workdir / "state"), str(workdir),
                batches, partitions, rows, sample_every)
    restarts: list[Restart] = []
    while _spark_batch(workdir) < batches - 1:
        restarts.append(_one_child(plan, workdir, len(restarts), restart_every, rng))
        cleanup(plan.factory, plan.options, plan.state)
        log.info("restart %d: %s at Spark's batch %d (%.1fs)", restarts[-1].number,
                 restarts[-1].how, restarts[-1].spark_batch, restarts[-1].seconds)
    cleanup(plan.factory, plan.options, plan.state)
    return restarts


def _one_child(plan: Plan, workdir: Path, number: int, restart_every: int,
               rng: random.Random) -> Restart:
    first = _spark_batch(workdir) + 1
    env = dict(os.environ)
    random_kill = rng.randrange(RANDOM_KILL_ONE_IN) == 0
    kill_after_s = None
    if random_kill:
        kill_after_s = rng.uniform(1.0, 30.0)
        how = f"SIGKILL after {kill_after_s:.1f}s"
    else:
        point = rng.choice(CRASH_POINTS)
        at = first + rng.randrange(restart_every)
        env[CRASH_ENV] = f"{point}@{at}"
        how = f"{point}@{at}"
    started = time.monotonic()
    child = subprocess.Popen([sys.executable, "-m", "bench.soak", "--child",
                              json.dumps(asdict(plan))], env=env, start_new_session=True)
    try:
        child.wait(timeout=kill_after_s)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    if child.returncode == 0:
        how = "finished"
    elif child.returncode != -signal.SIGKILL:
        raise RuntimeError(f"child {number} failed with exit code {child.returncode}")
    return Restart(number, how, _spark_batch(workdir), time.monotonic() - started)


def _spark_batch(workdir: Path) -> int:
    commit_log = workdir / SPARK_COMMIT_LOG
    return int(commit_log.read_text()) if commit_log.exists() else -1


def cleanup(factory: str, options: dict[str, Any], state: str,
            retention: str = CLEANUP_RETENTION) -> None:
    """``python -m twophase.cleanup`` of one query's target, as a production cron runs it."""
    done = subprocess.run([sys.executable, "-m", "twophase.cleanup", "--sink", factory,
                           "--options", json.dumps(options), "--state", state,
                           "--namespace", NAMESPACE, "--retention", retention],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"cleanup failed ({done.returncode}): {done.stderr[-2000:]}")


def verdict(target: Target, plan_rows: int) -> dict[str, Any]:
    visible = target.visible()
    duplicates = len(visible) - len(set(visible))
    missing = plan_rows - len(set(visible))
    return {"visible": len(visible), "expected": plan_rows, "duplicates": duplicates,
            "missing": missing, "in_doubt": len(target.in_doubt())}


@contextlib.contextmanager
def fresh_target(sink: str, folder: Path) -> Iterator[Target]:
    """A fresh target of ``sink`` on a private server of its own (its setup's)."""
    with SETUPS[sink].started(folder) as setup:
        yield setup.new_target()


@dataclass(frozen=True)
class Panel:
    """One panel of the plot: the sample keys drawn (each a line), its axis label, and the
    unit the values are divided by."""

    label: str
    keys: tuple[str, ...]
    scale: float = 1.0


KIB = 1024.0
#: Every panel a soak's samples may fill (a panel none of whose keys a sample has is left out).
PANELS = (
    Panel("decide + commit (ms)", ("commit_ms_p50", "commit_ms_p99")),
    Panel("driver RSS (MB)", ("rss_mb", "driver_rss_mb", "driver_python_rss_mb",
                              "driver_jvm_rss_mb", "workers_rss_mb")),
    Panel("state file (KiB)", ("state_bytes",), KIB),
    Panel("checkpoint (KiB)", ("checkpoint_bytes",), KIB),
    Panel("/metrics scrape (ms)", ("metrics_ms",)),
    Panel("bookkeeping (rows, ids, objects)",
          ("committed_rows", "prepared_rows", "marker_rows", "transactional_ids",
           "registry_offsets", "registry_records", "objects")),
    Panel("Kafka registry on disk (KiB)", ("registry_bytes",), KIB),
)


def plot(samples: Path, png: Path) -> None:
    """Every :data:`PANELS` panel the samples fill, against the batch number."""
    import matplotlib  # noqa: PLC0415 - only for the plot
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    rows = [json.loads(line) for line in samples.read_text().splitlines() if line.strip()]
    panels = [panel for panel in PANELS if any(key in row for row in rows for key in panel.keys)]
    figure, axes = plt.subplots(len(panels), 1, figsize=(8, 3 * len(panels)), sharex=True,
                                squeeze=False)
    for axis, panel in zip(axes[:, 0], panels, strict=True):
        for key in panel.keys:
            points = [(row["batch"], row[key] / panel.scale) for row in rows
                      if row.get(key) is not None]
            if points:
                axis.plot(*zip(*points, strict=True), label=key)
        axis.set_ylabel(panel.label)
        axis.legend(fontsize="small")
        axis.set_ylim(0, axis.get_ylim()[1] * 1.2)
        axis.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("batch")
    figure.suptitle(f"soak: {samples.stem}")
    figure.tight_layout()
    figure.savefig(png, dpi=90)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--sink", choices=sorted(SETUPS), default="sqlite")
    parser.add_argument("--batches", type=int, default=DEFAULT_BATCHES)
    parser.add_argument("--restart-every", type=int, default=DEFAULT_RESTART_EVERY)
    parser.add_argument("--partitions", type=int, default=DEFAULT_PARTITIONS)
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS, help="per partition")
    parser.add_argument("--sample-every", type=int, default=DEFAULT_SAMPLE_EVERY)
    parser.add_argument("--seed", type=int, default=20261125)
    parser.add_argument("--out", type=Path, help="write samples.jsonl and the summary here")
    parser.add_argument("--plot", nargs=2, type=Path, metavar=("SAMPLES", "PNG"),
                        help="only draw SAMPLES (a samples .jsonl of --out) into PNG")
    args = parser.parse_args()
    if args.plot:
        plot(*args.plot)
        return 0
    if args.child:
        logging.basicConfig(level=logging.ERROR)
        run_child(Plan(**json.loads(args.child)))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("twophase", "sinks"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="twophase-soak-") as scratch, \
            fresh_target(args.sink, Path(scratch) / "target") as target:
        workdir = Path(scratch)
        started = time.monotonic()
        restarts = soak(target, workdir, batches=args.batches,
                        restart_every=args.restart_every, partitions=args.partitions,
                        rows=args.rows, sample_every=args.sample_every,
                        rng=random.Random(args.seed))
        result = {"sink": args.sink, "batches": args.batches, "restarts": len(restarts),
                  "seconds": round(time.monotonic() - started, 1),
                  **verdict(target, args.batches * args.partitions * args.rows)}
        samples = (workdir / "samples.jsonl").read_text()
        log.info("%s\n%s", samples, json.dumps(result))
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"soak-{args.sink}-samples.jsonl").write_text(samples)
            (args.out / f"soak-{args.sink}.json").write_text(json.dumps(
                {**result, "restart_log": [asdict(r) for r in restarts]}, indent=1))
    ok = result["duplicates"] == result["missing"] == result["in_doubt"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
