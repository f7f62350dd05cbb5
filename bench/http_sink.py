"""HttpSink against raw ``requests`` posting the same records to the same receiver, one run.

Run from the repository root (about a minute on 2 cores)::

    .venv/bin/python -m bench.http_sink [--records 100000] [--per-request 1000] [--rounds 3]

A private reference receiver (``python -m sinks.http.receiver``, started through
``setups.servers.http_receiver``) on loopback, requiring a bearer token and a signature, storing
every record in its SQLite store (WAL, ``synchronous=FULL``). The input: order rows with a
100-character payload, made before the clock starts, split into ``--partitions`` slices. Each
round, after a warm-up round, both sides take turns going first:

* ``HttpSink``: per slice ``begin_transaction``, ``write``, ``pre_commit`` (encoded, split
  into requests of ``--per-request`` records, staged with fsync), on ``--partitions`` threads as
  tasks would; then one committer sends every handle's requests on as many threads, as the
  driver does, and records each commit.
* ``raw requests``: per slice on as many threads, the same rows as JSON arrays of the same
  size, each POSTed with a fresh ``Idempotency-Key``, the token and a signature through one
  pooled session: a hand-written at-least-once poster.

Ratio: median over rounds of the sink's records/s over raw's (goal >= 0.9); with each side's
CPU time in this (client) process per record, steadier than wall clock on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

from setups.servers.http_receiver import ReceiverProcess, started
from sinks.http import HttpSink
from sinks.http.protocol import IDEMPOTENCY_KEY, SIGNATURE, key_header
from sinks.http.signing import sign
from twophase import Column
from twophase.testing.contract import ORDER_COLUMNS, QUERY_ID, prepare

PAYLOAD_CHARS = 100
NAMES = (*(column.name for column in ORDER_COLUMNS), "payload")
COLUMNS = (*ORDER_COLUMNS, Column("payload", "string"))
Row = tuple[Any, ...]


def make_rows(count: int) -> list[Row]:
    blob = os.urandom(count * PAYLOAD_CHARS // 2).hex()
    ts = datetime(2026, 11, 1, tzinfo=UTC)
    return [(i, 1000 + i, "paid", ts, blob[i * PAYLOAD_CHARS:(i + 1) * PAYLOAD_CHARS])
            for i in range(count)]


def slices(rows: list[Row], parts: int) -> list[list[Row]]:
    size = -(-len(rows) // parts)
    return [rows[i:i + size] for i in range(0, len(rows), size)]


Timing = tuple[float, float]  # wall seconds, this process's CPU seconds


def clocks() -> Timing:
    return time.perf_counter(), time.process_time()


def since(start: Timing) -> Timing:
    wall, cpu = clocks()
    return wall - start[0], cpu - start[1]


def run_sink(sink: HttpSink, parts: list[list[Row]], round_no: int) -> Timing:
    start = clocks()
    with ThreadPoolExecutor(len(parts)) as pool:
        handles = list(pool.map(
            lambda p: prepare(sink, parts[p], batch=round_no, partition=p, columns=COLUMNS),
            range(len(parts))))
        committer = sink.committer()
        committer.fence(handles[0].txn_id.namespace, QUERY_ID, handles[0].txn_id.epoch)
        list(pool.map(committer.commit, handles))
        committer.close()
    return since(start)


def post_raw(session: requests.Session, receiver: ReceiverProcess, url: str,
             rows: Sequence[Row], per_request: int) -> None:
    for first in range(0, len(rows), per_request):
        body = json.dumps([dict(zip(NAMES, row, strict=True))
                           for row in rows[first:first + per_request]], default=str).encode()
        assert receiver.token is not None and receiver.signing_secret is not None
        reply = session.post(url, data=body, timeout=60, headers={
            "Content-Type": "application/json", IDEMPOTENCY_KEY: key_header(str(uuid.uuid4())),
            "Authorization": f"Bearer {receiver.token}",
            SIGNATURE: sign(receiver.signing_secret.encode(), body, time.time())})
        reply.raise_for_status()


def run_raw(session: requests.Session, receiver: ReceiverProcess, path: str,
            parts: list[list[Row]], per_request: int) -> Timing:
    start = clocks()
    with ThreadPoolExecutor(len(parts)) as pool:
        list(pool.map(lambda rows: post_raw(session, receiver, receiver.url(path), rows,
                                            per_request), parts))
    return since(start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--per-request", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = make_rows(args.records)
    parts = slices(rows, args.partitions)
    session = requests.Session()
    with tempfile.TemporaryDirectory() as tmp, started(Path(tmp) / "receiver") as receiver:
        def sink_at(path: str) -> HttpSink:
            return HttpSink(**receiver.sink_options(path), staging=f"{tmp}/staging",
                            max_records_per_request=args.per_request,
                            max_bytes_per_request=64 * 1024 * 1024)

        run_sink(sink_at("/warm/sink"), parts, 0)
        run_raw(session, receiver, "/warm/raw", parts, args.per_request)
        sink_rates, raw_rates, sink_cpu, raw_cpu = [], [], [], []
        for round_no in range(1, args.rounds + 1):
            raw_first = round_no % 2 == 0
            if raw_first:
                raw = run_raw(session, receiver, f"/raw/{round_no}", parts, args.per_request)
            ours = run_sink(sink_at(f"/sink/{round_no}"), parts, round_no)
            if not raw_first:
                raw = run_raw(session, receiver, f"/raw/{round_no}", parts, args.per_request)
            assert len(receiver.records(f"/sink/{round_no}")) == args.records
            assert len(receiver.records(f"/raw/{round_no}")) == args.records
            sink_rates.append(args.records / ours[0])
            raw_rates.append(args.records / raw[0])
            sink_cpu.append(ours[1] / args.records * 1e6)
            raw_cpu.append(raw[1] / args.records * 1e6)
            print(f"round {round_no}: HttpSink {sink_rates[-1]:,.0f} records/s "
                  f"({sink_cpu[-1]:.1f} us CPU/record), raw requests {raw_rates[-1]:,.0f} "
                  f"records/s ({raw_cpu[-1]:.1f} us CPU/record)"
                  f"{' (raw first)' if raw_first else ''}", flush=True)
        ratios = [s / r for s, r in zip(sink_rates, raw_rates, strict=True)]
        print(f"median HttpSink {statistics.median(sink_rates):,.0f} records/s "
              f"({statistics.median(sink_cpu):.1f} us client CPU/record), raw requests "
              f"{statistics.median(raw_rates):,.0f} records/s "
              f"({statistics.median(raw_cpu):.1f} us), ratio {statistics.median(ratios):.3f} "
              f"(rounds: {', '.join(f'{r:.3f}' for r in ratios)})")

if __name__ == "__main__":
    main()
