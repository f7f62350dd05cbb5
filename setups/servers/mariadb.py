"""A private MariaDB server for tests and benchmarks: own datadir, port, socket; never a service.

The test fixtures over it (the pytest plugin ``tests/fixtures/mariadb.py``):

* ``mariadb_server`` (session): a :class:`MariaDBServer` started once per test session in a
  temporary directory, with binary logging on (XA crash safety needs it), a database and a user
  with a password, so the code under test connects over TCP with real credentials. It is stopped
  and its directory deleted at the end.
* ``mariadb`` (function): the same server, restarted first if an earlier test killed it.
* ``secured_mariadb_server`` (session) and ``secured_mariadb`` (function): a second server
  with a certificate from the run's private CA (``tls_ca``, :mod:`setups.servers.tls`) and
  ``require_secure_transport=ON`` (plain TCP refused); its :attr:`MariaDBServer.params` carry
  the sink's ``tls="verify"`` and ``ca_bundle=``. :meth:`MariaDBServer.create_user` makes a
  user holding exactly the given grants (the least-privilege tests);
  :meth:`MariaDBServer.tls_turned_on` turns TLS on at the plain one for a block. The secured
  server trusts ``tls_ca`` for client certificates too (``--ssl-ca``):
  :meth:`MariaDBServer.require_client_certificate` makes a user log in only with one that
  names it (``REQUIRE SUBJECT``, mutual TLS).

Tests can :meth:`~MariaDBServer.kill` it (SIGKILL, like a power cut) and
:meth:`~MariaDBServer.start` it again on the same datadir and port. The benchmark
``bench/mysql_xa.py`` starts its server through :func:`private_server` too.

If Debian's MariaDB server binaries are missing, the fixture FAILS (it never skips): install
them with ``apt-get install mariadb-server``. The machine-wide server (port 3306) is neither
used nor touched: every program runs with ``--no-defaults`` and its own socket.
"""

from __future__ import annotations

import contextlib
import getpass
import itertools
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pymysql

from setups.servers.local import ServerMissingError, ServerProcess, free_port
from setups.servers.tls import CertificateAuthority, Issued
from twophase import Handle
from twophase.kit import TlsMode

SERVER_BINARY = "mariadbd"
INSTALL_BINARY = "mariadb-install-db"
ADMIN_BINARY = "mariadb-admin"
CLIENT_BINARY = "mariadb"
SEARCH_PATH = "/usr/sbin:/usr/bin:/usr/local/sbin:/usr/local/bin"
INSTALL_HINT = "install Debian's MariaDB server: apt-get install mariadb-server"

HOST = "127.0.0.1"
DATABASE = "twophase_test"
USER = "twophase"
READY_TIMEOUT_S = 30.0
INSTALL_TIMEOUT_S = 120.0

# Small and fast, but durable like production: every commit and prepare is fsynced to the redo
# log and the binary log, which is what makes prepared XA branches survive kill -9.
SERVER_OPTIONS = (
    "--log-bin=binlog",
    "--server-id=1",
    "--binlog-format=ROW",
    "--innodb-flush-log-at-trx-commit=1",
    "--sync-binlog=1",
    "--innodb-buffer-pool-size=128M",
    "--max-connections=200",
    "--skip-name-resolve",
    "--local-infile=1",
)


class MariaDBMissingError(ServerMissingError):
    """The MariaDB server binaries are not installed."""


def _binary(name: str) -> str:
    path = shutil.which(name, path=SEARCH_PATH)
    if path is None:
        raise MariaDBMissingError(f"{name} not found in {SEARCH_PATH}: {INSTALL_HINT}")
    return path


def _os_user() -> str:
    """The OS user, which the server lets in over its socket as an administrator."""
    return "root" if os.geteuid() == 0 else getpass.getuser()


@dataclass(frozen=True)
class ConnectionParams:
    """How a client reaches the private server over TCP with the test user: ``tls`` and
    ``ca_bundle`` as :class:`~sinks.mysql.MySQLXASink` takes them (``"off"`` for the plain
    server, ``"verify"`` with the run's CA for the secured one)."""

    host: str
    port: int
    user: str
    password: str
    database: str
    tls: TlsMode = "off"
    ca_bundle: str | None = None

    def kwargs(self) -> dict[str, Any]:
        """The sink's connection options (its ``tls=`` and ``ca_bundle=`` included)."""
        options = {"host": self.host, "port": self.port, "user": self.user,
                   "password": self.password, "database": self.database, "tls": self.tls}
        if self.ca_bundle is not None:
            options["ca_bundle"] = self.ca_bundle
        return options

    def client_kwargs(self) -> dict[str, Any]:
        """PyMySQL's ``connect`` options for the same: TLS verified, or disabled (never
        PyMySQL's default, which tries TLS and falls back to plain text)."""
        options = {"host": self.host, "port": self.port, "user": self.user,
                   "password": self.password, "database": self.database}
        if self.tls == "off":
            return {**options, "ssl_disabled": True}
        return {**options, "ssl_ca": self.ca_bundle, "ssl_verify_identity": True}

    def __repr__(self) -> str:
        return (f"ConnectionParams(host={self.host!r}, port={self.port}, user={self.user!r}, "
                f"password='***', database={self.database!r})")


class MariaDBServer(ServerProcess):
    """One private mariadbd process on its own datadir, port and socket."""

    program = SERVER_BINARY

    def __init__(self, base_dir: Path, ca: CertificateAuthority | None = None) -> None:
        super().__init__(base_dir / "error.log", free_port(HOST))
        self.base_dir = base_dir
        self.datadir = base_dir / "data"
        self.socket = base_dir / "mariadb.sock"
        self.params = ConnectionParams(HOST, self.port, USER, secrets.token_hex(12), DATABASE)
        #: The server's certificate and key (None: plain TCP only).
        self.certificate: Issued | None = None
        #: The CA whose client certificates the server verifies (None: it asks for none).
        self.client_ca: Path | None = None
        if ca is not None:
            self.certificate = ca.issue(f"mariadb-{self.port}")
            self.client_ca = ca.cafile
            self.params = replace(self.params, tls="verify", ca_bundle=str(ca.cafile))

    # -- lifecycle -------------------------------------------------------------------------

    def install(self) -> None:
        """Create the system tables in a fresh datadir (about 1 s)."""
        command = [
            _binary(INSTALL_BINARY), "--no-defaults", f"--datadir={self.datadir}",
            "--auth-root-authentication-method=socket", f"--auth-root-socket-user={_os_user()}",
            "--skip-test-db", *self._user_option(),
        ]
        done = subprocess.run(command, capture_output=True, timeout=INSTALL_TIMEOUT_S,
                              check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{INSTALL_BINARY} failed ({done.returncode}): "
                               f"{done.stderr.decode(errors='replace')[-2000:]}")

    def start(self) -> None:
        """Start mariadbd on the datadir and wait until it answers a ping."""
        if self.running:
            return
        command = [
            _binary(SERVER_BINARY), "--no-defaults", f"--datadir={self.datadir}",
            f"--socket={self.socket}", f"--port={self.port}", f"--bind-address={HOST}",
            f"--pid-file={self.base_dir / 'mariadbd.pid'}", f"--log-error={self.log}",
            f"--tmpdir={self.base_dir}", *SERVER_OPTIONS, *self._tls_options(),
            *self._user_option(),
        ]
        self._launch(command)

    def restart_after_kill(self) -> None:
        """kill -9 and start again on the same datadir and port (crash recovery runs)."""
        self.kill()
        self.start()

    # -- administration --------------------------------------------------------------------

    def bootstrap(self) -> None:
        """Create the test database and a password user reachable over TCP."""
        params = self.params
        self.root_sql(
            f"CREATE DATABASE IF NOT EXISTS `{params.database}`;"
            f"CREATE USER IF NOT EXISTS '{params.user}'@'%' IDENTIFIED BY '{params.password}';"
            f"GRANT ALL ON `{params.database}`.* TO '{params.user}'@'%';"
        )

    def present(self, issued: Issued) -> None:
        """Serve ``issued`` (certificate and key) to new connections from now on."""
        if self.certificate is None:
            raise ValueError("a plain server has no certificate to replace")
        shutil.copyfile(issued.certfile, self.certificate.certfile)  # keeps the 0600 files
        shutil.copyfile(issued.keyfile, self.certificate.keyfile)
        self.root_sql("FLUSH SSL")

    @contextlib.contextmanager
    def tls_turned_on(self, issued: Issued) -> Iterator[None]:
        """A plain server takes TLS only in the block, as an administrator turns it on
        (``ssl_cert``, ``ssl_key``, ``require_secure_transport=ON``: a restart); plain again
        after (another restart)."""
        if self.certificate is not None:
            raise ValueError("the server has TLS on already")
        self.certificate = issued
        self.stop()
        try:
            self.start()
            yield
        finally:
            self.certificate = None
            self.stop()
            self.start()

    def create_user(self, name: str, password: str, grants: list[str]) -> None:
        """A user over TCP holding exactly ``grants`` (``"SELECT ON db.t"``: what follows
        ``GRANT`` up to ``TO``), and nothing else."""
        statements = [f"DROP USER IF EXISTS '{name}'@'%'",
                      f"CREATE USER '{name}'@'%' IDENTIFIED BY '{password}'",
                      *(f"GRANT {grant} TO '{name}'@'%'" for grant in grants)]
        self.root_sql(";".join(statements))

    def require_client_certificate(self, name: str) -> None:
        """User ``name`` logs in only over TLS with a client certificate of the server's CA
        (``client_ca``) whose subject is ``/CN=<name>`` (besides its password)."""
        if self.client_ca is None:
            raise ValueError("the server verifies no client certificate (started without a CA)")
        self.root_sql(f"ALTER USER '{name}'@'%' REQUIRE SUBJECT '/CN={name}'")

    def root_sql(self, sql: str) -> str:
        """Run SQL as the server's administrator over its socket; returns tab-separated rows."""
        command = [_binary(CLIENT_BINARY), "--no-defaults", f"--socket={self.socket}",
                   f"--user={_os_user()}", "--batch", "--skip-column-names"]
        done = subprocess.run(command, input=sql.encode(), capture_output=True,  # not in argv
                              timeout=READY_TIMEOUT_S, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"SQL as root failed: {done.stderr.decode(errors='replace')}")
        return done.stdout.decode()

    @contextlib.contextmanager
    def global_variable(self, name: str, value: str) -> Iterator[None]:
        """``SET GLOBAL name = value`` (an SQL literal) for new sessions; the old value after."""
        if not name.replace("_", "").isalnum():
            raise ValueError(f"not a server variable name: {name!r}")
        old = self.root_sql(f"SELECT @@GLOBAL.{name}").strip()
        self.root_sql(f"SET GLOBAL {name} = {value}")
        try:
            yield
        finally:
            self.start()  # a test that killed the server may have failed before restarting it
            literal = old if old.lstrip("-").isdigit() else "'" + old.replace("'", "''") + "'"
            self.root_sql(f"SET GLOBAL {name} = {literal}")

    def connect(self, **options: Any) -> pymysql.connections.Connection:
        """A PyMySQL connection as the test user (autocommit unless told otherwise).

        Plain TCP to the plain server (PyMySQL's TLS-preferred default would spend ~30 ms
        building a TLS context for every connection before falling back); verified TLS to the
        secured one.
        """
        options.setdefault("autocommit", True)
        return pymysql.connect(**{**self.params.client_kwargs(), **options})

    # -- internals -------------------------------------------------------------------------

    def _tls_options(self) -> list[str]:
        if self.certificate is None:
            return []
        verify_clients = [] if self.client_ca is None else [f"--ssl-ca={self.client_ca}"]
        return [f"--ssl-cert={self.certificate.certfile}",
                f"--ssl-key={self.certificate.keyfile}", "--require-secure-transport=ON",
                *verify_clients]

    @staticmethod
    def _user_option() -> list[str]:
        return ["--user=root"] if os.geteuid() == 0 else []

    def _ready(self) -> bool:
        command = [_binary(ADMIN_BINARY), "--no-defaults", f"--socket={self.socket}",
                   f"--user={_os_user()}", "--connect-timeout=1", "ping"]
        return subprocess.run(command, capture_output=True, check=False).returncode == 0


@contextlib.contextmanager
def private_server(ca: CertificateAuthority | None = None) -> Iterator[MariaDBServer]:
    """Install, start and bootstrap a private server (secured by a certificate of ``ca`` if
    given); stop it and delete everything after."""
    base_dir = Path(tempfile.mkdtemp(prefix="twophase-mariadb-"))
    server = MariaDBServer(base_dir, ca)
    try:
        server.install()
        server.start()
        server.bootstrap()
        yield server
    finally:
        server.stop()
        shutil.rmtree(base_dir, ignore_errors=True)


def require_installed() -> None:
    """Raises :class:`MariaDBMissingError` if a program the server needs is missing."""
    for name in (SERVER_BINARY, INSTALL_BINARY, ADMIN_BINARY, CLIENT_BINARY):
        _binary(name)


_table_numbers = itertools.count()


@dataclass
class Db:
    """The test's own connection to the server: MariaDB's view of what the sink did."""

    server: MariaDBServer

    def new_table(self, ddl: str, prefix: str = "t") -> str:
        """Create a table of a name no test used before from ``ddl`` (``{table}`` in it)."""
        name = f"{prefix}{next(_table_numbers)}"
        self.query(ddl.format(table=name))
        return name

    def query(self, sql: str, args: Any = None, **options: Any) -> list[tuple[Any, ...]]:
        conn = self.server.connect(**options)
        try:
            with conn.cursor() as cursor:
                cursor.execute(sql, args)
                return list(cursor.fetchall())
        finally:
            conn.close()

    def ids(self, table: str) -> list[int]:
        return [row[0] for row in self.query(f"SELECT id FROM `{table}` ORDER BY id")]

    def xa_recover(self) -> list[tuple[str, str]]:
        return [(data[:glen].decode(), data[glen:].decode())
                for _fmt, glen, _blen, data in self.query("XA RECOVER")]

    def marker(self, handle: Handle) -> tuple[Any, ...] | None:
        rows = self.query("SELECT row_count, committed_at FROM _twophase_xa_markers "
                          "WHERE txn_id = %s", (str(handle.txn_id),))
        return rows[0] if rows else None

    def prepare_foreign(self, xid: str) -> None:
        """Leave a prepared branch that is not the sink's (another application's)."""
        self.query("CREATE TABLE IF NOT EXISTS foreign_rows (x INT) ENGINE=InnoDB")
        conn = self.server.connect()
        with conn.cursor() as cursor:
            for statement in ("XA START {}", "INSERT INTO foreign_rows VALUES (1)", "XA END {}",
                              "XA PREPARE {}"):
                cursor.execute(statement.format(xid))
        conn.close()

    def rollback_all_prepared(self) -> list[tuple[bytes, bytes, int]]:
        left = [(data[:glen], data[glen:], fmt)
                for fmt, glen, _blen, data in self.query("XA RECOVER")]
        for gtrid, bqual, fmt in left:
            self.query(f"XA ROLLBACK X'{gtrid.hex()}',X'{bqual.hex()}',{fmt}")
        return left
