"""PostgresSink (exactly once: prepared transactions, COPY from Arrow) against Spark's JDBC
writer (at least once) in ``foreachBatch``, into the same private PostgreSQL
(``setups.postgres`` over ``setups.servers.postgres``, here with ``fsync`` and
``full_page_writes`` on, as in production).

    nice .venv/bin/python -m bench.spark_peers postgres [--files 4] [--rows-per-file 100000]

The JDBC peer, as a user would set it up: the PostgreSQL JDBC driver from Maven Central
(``scripts/bench-jars``), URL ``jdbc:postgresql://host:port/db?reWriteBatchedInserts=true``
(the driver's own rewrite of a batch into multi-row INSERTs), ``batchsize`` 10,000 and
``isolationLevel`` READ_COMMITTED, ``mode("append")``. Each run writes a fresh orders table
of the setup (``target.options["table"]``; ``event_id`` the primary key, ``ts timestamptz``),
dropped once checked.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from psycopg import sql
from pyspark.sql import SparkSession

from bench.spark_peers import Contest, Peer, bench_jars, jdbc_writer
from setups import PostgresSetup

#: Durable, as a production server: the tests' server turns both off for speed.
DURABLE = {"fsync": "on", "full_page_writes": "on"}


def jars() -> list[str]:
    return bench_jars("postgresql-*.jar")


def start(_spark: SparkSession, workdir: Path, stack: contextlib.ExitStack) -> Contest:
    setup = stack.enter_context(PostgresSetup.started(workdir, settings=DURABLE))
    params = setup.server.params
    url = (f"jdbc:postgresql://{params.host}:{params.port}/{params.database}"
           "?reWriteBatchedInserts=true")
    return Contest(
        sink="PostgresSink", peer_name="Spark JDBC (pgjdbc)", setup=setup,
        peer=jdbc_writer(url, "org.postgresql.Driver", params.user, params.password),
        server_pid=setup.server.pid,
        discard=lambda target: setup.view.query(
            sql.SQL("DROP TABLE {}").format(sql.Identifier(target.options["table"]))))


PEER = Peer(jars=jars, start=start)
