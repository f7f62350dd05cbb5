"""What MariaDB spends per row under each way of bulk-loading it, with one and two loaders.

Run from the repository root (never in CI)::

    .venv/bin/python -m bench.mysql_server_cost [--rows 200000] [--rounds 3]

The binary bulk variant needs MariaDB Connector/Python (``mariadb``, built against Debian's
``libmariadb-dev``: ``apt-get install libmariadb-dev && .venv/bin/pip install mariadb``); the
command fails naming that if it is missing, unless ``--without-binary-bulk``.

Why: against Spark's JDBC writer into MariaDB (``bench.spark_peers mysql``) the sink ties, and
the server is the largest share of both writers' CPU (docs/PERFORMANCE.md, "MySQL: where a
row's time goes"). This isolates that share, without Spark: ``--rows`` rows of the peers
contest's orders table (``setups.mysql``'s DDL: ``event_id`` the primary key, ``order_id``,
``status``, ``ts DATETIME(6)``), split round-robin among the loaders as Spark's
``repartition`` hands them over, each loader a process of its own (as each Spark task's Python
worker is) writing its share in one XA transaction, 10,000 rows per statement, into a fresh
table of one private server (``setups.servers.mariadb``: binary log on,
``innodb_flush_log_at_trx_commit=1``, ``sync_binlog=1``). Per variant and loader count, the
median over ``--rounds`` rounds (the order turning every round) of rows/s, the server's CPU per
row (``/proc``) and the loaders' own CPU per row:

* ``LOAD DATA`` (the sink's path): ``MySQLXASink.write_arrow``, its Arrow record batches
  encoded as ``LOAD DATA LOCAL`` text by ``sinks.mysql.arrow``; begin, write, pre-commit and
  commit as a task and the driver do.
* ``multi-row INSERT``: the same sink with ``bulk="insert"`` (PyMySQL's ``executemany``).
* ``binary bulk``: ``COM_STMT_BULK_EXECUTE`` of a prepared ``INSERT``, what MariaDB
  Connector/J sends for Spark's JDBC writer, through MariaDB Connector/Python's
  ``executemany`` in an XA transaction; its loaders get Python tuples, the only input that
  connector takes: turning the record batches into them is reported on its own line
  (``to_pylist``), as a cost this path would add to the sink's Python workers.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import multiprocessing
import os
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection as Pipe
from typing import Any

import pyarrow as pa

import sinks.mysql.arrow  # noqa: F401 - imported before the loaders fork, not by each
from bench.mysql_xa import Run, server_cpu_s
from bench.session import describe, machine
from setups.servers.mariadb import MariaDBServer, private_server
from sinks.mysql import MySQLXASink
from twophase import Column, TransactionContext, TxnId
from twophase.kit import DEFAULT_CHUNK_SIZE

DEFAULT_ROWS = 200_000
DEFAULT_ROUNDS = 3
LOADERS = (1, 2)
TABLE_DDL = ("CREATE TABLE `{table}` (event_id BIGINT NOT NULL PRIMARY KEY, "
             "order_id BIGINT NOT NULL, status VARCHAR(16) NOT NULL CHECK (status <> 'bogus'), "
             "ts DATETIME(6)) ENGINE=InnoDB")
COLUMNS = (Column("event_id", "bigint", False), Column("order_id", "bigint", False),
           Column("status", "string", False), Column("ts", "timestamp"))
SCHEMA = pa.schema([("event_id", pa.int64()), ("order_id", pa.int64()),
                    ("status", pa.string()), ("ts", pa.timestamp("us", tz="UTC"))])
STATUSES = ("NEW", "PAID", "SHIPPED", "DELIVERED")
FIRST_TS = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
BINARY_BULK_MODULE = "mariadb"
BINARY_BULK_HINT = ("apt-get install libmariadb-dev && .venv/bin/pip install mariadb, or pass "
                    "--without-binary-bulk")
LOAD_DATA, INSERT, BINARY_BULK = "LOAD DATA", "multi-row INSERT", "binary bulk"

#: A loader: the server, the table, its share of the rows; returns its own CPU seconds.
Loader = Callable[[MariaDBServer, str, list[pa.RecordBatch]], float]


def shares(rows: int, loaders: int) -> list[list[pa.RecordBatch]]:
    """The rows dealt round-robin to ``loaders``, each share in record batches of a chunk."""
    event_ids = pa.array(range(rows), pa.int64())
    table = pa.table({
        "event_id": event_ids,
        "order_id": pa.array([i // 4 for i in range(rows)], pa.int64()),
        "status": pa.array([STATUSES[i % len(STATUSES)] for i in range(rows)]),
        "ts": pa.array([FIRST_TS + dt.timedelta(milliseconds=i) for i in range(rows)],
                       SCHEMA.field("ts").type),
    }, schema=SCHEMA)
    return [table.take(pa.array(range(loader, rows, loaders))).to_batches(DEFAULT_CHUNK_SIZE)
            for loader in range(loaders)]


def sink_of(server: MariaDBServer, table: str, bulk: str) -> MySQLXASink:
    params = server.params
    return MySQLXASink(host=params.host, port=params.port, user=params.user,
                       password=params.password, database=params.database, table=table,
                       tls=params.tls, bulk=bulk, fencing=False)  # type: ignore[arg-type]


def through_sink(bulk: str) -> Loader:
    """A loader writing its share as one of the sink's tasks, then committing it."""
    def load(server: MariaDBServer, table: str, batches: list[pa.RecordBatch]) -> float:
        sink = sink_of(server, table, bulk)
        started = time.process_time()
        txn_id = TxnId.open(namespace="bench", query_id=str(uuid.uuid4()), epoch=1, batch=0,
                            partition=os.getpid(), attempt=0)
        txn = sink.begin_transaction(TransactionContext(txn_id, COLUMNS))
        sink.write_arrow(txn, batches)
        handle = sink.pre_commit(txn)
        with sink.committer() as committer:
            committer.commit(handle)
        return time.process_time() - started
    return load


def binary_bulk(server: MariaDBServer, table: str, batches: list[pa.RecordBatch]) -> float:
    """A loader sending its share by ``COM_STMT_BULK_EXECUTE`` in one XA transaction."""
    connector: Any = importlib.import_module(BINARY_BULK_MODULE)
    params = server.params
    chunks = [python_rows(batch) for batch in batches]
    started = time.process_time()
    conn = connector.connect(host=params.host, port=params.port, user=params.user,
                             password=params.password, database=params.database,
                             autocommit=True)
    xid = f"'bench-{uuid.uuid4().hex}'"
    cursor = conn.cursor()
    cursor.execute(f"XA START {xid}")
    for rows in chunks:
        cursor.executemany(f"INSERT INTO `{table}` (event_id, order_id, status, ts) "
                           "VALUES (?, ?, ?, ?)", rows)
    for verb in ("END", "PREPARE", "COMMIT"):
        cursor.execute(f"XA {verb} {xid}")
    conn.close()
    return time.process_time() - started


def python_rows(batch: pa.RecordBatch) -> list[tuple[Any, ...]]:
    """A record batch as the tuples a DB-API ``executemany`` takes."""
    return [tuple(row.values()) for row in batch.to_pylist()]


def _loader_process(loader: Loader, server: MariaDBServer, table: str,
                    batches: list[pa.RecordBatch], ready: Any, out: Pipe) -> None:
    ready.wait()
    out.send(loader(server, table, batches))


def run_once(server: MariaDBServer, loader: Loader, share_of: Sequence[list[pa.RecordBatch]],
             rows: int) -> Run:
    """The loaders at once into a fresh table, checked to hold every row once, then dropped."""
    table = f"cost_{uuid.uuid4().hex[:12]}"
    query(server, TABLE_DDL.format(table=table))
    context = multiprocessing.get_context("fork")
    ready = context.Barrier(len(share_of) + 1)  # the loaders and this process
    pipes = [context.Pipe(duplex=False) for _ in share_of]
    processes = [context.Process(target=_loader_process,
                                 args=(loader, server, table, batches, ready, sender))
                 for batches, (_receiver, sender) in zip(share_of, pipes, strict=True)]
    for process in processes:
        process.start()
    ready.wait()
    server_cpu, started = server_cpu_s(server), time.perf_counter()
    loaders_cpu = sum(receiver.recv() for receiver, _sender in pipes)
    run = Run(time.perf_counter() - started, client_cpu_s=loaders_cpu,
              server_cpu_s=server_cpu_s(server) - server_cpu)
    for process in processes:
        process.join()
    found = query(server, f"SELECT COUNT(*), COUNT(DISTINCT event_id) FROM `{table}`")
    query(server, f"DROP TABLE `{table}`")
    if found != (rows, rows):
        raise AssertionError(f"expected {rows} distinct rows, found {found}")
    return run


def query(server: MariaDBServer, sql: str) -> Any:
    """One statement on a connection of its own, closed after; its first row, if any."""
    conn = server.connect()
    try:
        with conn.cursor() as cursor:
            cursor.execute(sql)
            return cursor.fetchone()
    finally:
        conn.close()


def to_pylist_us_per_row(batches: list[pa.RecordBatch], rows: int) -> float:
    """What turning record batches into :func:`python_rows` costs."""
    started = time.process_time()
    for batch in batches:
        python_rows(batch)
    return (time.process_time() - started) * 1e6 / rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS)
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    parser.add_argument("--without-binary-bulk", action="store_true")
    args = parser.parse_args()
    variants: dict[str, Loader] = {LOAD_DATA: through_sink("load_data"),
                                   INSERT: through_sink("insert")}
    if not args.without_binary_bulk:
        try:
            importlib.import_module(BINARY_BULK_MODULE)
        except ImportError as exc:
            raise SystemExit(f"the binary bulk variant needs MariaDB Connector/Python "
                             f"({exc}): {BINARY_BULK_HINT}") from exc
        variants[BINARY_BULK] = binary_bulk
    share_of = {loaders: shares(args.rows, loaders) for loaders in LOADERS}
    print(describe(machine()), "\n", flush=True)
    runs: dict[tuple[str, int], list[Run]] = {}
    names = list(variants)
    with private_server() as server:
        sink_of(server, "cost_schema", "auto").create_tables()
        version = query(server, "SELECT VERSION()")[0]
        for number in range(args.rounds):
            for name in names[number % len(names):] + names[:number % len(names)]:
                for loaders in LOADERS:
                    runs.setdefault((name, loaders), []).append(
                        run_once(server, variants[name], share_of[loaders], args.rows))
    report(runs, args.rows, version, to_pylist_us_per_row(share_of[1][0], args.rows))


def report(runs: dict[tuple[str, int], list[Run]], rows: int, version: str,
           to_pylist_us: float) -> None:
    print(f"MariaDB {version}: {rows:,} rows per run, {len(next(iter(runs.values())))} rounds "
          f"(median)\n")
    print("| variant | loaders | rows/s | server CPU us/row | loaders' CPU us/row |")
    print("|---|---|---|---|---|")
    for (name, loaders), results in runs.items():
        wall = statistics.median(run.wall_s for run in results)
        server = statistics.median(run.server_cpu_s for run in results) * 1e6 / rows
        client = statistics.median(run.client_cpu_s for run in results) * 1e6 / rows
        print(f"| {name} | {loaders} | {rows / wall:,.0f} | {server:.2f} | {client:.2f} |")
    print(f"\nrecord batches to Python tuples (to_pylist), one process: {to_pylist_us:.2f} us "
          "per row")


if __name__ == "__main__":
    main()
