"""Connecting: the one place the sink opens a session, and the settings every session gets.

Every session runs with ``TimeZone=UTC`` (a ``timestamptz`` is written and read as the instant
it is; a ``timestamp`` column gets the UTC wall-clock time of an instant, as MySQL's
``DATETIME`` does), ``lock_timeout`` (``DEFAULT_LOCK_TIMEOUT_S`` unless told otherwise: a
writer blocked by another transaction's row locks fails with an error naming the holder
(:mod:`~sinks.postgres.locks`) instead of hanging; only an explicit ``lock_timeout_s=None``
leaves the server's setting, by default no limit) and ``application_name=twophase``. A writer's
session also gets ``idle_in_transaction_session_timeout``: the unprepared transaction of a
writer whose host vanished ends, and frees its row locks, after ``WRITER_IDLE_TIMEOUT_S``.

TLS: ``sslmode="verify-full"`` by default: the server's certificate must come from a CA of
``ca_bundle`` (libpq's ``sslrootcert``: a PEM file, or ``"system"`` for the system's CA store
with libpq >= 16; libpq's own default ``~/.postgresql/root.crt`` if None) and name the host
connected to. libpq's own default, ``prefer``, checks nothing and falls back to plain text, as
``allow`` does: both are refused. ``verify-ca`` skips the host name, ``require`` encrypts
without verifying, ``disable`` is plain text (the one way to relax it, named in the errors).

The password (a :class:`twophase.Secret` or the clear text) is revealed only here, when a
session is opened; libpq's messages do not carry it, and
:func:`twophase.kit.scrubbed` removes it from any that would. Every session reads it again, so
a rotated password is used by the next one; a password refused just as it was rotated is tried
once more (:func:`twophase.kit.retried_if_rotated`).
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
    ConnectionPool,
    Credentials,
    SecretOption,
    classified,
    retried_if_rotated,
    reveal,
    scrubbed,
)

Connection = psycopg.Connection[Any]

DEFAULT_PORT = 5432
DEFAULT_CONNECT_TIMEOUT_S = 10
SslMode = Literal["verify-full", "verify-ca", "require", "disable"]
SSL_MODES: tuple[SslMode, ...] = ("verify-full", "verify-ca", "require", "disable")
#: Verify the certificate and the host name (libpq's default, ``prefer``, does neither).
DEFAULT_SSLMODE: SslMode = "verify-full"
APPLICATION_NAME = "twophase"
#: A writer's unprepared transaction ends on the server after this long idle in it.
WRITER_IDLE_TIMEOUT_S = 600
#: How long a statement waits for a lock before it fails (SQLSTATE 55P03), unless told
#: otherwise: InnoDB's default. A wait on a prepared transaction's lock can last until the
#: decision, which may wait for the waiting task itself: without a bound, a batch could hang.
DEFAULT_LOCK_TIMEOUT_S = 50.0
#: Connection options the sink owns; ``connect_args`` may add others, not these (TLS is
#: ``sslmode=`` and ``ca_bundle=``, so that nothing in ``connect_args`` can weaken it).
RESERVED_CONNECT_ARGS = frozenset({"host", "port", "user", "password", "dbname", "autocommit",
                                   "options", "application_name", "sslmode", "connect_timeout",
                                   "sslrootcert", "sslnegotiation", "passfile", "service"})


@dataclass(frozen=True)
class Server:
    """Where and how the sink connects (pickled to executors with the sink: no connection)."""

    host: str
    port: int
    user: str
    password: SecretOption = field(repr=False)
    database: str
    sslmode: SslMode = DEFAULT_SSLMODE
    ca_bundle: str | None = None
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
        if self.sslmode not in SSL_MODES:
            raise ConfigurationError(
                f"{SYSTEM}: sslmode={self.sslmode!r} is refused: libpq's 'prefer' and 'allow' "
                "fall back to plain text without a word, and check no certificate.",
                fix=f"use one of {SSL_MODES} ('verify-full', the default, unless the network "
                "is trusted)")
        if self.ca_bundle is not None and not self.sslmode.startswith("verify"):
            raise ConfigurationError(
                f"{SYSTEM}: ca_bundle= is given but sslmode={self.sslmode!r} does not verify the "
                "server's certificate.", fix="use sslmode='verify-full' with ca_bundle=")

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
        tls: dict[str, Any] = {} if self.ca_bundle is None else {"sslrootcert": self.ca_bundle}
        password = reveal(self.password) or ""
        with classified(scrubbed(classify, password),
                        self.on(f"connecting as user {self.user!r} (sslmode={self.sslmode!r})"),
                        psycopg.Error):
            return psycopg.connect(
                host=self.host, port=self.port, user=self.user, password=password,
                dbname=self.database, autocommit=autocommit, options=options,
                application_name=APPLICATION_NAME, sslmode=self.sslmode,
                connect_timeout=max(1, int(self.connect_timeout_s)), **tls,
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


def _idle(conn: Connection) -> bool:
    return not conn.closed and conn.info.transaction_status == pq.TransactionStatus.IDLE


def close_quietly(conn: Connection | None) -> None:
    if conn is not None:
        with contextlib.suppress(Exception):
            conn.close()
