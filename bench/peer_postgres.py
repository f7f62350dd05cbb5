"""PostgresSink (exactly once: prepared transactions, COPY from Arrow) against Spark's JDBC
writer (at least once) in ``foreachBatch``, into the same private PostgreSQL
(``setups.servers.postgres``, here with ``fsync`` and ``full_page_writes`` on, as in production).

    nice .venv/bin/python -m bench.spark_peers postgres [--files 4] [--rows-per-file 100000]

The JDBC peer, as a user would set it up: the PostgreSQL JDBC driver from Maven Central
(``scripts/bench-jars``), URL ``jdbc:postgresql://host:port/db?reWriteBatchedInserts=true``
(the driver's own rewrite of a batch into multi-row INSERTs), ``batchsize`` 10,000 and
``isolationLevel`` READ_COMMITTED, ``mode("append")``. Each run writes a fresh table with the
feed's columns (``event_id`` the primary key, ``ts timestamptz``), dropped after counting.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from psycopg import sql
from pyspark.sql import SparkSession

from bench.spark_peers import Contest, Peer, bench_jars, jdbc_writer, twophase_writer
from setups.servers.postgres import PgView, private_server
from sinks.postgres import PostgresSink

#: Durable, as a production server: the tests' server turns both off for speed.
DURABLE = {"fsync": "on", "full_page_writes": "on"}


def jars() -> list[str]:
    return bench_jars("postgresql-*.jar")


def start(_spark: SparkSession, _workdir: Path, stack: contextlib.ExitStack) -> Contest:
    server = stack.enter_context(private_server(DURABLE))
    view = PgView(server)
    params = server.params
    url = (f"jdbc:postgresql://{params.host}:{params.port}/{params.database}"
           "?reWriteBatchedInserts=true")

    def rows_at(table: str) -> int:
        name = sql.Identifier(table)
        ((count,),) = view.query(sql.SQL("SELECT COUNT(DISTINCT event_id) FROM {}").format(name))
        view.query(sql.SQL("DROP TABLE {}").format(name))
        return int(count)

    return Contest(
        sink="PostgresSink", peer_name="Spark JDBC (pgjdbc)",
        twophase=twophase_writer(lambda table: PostgresSink(**params.sink_options(), table=table)),
        peer=jdbc_writer(url, "org.postgresql.Driver", params.user, params.password),
        new_destination=view.new_orders_table, rows_at=rows_at, server_pid=server.pid)


PEER = Peer(jars=jars, start=start)
