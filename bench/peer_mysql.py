"""MySQLXASink (exactly once, Arrow path) against Spark's JDBC writer (at least once) in
``foreachBatch``, into the same private MariaDB (``setups.mysql`` over
``setups.servers.mariadb``: binary log on, ``innodb_flush_log_at_trx_commit=1``,
``sync_binlog=1``).

    nice .venv/bin/python -m bench.spark_peers mysql [--files 4] [--rows-per-file 100000]

The JDBC peer, as a user would set it up: MariaDB Connector/J from Maven Central
(``scripts/bench-jars``), URL ``jdbc:mysql://host:port/db?permitMysqlScheme&
rewriteBatchedStatements=true`` (a ``jdbc:mariadb:`` URL makes Spark pick its generic dialect,
which quotes identifiers with double quotes, and MariaDB rejects the INSERT), ``batchsize``
10,000 and ``isolationLevel`` READ_COMMITTED, ``mode("append")``. Each run writes a fresh
InnoDB orders table of the setup (``target.options["table"]``; ``event_id`` the primary key),
dropped once checked. The sink runs as a user would leave it: no fencing, the default marker
table. ``bench/peer_mysql_tls.py`` is the same contest over verified TLS.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from pyspark.sql import SparkSession

from bench.spark_peers import Contest, Peer, bench_jars, jdbc_writer
from setups import MySQLSetup
from sinks.mysql.markers import DEFAULT_MARKER_TABLE


def jars() -> list[str]:
    return bench_jars("mariadb-java-client-*.jar")


def start(_spark: SparkSession, workdir: Path, stack: contextlib.ExitStack) -> Contest:
    return contest_of(stack.enter_context(MySQLSetup.started(workdir)))


def contest_of(setup: MySQLSetup, url_options: str = "") -> Contest:
    """The sink against Connector/J into ``setup``'s server (``url_options`` appended to the
    JDBC URL's, as ``&sslMode=...``)."""
    params = setup.server.params
    url = (f"jdbc:mysql://{params.host}:{params.port}/{params.database}"
           f"?permitMysqlScheme&rewriteBatchedStatements=true{url_options}")
    return Contest(
        sink="MySQLXASink", peer_name="Spark JDBC (Connector/J)", setup=setup,
        peer=jdbc_writer(url, "org.mariadb.jdbc.Driver", params.user, params.password),
        server_pid=setup.server.pid,
        overrides={"fencing": False, "marker_table": DEFAULT_MARKER_TABLE},
        discard=lambda target: setup.db.query(f"DROP TABLE `{target.options['table']}`"))


PEER = Peer(jars=jars, start=start)
