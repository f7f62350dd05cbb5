"""``bench/peer_mysql.py`` over verified TLS: the same contest into a private MariaDB that takes
TLS only, its certificate issued by a CA made for the run; both writers verify it and the host
name.

    nice .venv/bin/python -m bench.spark_peers mysql_tls [--files 4] [--rows-per-file 100000]

The sink as ``setups.servers.mariadb`` hands it the server (``tls="verify"``, ``ca_bundle`` the
CA's PEM file); Connector/J with ``&sslMode=verify-full&serverSslCert=<that file>`` added to
the plain contest's URL.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from pyspark.sql import SparkSession

from bench.peer_mysql import contest_of, jars
from bench.spark_peers import Contest, Peer
from setups import MySQLSetup
from setups.servers.mariadb import private_server
from setups.servers.tls import CertificateAuthority


def start(_spark: SparkSession, workdir: Path, stack: contextlib.ExitStack) -> Contest:
    server = stack.enter_context(private_server(CertificateAuthority(workdir / "ca")))
    return contest_of(MySQLSetup(workdir, server),
                      f"&sslMode=verify-full&serverSslCert={server.params.ca_bundle}")


PEER = Peer(jars=jars, start=start)
