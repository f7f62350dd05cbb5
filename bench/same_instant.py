"""What one local transaction for a table and a lake table costs against ``COMMIT PREPARED``.

Run from the repository root (a few minutes on 2 cores)::

    .venv/bin/python -m bench.same_instant [--rows 10000] [--partitions 4] [--batches 7]

A private PostgreSQL (``setups.servers.postgres``) holds the orders table and the Iceberg SQL
catalog (``IcebergSetup.on_postgres``, data under a local warehouse). Two sink groups, each a
PostgreSQL table then an Iceberg table, write ``--batches`` batches of ``--partitions``
partitions x ``--rows`` rows (Arrow record batches, as Spark's data source path hands them
over), no Spark:

* ``one local transaction``: ``PostgresSink(publish="staged")`` + ``IcebergSink``: one commit
  stage; ONE local transaction moves the staged rows into the table (``DELETE ... RETURNING``
  into ``INSERT``), writes the markers and swaps the catalog row, then ``finish_batch``.
* ``COMMIT PREPARED + catalog``: ``PostgresSink()`` (prepared) + ``IcebergSink``: the table's
  stage (``COMMIT PREPARED`` per partition, ``commit_parallelism`` threads) then the lake's
  (one snapshot, pyiceberg's own catalog commit), then ``finish_batch``.

Timed: the driver's commit of a decided batch, as the coordinator runs it (every stage: first
handle, then the rest in parallel; then ``finish_batch``); also the executors' write +
pre-commit of the batch. Medians over the batches after the first (warm-up). Every batch is
checked for exactly the expected rows in both tables.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from setups import IcebergSetup, PostgresSetup
from twophase import CommitOutcome, Handle, SinkGroup, StageCommits
from twophase.testing.contract import ORDER_COLUMNS, context, orders

VARIANTS = {"one local transaction": "staged", "COMMIT PREPARED + catalog": "prepared"}


def record_batch(first: int, count: int) -> pa.RecordBatch:
    rows = orders(first, count)
    names = [column.name for column in ORDER_COLUMNS]
    return pa.RecordBatch.from_arrays(
        [pa.array([row[i] for row in rows]) for i in range(len(names))], names=names)


def write_batch(group: SinkGroup, namespace: str, batch: int, partitions: int, rows: int
                ) -> list[Handle]:
    handles = []
    for partition in range(partitions):
        ctx = context(batch=batch, partition=partition, namespace=namespace)
        txn = group.begin_transaction(ctx)
        group.write_arrow(txn, [record_batch((batch * partitions + partition) * rows, rows)])
        handles.append(group.pre_commit(txn))
    return handles


@dataclass(frozen=True)
class ParallelCommits(StageCommits):
    """A stage's handles one by one as the coordinator commits them: the first alone, then the
    rest in parallel (a stage settled at once: one settle)."""

    parallelism: int = 1

    def one_by_one(self, handles: Sequence[Handle]) -> list[CommitOutcome]:
        first, *rest = handles
        outcomes = [self.committer.commit(first)]
        with ThreadPoolExecutor(max_workers=max(1, min(self.parallelism, len(rest)))) as pool:
            outcomes.extend(pool.map(self.committer.commit, rest))
        return outcomes


def commit_batch(group: SinkGroup, namespace: str, batch: int, handles: Sequence[Handle]
                 ) -> list[str]:
    """As the coordinator commits a decision: stage after stage, then finish_batch."""
    with group.committer() as committer:
        stages = committer.commit_stages(handles)
        for stage in stages:
            stage.committer.commit_handles(
                stage.handles, ParallelCommits(stage.committer, stage.parallelism))
        committer.finish_batch(namespace, batch, handles)
    return [str(stage.label) for stage in stages]


def run(variant: str, postgres: PostgresSetup, iceberg: IcebergSetup, *, batches: int,
        partitions: int, rows: int) -> dict[str, Any]:
    table = postgres.new_target(publish=VARIANTS[variant])
    lake = iceberg.new_target()
    group = SinkGroup({"orders": table.build(), "lake": lake.build()})
    group.check_schema(ORDER_COLUMNS)
    namespace = f"bench-{VARIANTS[variant]}"  # the marker table is the database's
    writes, commits, labels = [], [], []
    for batch in range(batches):
        started = time.perf_counter()
        handles = write_batch(group, namespace, batch, partitions, rows)
        written = time.perf_counter()
        labels = commit_batch(group, namespace, batch, handles)
        writes.append(written - started)
        commits.append(time.perf_counter() - written)
        expected = list(range((batch + 1) * partitions * rows))
        assert table.visible() == expected, f"{variant}: the table is not exactly batch 0..{batch}"
        assert lake.visible() == expected, f"{variant}: the lake is not exactly batch 0..{batch}"
    return {"variant": variant, "stages": "+".join(labels) if len(labels) == 1
            else " then ".join(labels),
            "commit_ms": statistics.median(commits[1:]) * 1000,
            "write_ms": statistics.median(writes[1:]) * 1000}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000, help="rows per partition")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batches", type=int, default=7, help="the first is a warm-up")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="twophase-same-instant-") as scratch, \
            PostgresSetup.started(Path(scratch) / "pg") as postgres:
        iceberg = IcebergSetup.on_postgres(Path(scratch) / "iceberg", postgres.server)
        results = [run(variant, postgres, iceberg, batches=args.batches,
                       partitions=args.partitions, rows=args.rows) for variant in VARIANTS]
    print(f"{args.partitions} partitions x {args.rows} rows, medians of {args.batches - 1} "
          "batches")
    print(f"{'variant':28} {'stages':18} {'commit ms':>10} {'write+pre-commit ms':>20}")
    for result in results:
        print(f"{result['variant']:28} {result['stages']:18} {result['commit_ms']:10.1f} "
              f"{result['write_ms']:20.1f}")


if __name__ == "__main__":
    main()
