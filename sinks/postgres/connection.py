"""Connecting: the one place the sink opens a session, and the settings every session gets.

Every session runs with ``TimeZone=UTC`` (a ``timestamptz`` is written and read as the instant
it is; a ``timestamp`` column gets the UTC wall-clock time of an instant, as MySQL's
``DATETIME`` does), ``lock_timeout`` (``DEFAULT_LOCK_TIMEOUT_S`` unless told otherwise: a
writer blocked by another transaction's row locks fails with an error naming the holder
(:mod:`~sinks.postgres.locks`) instead of hanging; only an explicit ``lock_timeout_s=None``
leaves the server's setting, by default no limit) and ``application_name=twophase``. A writer's
session also gets ``idle_in_transaction_session_timeout``: the unprepared transaction of a
writer whose host vanished ends, and frees its row locks, after ``WRITER_IDLE_TIMEOUT_S``.

TLS (:class:`twophase.kit.Tls`, every prebuilt sink's options): ``tls="verify"`` by default
(libpq's ``sslmode=verify-full``): the server's certificate must come from a CA of ``ca_bundle``
(libpq's ``sslrootcert``: a PEM file, or ``"system"`` for the system's CA store with libpq >= 16;
libpq's own default ``~/.postgresql/root.crt`` if None) and name the host connected to.
``tls="require"`` encrypts without verifying, ``tls="off"`` is plain text (``disable``). libpq's
own default, ``prefer``, checks nothing and falls back to plain text, as ``allow`` does: neither
is offered. ``client_cert``/``client_key`` (libpq's ``sslcert``/``sslkey``) are the client
certificate the sink presents: mutual TLS. The former ``sslmode=`` (``verify-ca`` among its
values) works and warns until 0.6.0.

The password (a :class:`twophase.Secret` or the clear text) is revealed only here, when a
session is opened; libpq's messages do not carry it, and
:func:`twophase.kit.scrubbed` removes it from any that would. Every session reads it again, so
a rotated password is used by the next one; a password refused just as it was rotated is tried
once more (:func:`twophase.kit.retried_if_rotated`). A sink made with
``connection=Secret(...)`` (the whole URL a secret) has for its password a
:class:`twophase.kit.sql.UrlPassword`: the URL's password part, read the same way from what the
Secret holds at each connection.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import psycopg
from psycopg import pq

from sinks.postgres.errors import SYSTEM, classify, refused_credentials
from twophase import ConfigurationError
from twophase.kit import (
    Credentials,
    SecretOption,
    Tls,
    TlsMode,
    classified,
    retried_if_rotated,
    reveal,
    scrubbed,
)
from twophase.kit.sql import ConnectionPool, ConnectionUrl

Connection = psycopg.Connection[Any]

DEFAULT_PORT = 5432
DEFAULT_CONNECT_TIMEOUT_S = 10
#: ``connection=``: ``postgresql://user[:password]@host[:port]/database[?tls=...]`` (or
#: ``postgres://``), a :class:`twophase.Secret` holding one, or a mapping of the options.
URL = ConnectionUrl(SYSTEM, ("postgresql", "postgres"), DEFAULT_PORT, DEFAULT_CONNECT_TIMEOUT_S)
SslMode = Literal["verify-full", "verify-ca", "require", "disable"]
SSL_MODES: tuple[SslMode, ...] = ("verify-full", "verify-ca", "require", "disable")
#: libpq's ``sslmode`` of each ``tls=`` (its own default, ``prefer``, verifies nothing).
#: ``tls=`` of each (former) ``sslmode`` (``verify-ca``: verified, the host name not checked).
TLS_OF_SSLMODE: Mapping[SslMode, TlsMode] = {"verify-full": "verify", "verify-ca": "verify",
                                            "require": "require", "disable": "off"}
SSLMODE_OF_TLS: Mapping[TlsMode, SslMode] = {"verify": "verify-full", "require": "require",
                                            "off": "disable"}
APPLICATION_NAME = "twophase"
#: A writer's unprepared transaction ends on the server after this long idle in it.
WRITER_IDLE_TIMEOUT_S = 600
#: How long a statement waits for a lock before it fails (SQLSTATE 55P03), unless told
#: otherwise: InnoDB's default. A wait on a prepared transaction's lock can last until the
#: decision, which may wait for the waiting task itself: without a bound, a batch could hang.
DEFAULT_LOCK_TIMEOUT_S = 50.0
#: Connection options the sink owns; ``connect_args`` may add others, not these (TLS is the
#: sink's ``tls=``, ``ca_bundle=``, ``client_cert=``, ``client_key=``, so that nothing in
#: ``connect_args`` can weaken it).
RESERVED_CONNECT_ARGS = frozenset({"host", "port", "user", "password", "dbname", "autocommit",
                                   "options", "application_name", "sslmode", "connect_timeout",
                                   "sslrootcert", "sslnegotiation", "passfile", "service",
                                   "sslcert", "sslkey"})


@dataclass(frozen=True)
class Server:
    """Where and how the sink connects (pickled to executors with the sink: no connection)."""

    host: str
    port: int
    user: str
    password: SecretOption | None = field(repr=False)
    database: str
    tls: Tls = field(default_factory=lambda: Tls(system=SYSTEM))
    #: ``tls="verify"`` without the host name's check (the former ``sslmode="verify-ca"``).
    check_host_name: bool = True
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    lock_timeout_s: float | None = DEFAULT_LOCK_TIMEOUT_S
    connect_args: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.lock_timeout_s is not None and (isinstance(self.lock_timeout_s, bool)
                                                or not self.lock_timeout_s > 0):
            raise ConfigurationError(
                f"{SYSTEM}: lock_timeout_s={self.lock_timeout_s!r} must be positive seconds "
                "(or None: the server's lock_timeout, by default no limit).",
                fix=f"leave it at {DEFAULT_LOCK_TIMEOUT_S:.0f} or pass positive seconds")

    @property
    def sslmode(self) -> SslMode:
        """libpq's ``sslmode`` of :attr:`tls`."""
        if self.tls.verifies and not self.check_host_name:
            return "verify-ca"
        return SSLMODE_OF_TLS[self.tls.mode]

    def libpq_tls(self) -> dict[str, Any]:
        """libpq's TLS options (``sslmode``, and the files given)."""
        files = {"sslrootcert": self.tls.ca_bundle, "sslcert": self.tls.client_cert,
                 "sslkey": self.tls.client_key}
        return {"sslmode": self.sslmode} | {name: path for name, path in files.items()
                                             if path is not None}

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def on(self, step: str) -> str:
        """``step`` with the server named, as error messages put it."""
        return f"{step} on PostgreSQL server {self.address}"

    def connect(self, *, autocommit: bool = True, writer: bool = False) -> Connection:
        """A new UTC session (see the module docstring); errors are classified. A password
        refused just as its Secret was rotated is tried once more with the new one
        (:func:`twophase.kit.retried_if_rotated`)."""
        return retried_if_rotated(
            lambda: self._connect(autocommit, writer), lambda: Credentials(self.password),
            refused_credentials, what=self.on(f"connecting as user {self.user!r}"))

    def _connect(self, autocommit: bool, writer: bool) -> Connection:
        settings = {"TimeZone": "UTC"}
        if self.lock_timeout_s is not None:
            settings["lock_timeout"] = f"{max(1, round(self.lock_timeout_s * 1000))}ms"
        if writer:
            settings["idle_in_transaction_session_timeout"] = f"{WRITER_IDLE_TIMEOUT_S}s"
        options = " ".join(f"-c {name}={value}" for name, value in settings.items())
        password = reveal(self.password) or ""
        with classified(scrubbed(classify, password),
                        self.on(f"connecting as user {self.user!r} ({self.tls.describe()})"),
                        psycopg.Error):
            return psycopg.connect(
                host=self.host, port=self.port, user=self.user, password=password,
                dbname=self.database, autocommit=autocommit, options=options,
                application_name=APPLICATION_NAME,
                connect_timeout=max(1, int(self.connect_timeout_s)), **self.libpq_tls(),
                **self.connect_args)

    @contextlib.contextmanager
    def session(self, step: str) -> Iterator[Connection]:
        """A short-lived autocommit session for one step; errors inside are classified."""
        conn = self.connect()
        try:
            with classified(classify, self.on(step), psycopg.Error):
                yield conn
        finally:
            close_quietly(conn)

    def pool(self, size: int) -> ConnectionPool[Connection]:
        """Autocommit sessions a committer's threads share (see the kit's pool)."""
        return ConnectionPool(self.connect, close=close_quietly, usable=_idle, max_idle=size)


def tls_settings(mode: TlsMode, ca_bundle: str | None, client_cert: str | None,
                 client_key: str | None, sslmode: SslMode | None = None) -> dict[str, Any]:
    """:class:`Server`'s ``tls`` and ``check_host_name`` from the sink's options; the former
    ``sslmode``, if given, decides the mode (``verify-ca``: verified, the host name not)."""
    if sslmode is not None:
        if sslmode not in SSL_MODES:
            raise ConfigurationError(
                f"{SYSTEM}: sslmode={sslmode!r} is refused: libpq's 'prefer' and 'allow' fall "
                "back to plain text without a word, and check no certificate.",
                fix="pass tls='verify' (the default) unless the network is trusted")
        mode = TLS_OF_SSLMODE[sslmode]
    return {"tls": Tls(mode, ca_bundle, client_cert, client_key, SYSTEM),
            "check_host_name": sslmode != "verify-ca"}


def _idle(conn: Connection) -> bool:
    return not conn.closed and conn.info.transaction_status == pq.TransactionStatus.IDLE


def close_quietly(conn: Connection | None) -> None:
    if conn is not None:
        with contextlib.suppress(Exception):
            conn.close()
