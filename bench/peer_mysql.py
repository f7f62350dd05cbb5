"""MySQLXASink (exactly once, Arrow path) against Spark's JDBC writer (at least once) in
``foreachBatch``, into the same private MariaDB (``setups.servers.mariadb``: binary log on,
``innodb_flush_log_at_trx_commit=1``, ``sync_binlog=1``).

    nice .venv/bin/python -m bench.spark_peers mysql [--files 4] [--rows-per-file 100000]

The JDBC peer, as a user would set it up: MariaDB Connector/J from Maven Central
(``scripts/bench-jars``), URL ``jdbc:mysql://host:port/db?permitMysqlScheme&
rewriteBatchedStatements=true`` (a ``jdbc:mariadb:`` URL makes Spark pick its generic dialect,
which quotes identifiers with double quotes, and MariaDB rejects the INSERT), ``batchsize``
10,000 and ``isolationLevel`` READ_COMMITTED, ``mode("append")``. Each run writes a fresh
InnoDB table with the feed's columns (``event_id`` the primary key), dropped after counting.
"""

from __future__ import annotations

import contextlib
import itertools
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from bench.spark_peers import Contest, Peer, bench_jars, jdbc_writer, twophase_writer
from setups.servers.mariadb import MariaDBServer, private_server
from sinks.mysql import MySQLXASink

TABLE_DDL = ("CREATE TABLE `{}` (event_id BIGINT PRIMARY KEY, order_id BIGINT, "
             "status VARCHAR(32), ts DATETIME(6)) ENGINE=InnoDB")


def jars() -> list[str]:
    return bench_jars("mariadb-java-client-*.jar")


def start(_spark: SparkSession, _workdir: Path, stack: contextlib.ExitStack) -> Contest:
    server = stack.enter_context(private_server())
    params = server.params
    url = (f"jdbc:mysql://{params.host}:{params.port}/{params.database}"
           "?permitMysqlScheme&rewriteBatchedStatements=true")
    numbers = itertools.count()

    def new_table() -> str:
        table = f"peer_{next(numbers)}"
        _query(server, TABLE_DDL.format(table))
        return table

    def rows_at(table: str) -> int:
        ((count,),) = _query(server, f"SELECT COUNT(DISTINCT event_id) FROM `{table}`")
        _query(server, f"DROP TABLE `{table}`")
        return int(count)

    return Contest(
        sink="MySQLXASink", peer_name="Spark JDBC (Connector/J)",
        twophase=twophase_writer(lambda table: MySQLXASink(**params.kwargs(), table=table)),
        peer=jdbc_writer(url, "org.mariadb.jdbc.Driver", params.user, params.password),
        new_destination=new_table, rows_at=rows_at, server_pid=server.pid)


def _query(server: MariaDBServer, sql: str) -> list[tuple[Any, ...]]:
    conn = server.connect()
    try:
        with conn.cursor() as cursor:
            cursor.execute(sql)
            return list(cursor.fetchall())
    finally:
        conn.close()


PEER = Peer(jars=jars, start=start)
