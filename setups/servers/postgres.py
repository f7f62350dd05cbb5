"""A private PostgreSQL for tests and benchmarks, and everything a PostgreSQL test needs of it.

One module for every PostgreSQL test (contract, crash, model, chaos, benchmark):

* :class:`PostgresServer`: a private cluster (``initdb`` into a temporary directory, its own
  port on 127.0.0.1 and its own socket directory, ``max_prepared_transactions`` > 0), a
  database and a password user reached over TCP. Debian's binaries refuse to run as root, so
  when the tests run as root the server runs as ``nobody`` (its directory owned by it).
  :meth:`~PostgresServer.kill` SIGKILLs the postmaster and every backend (a crash),
  :meth:`~PostgresServer.start` starts it again on the same directory and port (crash recovery
  runs; prepared transactions survive).
* :class:`PgView`: the test's own view of the server: a fresh table of the order feed's
  columns (:meth:`~PgView.new_orders_table`), what a reader sees (:meth:`~PgView.event_ids`),
  what is in doubt (:meth:`~PgView.prepared`).
* :class:`PgTarget`: one fresh target for the shared suites: the sink's options (through a
  fault proxy's port if given), a reader, the in-doubt view.
* fixtures (``tests/fixtures/postgres.py``) ``postgres_server`` (session), ``postgres``
  (restarted if a test killed it) and ``pg`` (the view; fails the test if it leaves a
  prepared transaction behind).
* ``secured_postgres_server`` (session) and ``secured_postgres``: a second cluster with a
  certificate from the run's private CA (``tls_ca``, :mod:`setups.servers.tls`) whose
  ``pg_hba.conf`` takes ``hostssl`` lines only (plain TCP refused); its params carry the sink's
  ``sslmode="verify-full"`` and ``ca_bundle=``. The key is copied into the cluster's
  directory, owned by the server's user and readable by it only (PostgreSQL refuses a key
  others can read). :meth:`PostgresServer.create_user` makes a user holding exactly the given
  grants (the least-privilege tests). :meth:`PostgresServer.hba` and
  :meth:`PostgresServer.tls_turned_on` change a running server as its administrator would, for
  a block (the tests that follow an error's fix). The secured cluster trusts ``tls_ca`` for
  client certificates too (``ssl_ca_file``): a member of :data:`CLIENT_CERTIFICATE_ROLE`
  (:meth:`PostgresServer.require_client_certificate`) logs in only with one whose common name
  is its user name (``clientcert=verify-full``, mutual TLS) besides its password.

* :func:`logical_server`: a private cluster that also serves logical decoding
  (:data:`LOGICAL_DECODING_SETTINGS`: ``wal_level=logical``, replication slots and WAL
  senders), the source of a change data capture connector (Debezium's, ``pgoutput``);
  :meth:`PostgresServer.create_replication_user` makes that connector's least-privileged role,
  :meth:`PgView.replication_slots` shows its slots. Not the default server's settings:
  measured on the 2-core machine (3000 upserts + 100 prepared transactions of 50 rows, three
  rounds each), ``wal_level=logical`` wrote 3.4 % more WAL and took the same time within the
  noise (2.4-3.0 s against 2.4-2.6 s), start-up alike (1.3-2.4 s); but a replication slot is
  state of the whole cluster that retains WAL until its consumer confirms it: a connector
  killed mid-test would pin the WAL of every other test's server, so the source of CDC is a
  cluster of its own.

Missing binaries FAIL the fixture (never skip): ``apt-get install postgresql``. Durability as
in production against a process crash (``synchronous_commit=on``); ``fsync=off`` because only
the process is ever killed here, never the machine.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from setups.servers.local import HOST, OWNER_ONLY, ServerMissingError, ServerProcess, free_port
from setups.servers.tls import CertificateAuthority, Issued
from sinks.postgres.connection import TLS_OF_SSLMODE, SslMode

BIN_DIRS = tuple(sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True))
INSTALL_HINT = "install Debian's PostgreSQL server: apt-get install postgresql"
UNPRIVILEGED_USER = "nobody"
SUPERUSER = "postgres"
DATABASE = "twophase_test"
USER = "twophase"
READY_TIMEOUT_S = 60.0
RELOAD_WAIT_S = 0.5
INITDB_TIMEOUT_S = 120.0
SERVER_SETTINGS = {
    "max_prepared_transactions": "64",
    "max_connections": "200",
    "fsync": "off",
    "full_page_writes": "off",
    "shared_buffers": "64MB",
    "listen_addresses": HOST,
}
#: What logical decoding (a CDC connector reading ``pgoutput`` from a replication slot) needs
#: of a server beyond :data:`SERVER_SETTINGS` (:func:`logical_server`).
LOGICAL_DECODING_SETTINGS = {
    "wal_level": "logical",
    "max_replication_slots": "8",
    "max_wal_senders": "8",
}
#: The order feed's columns (twophase.testing.contract.ORDER_COLUMNS) as a PostgreSQL table.
ORDERS_DDL = (
    "CREATE TABLE {table} (event_id bigint PRIMARY KEY, order_id bigint NOT NULL, "
    "status varchar(16) NOT NULL CHECK (status <> 'bogus'), ts timestamptz)"
)
#: The secured cluster's pg_hba.conf: the superuser over the socket, everyone else over TLS.
HOSTSSL_ONLY_HBA = (
    "local all all trust\n"
    "hostssl all all 127.0.0.1/32 scram-sha-256\n"
    "hostssl all all ::1/128 scram-sha-256\n"
)
#: Members of this role log in to the secured cluster with a client certificate only.
CLIENT_CERTIFICATE_ROLE = "client_certificate"
#: The secured cluster's pg_hba.conf lines before :data:`HOSTSSL_ONLY_HBA`: members of
#: :data:`CLIENT_CERTIFICATE_ROLE` need a password and a client certificate naming them.
CLIENT_CERTIFICATE_HBA = (
    f"hostssl all +{CLIENT_CERTIFICATE_ROLE} 127.0.0.1/32 scram-sha-256 clientcert=verify-full\n"
    f"hostssl all +{CLIENT_CERTIFICATE_ROLE} ::1/128 scram-sha-256 clientcert=verify-full\n"
)
CERT_FILE, KEY_FILE, CLIENT_CA_FILE = "server.crt", "server.key", "client-ca.crt"


class PostgresMissingError(ServerMissingError):
    """The PostgreSQL server binaries are not installed."""


def _binary(name: str) -> str:
    for directory in BIN_DIRS:
        if (directory / name).exists():
            return str(directory / name)
    raise PostgresMissingError(f"{name} not found under /usr/lib/postgresql/*/bin: "
                               f"{INSTALL_HINT}")


def _run_as() -> dict[str, Any]:
    """Popen's ``user``/``group`` for the server: an unprivileged user when we are root."""
    if os.geteuid() != 0:
        return {}
    entry = pwd.getpwnam(UNPRIVILEGED_USER)
    return {"user": entry.pw_uid, "group": entry.pw_gid}


@dataclass(frozen=True)
class PgParams:
    """How a client reaches the private server over TCP with the test user."""

    host: str
    port: int
    user: str
    password: str
    database: str
    sslmode: SslMode = "disable"
    ca_bundle: str | None = None

    def sink_options(self) -> dict[str, Any]:
        """The connection options of :class:`~sinks.postgres.PostgresSink` (its ``tls`` and
        ``ca_bundle`` included)."""
        options = {"host": self.host, "port": self.port, "user": self.user,
                   "password": self.password, "database": self.database,
                   "tls": TLS_OF_SSLMODE[self.sslmode]}
        if self.ca_bundle is not None:
            options["ca_bundle"] = self.ca_bundle
        return options

    def client_options(self) -> dict[str, Any]:
        """psycopg's ``connect`` options for the same."""
        options = {"host": self.host, "port": self.port, "user": self.user,
                   "password": self.password, "dbname": self.database,
                   "sslmode": self.sslmode}
        if self.ca_bundle is not None:
            options["sslrootcert"] = self.ca_bundle
        return options

    def __repr__(self) -> str:
        return (f"PgParams(host={self.host!r}, port={self.port}, user={self.user!r}, "
                f"password='***', database={self.database!r})")


class PostgresServer(ServerProcess):
    """One private postgres process tree on its own data directory, port and socket."""

    program = "postgres"
    stop_signal = signal.SIGINT  # "fast" shutdown
    ready_timeout_s = READY_TIMEOUT_S

    def __init__(self, base_dir: Path, settings: Mapping[str, str] | None = None,
                 ca: CertificateAuthority | None = None) -> None:
        super().__init__(base_dir / "server.log", free_port(HOST))
        self.base_dir = base_dir
        self.settings = {**SERVER_SETTINGS, **(settings or {})}
        self.datadir = base_dir / "data"
        self.params = PgParams(HOST, self.port, USER, secrets.token_hex(12), DATABASE)
        #: The CA whose certificate the server presents (None: plain TCP only).
        self.ca = ca
        if ca is not None:
            self.params = replace(self.params, sslmode="verify-full", ca_bundle=str(ca.cafile))
            self.settings.update(ssl="on", ssl_cert_file=str(base_dir / CERT_FILE),
                                 ssl_key_file=str(base_dir / KEY_FILE),
                                 ssl_ca_file=str(base_dir / CLIENT_CA_FILE))

    # -- lifecycle -------------------------------------------------------------------------

    def install(self) -> None:
        """``initdb`` a fresh cluster owned by the server's user."""
        owner = _run_as()
        if owner:
            os.chown(self.base_dir, owner["user"], owner["group"])
        done = subprocess.run(
            [_binary("initdb"), "-D", str(self.datadir), "-U", SUPERUSER, "--auth-local=trust",
             "--auth-host=scram-sha-256", "--no-sync", "-E", "UTF8", "--locale=C"],
            capture_output=True, timeout=INITDB_TIMEOUT_S, check=False, **owner)
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}): "
                               f"{done.stderr.decode(errors='replace')[-2000:]}")
        if self.ca is not None:
            self._own_file(self.datadir / "pg_hba.conf",
                           (CLIENT_CERTIFICATE_HBA + HOSTSSL_ONLY_HBA).encode())
            self._own_file(self.base_dir / CLIENT_CA_FILE, self.ca.cafile.read_bytes())
            self.present(self.ca.issue(f"postgres-{self.port}"), reload=False)

    def present(self, issued: Issued, *, reload: bool = True) -> None:
        """Serve ``issued`` (certificate and key) from now on: copied into the cluster's
        directory for the server's user, read again on a configuration reload."""
        self._own_file(self.base_dir / CERT_FILE, issued.certfile.read_bytes())
        self._own_file(self.base_dir / KEY_FILE, issued.keyfile.read_bytes())
        if reload:
            self.reload()

    def reload(self) -> None:
        """Make the server read its configuration files again (and wait for it)."""
        with self.superuser() as conn:
            conn.execute("SELECT pg_reload_conf()")
        time.sleep(RELOAD_WAIT_S)  # the postmaster reloads on SIGHUP, asynchronously

    @contextlib.contextmanager
    def hba(self, lines: str) -> Iterator[None]:
        """``pg_hba.conf`` is ``lines`` in the block (reloaded); the old file after."""
        path = self.datadir / "pg_hba.conf"
        old = path.read_bytes()
        self._own_file(path, lines.encode())
        self.reload()
        try:
            yield
        finally:
            self._own_file(path, old)
            self.reload()

    @contextlib.contextmanager
    def tls_turned_on(self, issued: Issued) -> Iterator[None]:
        """A plain server takes TLS only in the block, as an administrator turns it on:
        ``ssl=on`` presenting ``issued``, ``hostssl`` lines in place of ``host`` ones (plain
        text refused). Plain again after."""
        self.present(issued, reload=False)
        with self.superuser() as conn:
            conn.execute(sql.SQL("ALTER SYSTEM SET ssl_cert_file = {}").format(
                sql.Literal(str(self.base_dir / CERT_FILE))))
            conn.execute(sql.SQL("ALTER SYSTEM SET ssl_key_file = {}").format(
                sql.Literal(str(self.base_dir / KEY_FILE))))
            conn.execute("ALTER SYSTEM SET ssl = on")
        try:
            with self.hba(HOSTSSL_ONLY_HBA):
                yield
        finally:
            with self.superuser() as conn:
                for name in ("ssl", "ssl_cert_file", "ssl_key_file"):
                    conn.execute(sql.SQL("ALTER SYSTEM RESET {}").format(sql.Identifier(name)))
            self.reload()

    @staticmethod
    def _own_file(path: Path, data: bytes) -> None:
        """``data`` in a file owned by the server's user, readable by it only."""
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, OWNER_ONLY)
        with os.fdopen(descriptor, "wb") as out:
            out.write(data)
        os.chmod(path, OWNER_ONLY)
        if owner := _run_as():
            os.chown(path, owner["user"], owner["group"])

    def start(self) -> None:
        """Start postgres on the data directory and wait until it takes connections."""
        if self.running:
            return
        settings = {**self.settings, "port": str(self.port),
                    "unix_socket_directories": str(self.base_dir)}
        command = [_binary("postgres"), "-D", str(self.datadir)]
        for name, value in settings.items():
            command += ["-c", f"{name}={value}"]
        with self.log.open("ab") as log:
            self._launch(command, stdout=log, stderr=subprocess.STDOUT, **_run_as())

    # -- administration --------------------------------------------------------------------

    def bootstrap(self) -> None:
        """Create the test user (password, over TCP) and its database."""
        with self.superuser() as conn:
            conn.execute(sql.SQL("CREATE USER {} PASSWORD {}").format(
                sql.Identifier(USER), sql.Literal(self.params.password)))
            conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(DATABASE), sql.Identifier(USER)))
            if self.ca is not None:
                conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(
                    sql.Identifier(CLIENT_CERTIFICATE_ROLE)))

    def create_user(self, name: str, password: str, grants: list[str]) -> None:
        """A user over TCP holding exactly ``grants`` (``"SELECT ON t"``: what follows
        ``GRANT`` up to ``TO``, in the test database) and nothing else."""
        with self.superuser(DATABASE) as conn:
            user = sql.Identifier(name)
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone():
                conn.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(user))
                conn.execute(sql.SQL("DROP ROLE {}").format(user))
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                user, sql.Literal(password)))
            for grant in grants:
                conn.execute(sql.SQL(f"GRANT {grant} TO {{}}").format(user))

    def create_replication_user(self, name: str, password: str, tables: list[str],
                                owners: str | None = None) -> None:
        """A role over TCP that a CDC connector (Debezium's, ``pgoutput``) needs and no more:
        LOGIN and REPLICATION (a replication slot, logical decoding), CONNECT and CREATE on the
        test database (its publication), and ``tables`` (``schema.table`` or ``table`` of the
        test user's) owned by the NOLOGIN group ``owners`` (default ``<name>_owners``) that
        it and the test user belong to: a publication of a table may be made only by the
        table's owner (Debezium's documented set-up for ``publication.autocreate.mode``). No
        superuser. Made anew if it exists."""
        group = owners or f"{name}_owners"
        with self.superuser(DATABASE) as conn:
            for role in (name, group):
                if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
                    conn.execute(sql.SQL("REASSIGN OWNED BY {} TO {}").format(
                        sql.Identifier(role), sql.Identifier(USER)))
                    conn.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(sql.Identifier(role)))
                    conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(group)))
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN REPLICATION PASSWORD {}").format(
                sql.Identifier(name), sql.Literal(password)))
            conn.execute(sql.SQL("GRANT {} TO {}, {}").format(
                sql.Identifier(group), sql.Identifier(name), sql.Identifier(USER)))
            conn.execute(sql.SQL("GRANT CONNECT, CREATE ON DATABASE {} TO {}").format(
                sql.Identifier(DATABASE), sql.Identifier(name)))
            for table in tables:
                conn.execute(sql.SQL("ALTER TABLE {} OWNER TO {}").format(
                    sql.Identifier(*table.split(".")), sql.Identifier(group)))

    def require_client_certificate(self, name: str) -> None:
        """User ``name`` logs in only with a client certificate of the server's CA whose
        common name is ``name`` (a member of :data:`CLIENT_CERTIFICATE_ROLE`)."""
        if self.ca is None:
            raise ValueError("the server verifies no client certificate (started without a CA)")
        with self.superuser() as conn:
            conn.execute(sql.SQL("GRANT {} TO {}").format(
                sql.Identifier(CLIENT_CERTIFICATE_ROLE), sql.Identifier(name)))

    def superuser(self, database: str = "postgres") -> psycopg.Connection[Any]:
        """An autocommit superuser session over the server's socket."""
        return psycopg.connect(host=str(self.base_dir), port=self.port, user=SUPERUSER,
                               dbname=database, autocommit=True)

    def connect(self, **options: Any) -> psycopg.Connection[Any]:
        """An autocommit session as the test user over TCP."""
        options.setdefault("autocommit", True)
        return psycopg.connect(**{**self.params.client_options(), **options})

    def _ready(self) -> bool:
        try:
            with self.superuser():
                return True
        except psycopg.OperationalError:
            return False


@contextlib.contextmanager
def private_server(settings: Mapping[str, str] | None = None,
                   ca: CertificateAuthority | None = None) -> Iterator[PostgresServer]:
    """Initialise, start and bootstrap a private server (``settings`` over the defaults;
    secured by a certificate of ``ca`` if given); stop it and delete everything after."""
    base_dir = Path(tempfile.mkdtemp(prefix="twophase-postgres-"))
    server = PostgresServer(base_dir, settings, ca)
    try:
        server.install()
        server.start()
        server.bootstrap()
        yield server
    finally:
        server.stop()
        shutil.rmtree(base_dir, ignore_errors=True)


@contextlib.contextmanager
def logical_server() -> Iterator[PostgresServer]:
    """:func:`private_server` serving logical decoding too (:data:`LOGICAL_DECODING_SETTINGS`),
    failing (never skipping) if PostgreSQL is missing."""
    for name in ("initdb", "postgres"):
        _binary(name)
    with private_server(LOGICAL_DECODING_SETTINGS) as server:
        yield server


_table_numbers = itertools.count()


@dataclass
class PgView:
    """The test's own sessions on the server: PostgreSQL's view of what the sink did."""

    server: PostgresServer

    def query(self, statement: str | sql.Composable, args: Any = None) -> list[tuple[Any, ...]]:
        with self.server.connect() as conn:
            cursor = conn.execute(statement, args)  # type: ignore[arg-type]
            return list(cursor.fetchall()) if cursor.description else []

    def new_table(self, ddl: str, prefix: str = "t") -> str:
        """A table of a name no test used before, from ``ddl`` (``{table}`` in it)."""
        name = f"{prefix}{os.getpid()}_{next(_table_numbers)}"
        self.query(ddl.format(table=sql.Identifier(name).as_string()))
        return name

    def new_orders_table(self, prefix: str = "orders_") -> str:
        return self.new_table(ORDERS_DDL, prefix)

    def event_ids(self, table: str) -> list[int]:
        """The sorted event_id of every row a reader of ``table`` sees."""
        return [row[0] for row in self.query(sql.SQL("SELECT event_id FROM {} ORDER BY 1")
                                             .format(sql.Identifier(table)))]

    def prepared(self) -> list[str]:
        """The gids of the prepared transactions of the test database."""
        return [row[0] for row in self.query(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
            "ORDER BY gid")]

    def replication_slots(self) -> list[tuple[str, str, bool]]:
        """The cluster's replication slots: name, plugin, whether a consumer holds it now."""
        return [(row[0], row[1], row[2]) for row in self.query(
            "SELECT slot_name::text, plugin::text, active FROM pg_replication_slots "
            "ORDER BY 1")]

    def rollback_all_prepared(self) -> list[str]:
        left = self.prepared()
        for gid in left:
            with contextlib.suppress(psycopg.errors.UndefinedObject):
                self.query(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
        return left


def require_installed() -> None:
    """Raises :class:`PostgresMissingError` if a program the server needs is missing."""
    for name in ("initdb", "postgres"):
        _binary(name)
