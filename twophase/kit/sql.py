"""The sink kit for a database sink: connections its committer's threads share, and the keyed
mode applied in SQL.

================================  =============================================================
piece                             what it does
================================  =============================================================
:class:`ConnectionPool`           connections a committer's threads share (up to
                                  ``commit_parallelism`` of them), one thread at a time each
:class:`PooledCommitter`          a :class:`~twophase.Committer` whose threads borrow pooled
                                  sessions, errors classified: a database sink's committer
:func:`keyed_apply_statements`    the keyed mode (:class:`twophase.kit.Keyed`) for a publisher
                                  in SQL: reduce, drop what is not newer than the row or the
                                  tombstone, delete and keep tombstones, upsert with the
                                  version guard (see :mod:`twophase._keyed`)
:func:`tombstone_table_name`      the tombstone table's name within a system's limit, its time
                                  column :data:`TOMBSTONE_TIME_COLUMN`
================================  =============================================================

``__all__`` is this family's public API. Until 0.6.0 each name also imports from
:mod:`twophase.kit` (where the flat kit had it), with a :class:`DeprecationWarning` naming this
module.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from twophase._classify import Classify, classified
from twophase._keyed import TOMBSTONE_TIME_COLUMN, keyed_apply_statements, tombstone_table_name
from twophase.sink import DEFAULT_COMMIT_PARALLELISM, Committer

__all__ = [
    "TOMBSTONE_TIME_COLUMN",
    "ConnectionPool",
    "PooledCommitter",
    "keyed_apply_statements",
    "tombstone_table_name",
]

C = TypeVar("C")


class ConnectionPool(Generic[C]):
    """Connections that one committer's threads share: each is lent to one thread at a time.

    The driver commits a batch's handles from up to ``commit_parallelism`` threads through one
    committer; with a pool, a batch of N handles opens about ``min(N, commit_parallelism)``
    connections instead of N. A connection goes back only if the block that borrowed it ended
    without an error (an error may leave a transaction open or the connection broken: it is
    closed), at most ``max_idle`` are kept, and none is lent again after ``max_idle_s`` idle
    (the server may have ended it) or once ``usable`` says it is closed. Thread-safe::

        pool = ConnectionPool(server.connect, close=close_quietly, usable=lambda c: not c.closed)
        with pool.connection() as conn:
            ...
        pool.close()
    """

    def __init__(self, connect: Callable[[], C], *, close: Callable[[C], None],
                 usable: Callable[[C], bool] = lambda _conn: True,
                 max_idle: int = DEFAULT_COMMIT_PARALLELISM,
                 max_idle_s: float | None = None) -> None:
        self._connect, self._close_one, self._usable = connect, close, usable
        self._max_idle, self._max_idle_s = max_idle, max_idle_s
        self._idle: list[tuple[C, float]] = []
        self._lock = threading.Lock()
        self._closed = False

    @contextlib.contextmanager
    def connection(self) -> Iterator[C]:
        """A connection of the pool (or a new one) for the block; given back if it ends well."""
        conn = self._take()
        if conn is None:
            conn = self._connect()
        try:
            yield conn
        except BaseException:
            self._close_one(conn)
            raise
        self._give_back(conn)

    def close(self) -> None:
        """Close every idle connection; connections lent now are closed when given back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn, _since in idle:
            self._close_one(conn)

    def _take(self) -> C | None:
        stale = []
        try:
            with self._lock:
                while self._idle:
                    conn, since = self._idle.pop()
                    if self._usable(conn) and (self._max_idle_s is None
                                               or time.monotonic() - since < self._max_idle_s):
                        return conn
                    stale.append(conn)
            return None
        finally:
            for conn in stale:
                self._close_one(conn)

    def _give_back(self, conn: C) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle and self._usable(conn):
                self._idle.append((conn, time.monotonic()))
                return
        self._close_one(conn)


class PooledCommitter(Committer, Generic[C]):
    """A committer whose threads borrow sessions of one :class:`ConnectionPool`, any error in
    a session classified by the sink's ``classify`` naming the step (``where(what)``)::

        class MyCommitter(PooledCommitter[Connection]):
            def __init__(self, sink):
                super().__init__(sink, sink.server.pool(sink.commit_parallelism), classify,
                                 driver.Error, sink.server.on)

            def commit(self, handle):
                with self.session(f"commit of {handle.txn_id}") as conn:
                    ...
    """

    def __init__(self, sink: Any, pool: ConnectionPool[C], classify: Classify,
                 errors: type[BaseException] | tuple[type[BaseException], ...],
                 where: Callable[[str], str] = lambda what: what) -> None:
        super().__init__(sink)
        self._pool, self._classify, self._errors, self._where = pool, classify, errors, where

    @contextlib.contextmanager
    def session(self, what: str) -> Iterator[C]:
        """A pooled session for one step; errors inside are classified."""
        with classified(self._classify, self._where(what), self._errors), \
                self._pool.connection() as conn:
            yield conn

    def close(self) -> None:
        self._pool.close()
