"""Throughput of MySQLXASink against plain transactions, on one private MariaDB.

Run from the repository root::

    .venv/bin/python -m bench.mysql_xa [--rows 100000] [--partitions 4] [--repeat 7]

(``bench/mysql_arrow.py`` compares the sink's Arrow and Row paths through real Spark.)

It starts a private server exactly as the tests do (``setups.servers.mariadb``: own datadir,
port and socket, binary log on, ``innodb_flush_log_at_trx_commit=1``, ``sync_binlog=1``), builds
the rows once, and times each way of writing them into an empty table, checking afterwards
that every row arrived exactly once. ``--repeat`` rounds run every variant once, back to back;
the ratios are medians over rounds of the paired (same-round) ratios, which keeps them stable
on a machine that other work keeps busy. Client and server CPU per row are reported too (the
server's from ``/proc``): unlike wall time they do not depend on that other work.

* ``sink``: MySQLXASink, one XA branch per partition (begin, write, pre-commit), then a commit
  of every handle through one committer, as the driver does. Exactly once.
* ``sink, Arrow``: the same, the rows handed over as Arrow record batches of 10,000 rows (as
  Spark's data source path does) to ``write_arrow``, which encodes them without per-row Python.
* ``at-least-once``: the same partitions, each one plain transaction through the same bulk
  function (``sinks.mysql.bulk.load_tsv`` of ``encode_tsv`` text, same chunk size). What a non-2PC
  sink would do.
* ``raw``: every row in one plain transaction and a single ``LOAD DATA LOCAL INFILE``: the
  fastest bulk load we know from Python, the ceiling.

and, for reference, the same two with the multi-row ``INSERT`` path (``bulk="insert"``). Rows
are encoded by the same code and connections opened the same way (``open_connection``) in every
variant, so the ratios isolate what XA, the marker row and the per-branch commit cost.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from setups.servers.mariadb import MariaDBServer, private_server
from sinks.mysql import MySQLXASink
from sinks.mysql.bulk import insert_rows, load_tsv
from sinks.mysql.connection import open_connection
from sinks.mysql.encoding import encode_tsv
from twophase import Column, TransactionContext, TxnId
from twophase.kit import DEFAULT_CHUNK_SIZE, Tls, chunks

TABLE = "bench_rows"
TABLE_DDL = (f"CREATE TABLE {TABLE} (id BIGINT NOT NULL PRIMARY KEY, name VARCHAR(64) NOT NULL, "
             "amount DOUBLE, ts DATETIME(6), flag BOOLEAN) ENGINE=InnoDB")
COLUMNS = (Column("id", "bigint", False), Column("name", "string", False),
           Column("amount", "double"), Column("ts", "timestamp"), Column("flag", "boolean"))
NAMES = tuple(column.name for column in COLUMNS)
TARGET = f"`{TABLE}`"
DEFAULT_ROWS = 100_000
DEFAULT_PARTITIONS = 4
DEFAULT_REPEAT = 7
GOAL_VS_AT_LEAST_ONCE = 0.90
GOAL_VS_RAW = 0.80
EPOCH = 1

ARROW_BATCH_ROWS = 10_000  # Spark's spark.sql.execution.arrow.maxRecordsPerBatch
ARROW_SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64()),
                          ("ts", pa.timestamp("us", tz="UTC")), ("flag", pa.bool_())])

Rows = list[tuple[Any, ...]]


def make_rows(count: int) -> Rows:
    start = dt.datetime(2024, 1, 1)
    return [(i, f"customer-{i:08d}", i * 0.25, start + dt.timedelta(seconds=i), i % 3 == 0)
            for i in range(count)]


def split(rows: Rows, partitions: int) -> list[Rows]:
    size = -(-len(rows) // partitions)
    return [rows[i:i + size] for i in range(0, len(rows), size)]


def as_batches(rows: Rows) -> list[pa.RecordBatch]:
    """The rows as Spark's Arrow writer hands them over: record batches, instants in UTC."""
    utc = [(i, name, amount, ts.replace(tzinfo=dt.UTC), flag)
           for i, name, amount, ts, flag in rows]
    return [pa.RecordBatch.from_pylist([dict(zip(ARROW_SCHEMA.names, row, strict=True))
                                        for row in chunk], schema=ARROW_SCHEMA)
            for chunk in chunks(utc, ARROW_BATCH_ROWS)]


def run_sink(server: MariaDBServer, parts: list[Rows] | list[list[pa.RecordBatch]],
             bulk: str) -> None:
    """Rows (lists of tuples) go to ``write``, record batches to ``write_arrow``."""
    params = server.params
    sink = MySQLXASink(host=params.host, port=params.port, user=params.user,
                       password=params.password, database=params.database, table=TABLE,
                       tls=params.tls, bulk=bulk)  # type: ignore[arg-type]
    query_id = str(uuid.uuid4())
    handles = []
    for partition, part in enumerate(parts):
        txn_id = TxnId.open(namespace="bench", query_id=query_id, epoch=EPOCH, batch=0,
                            partition=partition, attempt=0)
        txn = sink.begin_transaction(TransactionContext(txn_id, COLUMNS))
        if part and isinstance(part[0], pa.RecordBatch):
            sink.write_arrow(txn, part)
        else:
            sink.write(txn, part)
        handles.append(sink.pre_commit(txn))
    with sink.committer() as committer:
        for handle in handles:
            committer.commit(handle)


def run_plain(server: MariaDBServer, parts: list[Rows], *, load: bool, chunk_size: int) -> None:
    for rows in parts:
        params = server.params
        conn = open_connection(Tls(params.tls), host=params.host,
                               port=params.port, user=params.user, password=params.password,
                               database=params.database, local_infile=load, autocommit=True)
        try:
            conn.begin()
            for chunk in chunks(rows, chunk_size):
                if load:
                    load_tsv(conn, TARGET, NAMES, [encode_tsv(chunk, NAMES)], rows=len(chunk),
                             what="bench load")
                else:
                    insert_rows(conn, TARGET, NAMES, chunk, upsert=False, what="bench insert")
            conn.commit()
        finally:
            conn.close()


@dataclass(frozen=True)
class Run:
    """One timed run: wall time, and the CPU it cost this process and the server."""

    wall_s: float
    client_cpu_s: float
    server_cpu_s: float


def server_cpu_s(server: MariaDBServer) -> float:
    fields = Path(f"/proc/{server.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def count_rows(server: MariaDBServer) -> tuple[int, int]:
    conn = server.connect()
    try:
        with conn.cursor() as cursor:
            cursor.execute(f"SELECT COUNT(*), COUNT(DISTINCT id) FROM {TABLE}")
            total, distinct = cursor.fetchone()
            return int(total), int(distinct)
    finally:
        conn.close()


def run_once(server: MariaDBServer, action: Callable[[], None], rows: int) -> Run:
    """One run into an empty table, checking that every row arrived exactly once."""
    server.connect().query(f"TRUNCATE TABLE {TABLE}")
    cpu, server_cpu, started = time.process_time(), server_cpu_s(server), time.perf_counter()
    action()
    run = Run(time.perf_counter() - started, time.process_time() - cpu,
              server_cpu_s(server) - server_cpu)
    if count_rows(server) != (rows, rows):
        raise AssertionError(f"expected {rows} distinct rows, found {count_rows(server)}")
    return run


def measure(server: MariaDBServer, variants: dict[str, Callable[[], None]], repeat: int,
            rows: int) -> dict[str, list[Run]]:
    """Every variant once per round, back to back, so load changes hit all of a round alike."""
    runs: dict[str, list[Run]] = {name: [] for name in variants}
    for _ in range(repeat):
        for name, action in variants.items():
            runs[name].append(run_once(server, action, rows))
    return runs


def paired_ratio(walls: Mapping[str, Sequence[float]], name: str, base: str) -> float:
    """Median over rounds of (rows/s of ``name``) / (rows/s of ``base``) in the same round,
    from each variant's wall times per round."""
    return statistics.median(b / n for n, b in zip(walls[name], walls[base], strict=True))


def report(runs: dict[str, list[Run]], rows: int, settings: str) -> None:
    width = max(map(len, runs))
    print(settings, "\n")
    print(f"{'method':<{width}}  {'median rows/s':>13}  {'best rows/s':>11}  "
          f"{'client CPU us/row':>17}  {'server CPU us/row':>17}")
    for name, results in runs.items():
        walls = [run.wall_s for run in results]
        client = statistics.median(run.client_cpu_s for run in results) * 1e6 / rows
        server = statistics.median(run.server_cpu_s for run in results) * 1e6 / rows
        print(f"{name:<{width}}  {rows / statistics.median(walls):>13,.0f}  "
              f"{rows / min(walls):>11,.0f}  {client:>17.2f}  {server:>17.2f}")
    print("\nratios: median over rounds of the paired rows/s ratio")
    walls_of = {name: [run.wall_s for run in results] for name, results in runs.items()}
    for name, base, goal in (("sink", "at-least-once", GOAL_VS_AT_LEAST_ONCE),
                             ("sink", "raw", GOAL_VS_RAW),
                             ("sink, bulk=insert", "at-least-once, INSERT", None),
                             ("sink", "sink, bulk=insert", None),
                             ("sink, Arrow", "sink", None),
                             ("sink, Arrow", "at-least-once", None),
                             ("sink, Arrow", "raw", None)):
        target = f"   goal >= {goal:.2f}" if goal is not None else ""
        print(f"  {name} / {base}: {paired_ratio(walls_of, name, base):.2f}{target}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS)
    parser.add_argument("--partitions", type=int, default=DEFAULT_PARTITIONS)
    parser.add_argument("--repeat", type=int, default=DEFAULT_REPEAT)
    args = parser.parse_args()
    rows = make_rows(args.rows)
    parts = split(rows, args.partitions)
    arrow_parts = [as_batches(part) for part in parts]
    chunk = DEFAULT_CHUNK_SIZE
    with private_server() as server:
        server.connect().query(TABLE_DDL)
        MySQLXASink(host=server.params.host, port=server.params.port, user=server.params.user,
                    password=server.params.password, database=server.params.database,
                    table=TABLE, tls=server.params.tls).check_schema(COLUMNS)
        variants: dict[str, Callable[[], None]] = {
            "sink": lambda: run_sink(server, parts, "auto"),
            "sink, Arrow": lambda: run_sink(server, arrow_parts, "auto"),
            "at-least-once": lambda: run_plain(server, parts, load=True, chunk_size=chunk),
            "raw": lambda: run_plain(server, [rows], load=True, chunk_size=len(rows)),
            "sink, bulk=insert": lambda: run_sink(server, parts, "insert"),
            "at-least-once, INSERT": lambda: run_plain(server, parts, load=False,
                                                       chunk_size=chunk),
        }
        runs = measure(server, variants, args.repeat, len(rows))
        version = server.connect().get_server_info()
    report(runs, len(rows), f"MariaDB {version}, {len(rows):,} rows x {len(COLUMNS)} columns, "
                  f"{args.partitions} partitions, chunk {chunk:,} rows, {args.repeat} rounds")


if __name__ == "__main__":
    main()
