"""Connecting: the one place the sink opens a connection, its session settings, a small pool.

Every session of the sink (writer, committer, schema check, fence, recovery, purge) adds
``STRICT_TRANS_TABLES`` to the server's ``sql_mode`` (a value that does not fit is an error,
never a silent truncation) and sets ``time_zone = '+00:00'`` (a fixed offset: no time zone
tables needed), so ``TIMESTAMP`` columns are written and read in UTC whatever the server's
``time_zone`` or the client's ``TZ``. PyMySQL never reconnects by itself (the sink never calls
``ping``): an XA connection must not silently become another session.

TLS (:class:`twophase.kit.Tls`): ``tls="verify"`` by default: the server's certificate is checked
against ``ca_bundle`` (a PEM file; the system's CA store if None) and must name the host the sink
connects to (MySQL's ``VERIFY_IDENTITY``). ``tls="require"`` encrypts without checking who answers;
``tls="off"`` is plain text. ``client_cert``/``client_key`` (PEM files; the key unencrypted, or in
the certificate's file if ``client_key`` is None) are the client certificate the sink presents, for
a user created ``REQUIRE X509`` (or ``SUBJECT``/``ISSUER``): mutual TLS. Once TLS is asked for, a
server that does not offer it is refused before the login is sent (PyMySQL raises 2026): never a
silent fall back to plain text, as PyMySQL's own default does. The ``SSLContext`` is built once per
process and settings (:meth:`twophase.kit.Tls.context`: loading the system CA store costs about 30
ms of CPU, more than a whole small branch, and the sink opens a connection per branch).

The password (a :class:`twophase.Secret` or the clear text) is revealed only here, when a
connection is opened; PyMySQL's messages never carry it (an access denied names the user and
the host), and :func:`twophase.kit.scrubbed` removes it from any that would. Every connection
reads it again, so a rotated password is used by the next one; a login refused just as it was
rotated is tried once more (:func:`twophase.kit.retried_if_rotated`). A sink made with
``connection=Secret(...)`` (the whole URL a secret) has for its password a
:class:`twophase.kit.sql.UrlPassword`: the URL's password part, read the same way from what the
Secret holds at each connection.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pymysql

from sinks.mysql.encoding import CONVERSIONS
from sinks.mysql.errors import SYSTEM, classify, refused_credentials
from twophase.kit import (
    Credentials,
    SecretOption,
    Tls,
    classified,
    retried_if_rotated,
    reveal,
    scrubbed,
)
from twophase.kit.sql import ConnectionPool, ConnectionUrl

log = logging.getLogger(__name__)

Connection = Any  # pymysql.connections.Connection; PyMySQL ships no type hints

DEFAULT_PORT = 3306
DEFAULT_CONNECT_TIMEOUT_S = 10
DEFAULT_READ_TIMEOUT_S = 600
#: A writer's session ends on the server after this long without a statement: the branch of a
#: writer whose host vanished (a half-open connection) is rolled back and its row locks freed,
#: instead of after the server's ``wait_timeout`` (8 hours by default).
WRITER_IDLE_TIMEOUT_S = 600
CHARSET = "utf8mb4"
#: ``connection=``: ``mysql://user[:password]@host[:port]/database[?tls=...]`` (or
#: ``mariadb://``), a :class:`twophase.Secret` holding one, or a mapping of the options.
URL = ConnectionUrl(SYSTEM, ("mysql", "mariadb"), DEFAULT_PORT, DEFAULT_CONNECT_TIMEOUT_S)
STRICT_SQL_MODE = ("SESSION sql_mode = CONCAT_WS(',', NULLIF(@@SESSION.sql_mode, ''), "
                   "'STRICT_TRANS_TABLES')")
UTC_TIME_ZONE = "SESSION time_zone = '+00:00'"

#: Connection options the sink owns; ``connect_args`` may add others, not these (TLS is
#: ``tls=``, ``ca_bundle=``, ``client_cert=`` and ``client_key=``, so that nothing in
#: ``connect_args`` can weaken it).
RESERVED_CONNECT_ARGS = frozenset({
    "host", "port", "user", "password", "passwd", "database", "db", "autocommit",
    "local_infile", "charset", "init_command", "conv", "ssl", "ssl_ca", "ssl_cert", "ssl_key",
    "ssl_disabled", "ssl_verify_cert", "ssl_verify_identity", "ssl_key_password",
    "read_default_file", "read_default_group",
})

_MARIADB_VERSION_RE = re.compile(r"(\d+)\.(\d+)\.\d+-MariaDB", re.IGNORECASE)
_MYSQL_VERSION_RE = re.compile(r"^(\d+)\.(\d+)")


def pymysql_tls(tls: Tls) -> dict[str, Any]:
    """PyMySQL's TLS options for ``tls``: the process's shared context, or TLS disabled."""
    if not tls.encrypts:
        return {"ssl_disabled": True}
    return {"ssl": tls.context()}


@dataclass(frozen=True)
class Server:
    """Where and how the sink connects (pickled to executors with the sink: no connection)."""

    host: str
    port: int
    user: str
    password: SecretOption | None = field(repr=False)
    database: str
    tls: Tls = field(default_factory=lambda: Tls(system=SYSTEM))
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    read_timeout_s: float | None = DEFAULT_READ_TIMEOUT_S
    lock_wait_timeout_s: int | None = None
    connect_args: Mapping[str, Any] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def on(self, step: str) -> str:
        """``step`` with the server named, as error messages put it."""
        return f"{step} on MySQL server {self.address}"

    def connect(self, *, local_infile: bool = False, idle_timeout_s: int | None = None
                ) -> Connection:
        """A new strict UTC session (see the module docstring); errors are classified. A
        login refused just as the password's Secret was rotated is tried once more with the
        new one (:func:`twophase.kit.retried_if_rotated`)."""
        return retried_if_rotated(
            lambda: self._connect(local_infile, idle_timeout_s),
            lambda: Credentials(self.password), refused_credentials,
            what=self.on(f"connecting as user {self.user!r}"))

    def _connect(self, local_infile: bool, idle_timeout_s: int | None) -> Connection:
        settings = {"innodb_lock_wait_timeout": self.lock_wait_timeout_s,
                    "wait_timeout": idle_timeout_s}
        init_command = ", ".join([STRICT_SQL_MODE, UTC_TIME_ZONE] + [
            f"SESSION {name} = {int(value)}" for name, value in settings.items()
            if value is not None])
        password = reveal(self.password) or ""
        with classified(scrubbed(classify, password),
                        self.on(f"connecting as user {self.user!r} ({self.tls.describe()})"),
                        pymysql.err.MySQLError):
            return open_connection(
                host=self.host, port=self.port, user=self.user, password=password,
                database=self.database, charset=CHARSET, autocommit=True,
                local_infile=local_infile, connect_timeout=self.connect_timeout_s,
                read_timeout=self.read_timeout_s, write_timeout=self.read_timeout_s,
                init_command=f"SET {init_command}", tls=self.tls, **self.connect_args)

    @contextlib.contextmanager
    def session(self, step: str) -> Iterator[Connection]:
        """A short-lived connection for one step; errors inside are classified, then it closes."""
        conn = self.connect()
        try:
            with classified(classify, self.on(step), pymysql.err.MySQLError):
                yield conn
        finally:
            close_quietly(conn)


def open_connection(tls: Tls, **options: Any) -> Connection:
    """``pymysql.connect(**options)`` secured as ``tls`` says (never PyMySQL's own default,
    which falls back to plain text), parameters escaped with
    :data:`~sinks.mysql.encoding.CONVERSIONS` (aware datetimes as naive UTC) unless ``conv``
    is given."""
    return pymysql.connect(**{"conv": CONVERSIONS, **options, **pymysql_tls(tls)})


def close_quietly(conn: Connection | None) -> None:
    if conn is not None:
        with contextlib.suppress(Exception):
            conn.close()


def query(conn: Connection, sql: str, args: Sequence[Any] | None = None
          ) -> list[tuple[Any, ...]]:
    with conn.cursor() as cursor:
        cursor.execute(sql, args)
        return list(cursor.fetchall())


def server_version(server_info: str) -> tuple[str, tuple[int, int]]:
    """("MariaDB" | "MySQL", (major, minor)) from the handshake's version string."""
    maria = _MARIADB_VERSION_RE.search(server_info)
    if maria:
        return "MariaDB", (int(maria.group(1)), int(maria.group(2)))
    mysql = _MYSQL_VERSION_RE.match(server_info)
    if mysql:
        return "MySQL", (int(mysql.group(1)), int(mysql.group(2)))
    return "MySQL", (0, 0)


def is_mariadb(conn: Connection) -> bool:
    return server_version(conn.get_server_info())[0] == "MariaDB"


def pool(connect: Callable[[], Connection], *, size: int,
         max_idle_s: float | None = None) -> ConnectionPool[Connection]:
    """A committer's pool of ``connect``'s connections
    (:class:`twophase.kit.sql.ConnectionPool`)."""
    return ConnectionPool(connect, close=close_quietly, usable=lambda conn: bool(conn.open),
                          max_idle=size, max_idle_s=max_idle_s)
