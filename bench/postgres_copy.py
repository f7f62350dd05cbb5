"""PostgresSink against raw COPY on the same private server, no Spark, one run.

Run from the repository root (about a minute on 2 cores)::

    .venv/bin/python -m bench.postgres_copy [--rows 200000] [--partitions 4] [--rounds 3]

A private PostgreSQL (``setups.servers.postgres``: durable commits, ``fsync=off``). The rows
(event_id, order_id, status, ts TIMESTAMP) are built once as Arrow record batches of 10,000
rows, as Spark's data source path hands them over, split into ``--partitions`` partitions;
each variant writes all of them into an empty table, ``--rounds`` times after a warm-up:

* ``sink``: ``PostgresSink`` as the framework drives it: per partition begin, ``write_arrow``
  (COPY of Arrow's CSV), pre-commit (marker row, ``PREPARE TRANSACTION``); then every
  partition's ``COMMIT PREPARED`` through one committer.
* ``raw COPY``: per partition one plain transaction on one connection: ``COPY ... (FORMAT
  csv)`` of the same Arrow CSV, ``COMMIT``: the at-least-once floor.
* ``sink rows``: the sink's ``write`` with the same rows as Python tuples (psycopg's row copy:
  the ``foreachBatch`` path).

Ratios are medians of same-round pairs (raw COPY time / variant time: 1.0 = as fast as raw).
Every run is checked for exactly the expected rows. Spark's JDBC writer is the peer of
``bench/spark_peers.py``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
from psycopg import sql

from setups import PostgresSetup
from sinks.postgres import PostgresSink
from twophase import TransactionContext, TxnId
from twophase.kit import rows_of
from twophase.testing.arrow import record_batches
from twophase.testing.contract import ORDER_COLUMNS

DEFAULT_ROWS = 200_000
DEFAULT_PARTITIONS = 4
DEFAULT_ROUNDS = 3
ROWS_PER_BATCH = 10_000
FIRST_TS = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
STATUSES = ("created", "paid", "packed", "shipped")


def partitions_of(rows: int, partitions: int) -> list[list[pa.RecordBatch]]:
    per = rows // partitions
    return [record_batches([(i, 1000 + i % 5000, STATUSES[i % 4],
                             FIRST_TS + dt.timedelta(seconds=i))
                            for i in range(p * per, (p + 1) * per)], ORDER_COLUMNS,
                           rows_per_batch=ROWS_PER_BATCH)
            for p in range(partitions)]


def sink_arrow(sink: PostgresSink, parts: Sequence[list[pa.RecordBatch]]) -> None:
    _through_sink(sink, parts, sink.write_arrow)


def sink_rows(sink: PostgresSink, parts: Sequence[list[pa.RecordBatch]]) -> None:
    _through_sink(sink, parts, lambda txn, batches: sink.write(txn, list(rows_of(batches))))


def _through_sink(sink: PostgresSink, parts: Sequence[list[pa.RecordBatch]],
                  deliver: Callable[[Any, list[pa.RecordBatch]], None]) -> None:
    query = str(uuid.uuid4())
    handles = []
    for partition, batches in enumerate(parts):
        txn_id = TxnId.open(namespace="bench", query_id=query, epoch=1, batch=0,
                            partition=partition, attempt=0)
        txn = sink.begin_transaction(TransactionContext(txn_id, ORDER_COLUMNS))
        deliver(txn, batches)
        handles.append(sink.pre_commit(txn))
    with sink.committer() as committer:
        for handle in handles:
            committer.commit(handle)


def raw_copy(sink: PostgresSink, parts: Sequence[list[pa.RecordBatch]]) -> None:
    names = ", ".join(column.name for column in ORDER_COLUMNS)
    options = pa_csv.WriteOptions(include_header=False)
    with sink.server.connect(autocommit=False) as conn:
        for batches in parts:
            with conn.cursor() as cursor, cursor.copy(
                    f"COPY {sink.target} ({names}) FROM STDIN (FORMAT csv)") as copy:
                for batch in batches:
                    out = pa.BufferOutputStream()
                    pa_csv.write_csv(batch, out, write_options=options)
                    copy.write(memoryview(out.getvalue()))
            conn.commit()


VARIANTS: dict[str, Callable[[PostgresSink, Sequence[list[pa.RecordBatch]]], None]] = {
    "raw COPY": raw_copy, "sink": sink_arrow, "sink rows": sink_rows}


def timed(setup: PostgresSetup, variant: str, parts: Sequence[list[pa.RecordBatch]],
          expected: int) -> float:
    target = setup.new_target()
    sink = PostgresSink(**target.options)
    sink.check_schema(ORDER_COLUMNS)
    started = time.perf_counter()
    VARIANTS[variant](sink, parts)
    elapsed = time.perf_counter() - started
    visible = target.visible()
    if len(visible) != expected or len(set(visible)) != expected:
        raise SystemExit(f"{variant}: {len(visible)} rows visible, {expected} expected")
    setup.view.query(sql.SQL("DROP TABLE {}").format(sql.Identifier(target.options["table"])))
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS)
    parser.add_argument("--partitions", type=int, default=DEFAULT_PARTITIONS)
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    args = parser.parse_args()
    parts = partitions_of(args.rows, args.partitions)
    expected = sum(batch.num_rows for batches in parts for batch in batches)
    walls: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    with tempfile.TemporaryDirectory() as scratch, \
            PostgresSetup.started(Path(scratch)) as setup:
        for round_number in range(args.rounds + 1):
            for variant in VARIANTS:
                elapsed = timed(setup, variant, parts, expected)
                if round_number:  # round 0 warms up
                    walls[variant].append(elapsed)
    print(f"{expected} rows in {args.partitions} partitions, {args.rounds} rounds")
    for variant, times in walls.items():
        ratio = statistics.median(raw / mine for raw, mine in zip(walls["raw COPY"], times,
                                                                 strict=True))
        print(f"{variant:10s} median {statistics.median(times):6.2f} s  "
              f"{expected / statistics.median(times):9.0f} rows/s  vs raw COPY {ratio:.3f}")


if __name__ == "__main__":
    main()
