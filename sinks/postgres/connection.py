"""Connecting: the one place the sink opens a session, and the settings every session gets.

Every session runs with ``TimeZone=UTC`` (a ``timestamptz`` is written and read as the instant
it is; a ``timestamp`` column gets the UTC wall-clock time of an instant, as MySQL's
``DATETIME`` does), ``lock_timeout`` if given (a writer blocked by an orphan's row locks fails
with a retryable error instead of hanging) and ``application_name=twophase``. A writer's
session also gets ``idle_in_transaction_session_timeout``: the unprepared transaction of a
writer whose host vanished ends, and frees its row locks, after ``WRITER_IDLE_TIMEOUT_S``.
TLS: ``sslmode="verify-full"`` by default (libpq's own default, ``prefer``, never checks the
certificate); the server's certificate must be trusted (``sslrootcert=`` in ``connect_args``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import pq

from sinks.postgres.errors import classify
from twophase.kit import ConnectionPool, classified

Connection = psycopg.Connection[Any]

DEFAULT_PORT = 5432
DEFAULT_CONNECT_TIMEOUT_S = 10
DEFAULT_SSLMODE = "verify-full"
APPLICATION_NAME = "twophase"
#: A writer's unprepared transaction ends on the server after this long idle in it.
WRITER_IDLE_TIMEOUT_S = 600
#: Connection options the sink owns; ``connect_args`` may add others (sslrootcert, ...).
RESERVED_CONNECT_ARGS = frozenset({"host", "port", "user", "password", "dbname", "autocommit",
                                   "options", "application_name", "sslmode", "connect_timeout"})


@dataclass(frozen=True)
class Server:
    """Where and how the sink connects (pickled to executors with the sink: no connection)."""

    host: str
    port: int
    user: str
    password: str = field(repr=False)
    database: str
    sslmode: str = DEFAULT_SSLMODE
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    lock_timeout_s: float | None = None
    connect_args: Mapping[str, Any] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def on(self, step: str) -> str:
        """``step`` with the server named, as error messages put it."""
        return f"{step} on PostgreSQL server {self.address}"

    def connect(self, *, autocommit: bool = True, writer: bool = False) -> Connection:
        """A new UTC session (see the module docstring); errors are classified."""
        settings = {"TimeZone": "UTC"}
        if self.lock_timeout_s is not None:
            settings["lock_timeout"] = f"{int(self.lock_timeout_s * 1000)}ms"
        if writer:
            settings["idle_in_transaction_session_timeout"] = f"{WRITER_IDLE_TIMEOUT_S}s"
        options = " ".join(f"-c {name}={value}" for name, value in settings.items())
        with classified(classify, self.on(f"connecting as user {self.user!r}"), psycopg.Error):
            return psycopg.connect(
                host=self.host, port=self.port, user=self.user, password=self.password,
                dbname=self.database, autocommit=autocommit, options=options,
                application_name=APPLICATION_NAME, sslmode=self.sslmode,
                connect_timeout=max(1, int(self.connect_timeout_s)), **self.connect_args)

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
