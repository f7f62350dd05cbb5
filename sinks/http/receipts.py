"""The reference receiver's store: idempotency keys, stored responses, delivered records.

One SQLite database in WAL mode with ``synchronous=FULL`` (a record acknowledged is on disk),
used by one thread of one receiver process (the receiver holds ``<db>.lock`` to refuse a
second one)::

    idempotency_keys(scope, key, fingerprint, state 'in-flight' | 'done', owner, created,
                     completed, status, content_type, body)    -- PRIMARY KEY (scope, key)
    records(id, key, path, seq, record, received)   -- one row per delivered JSON record

A key is scoped by the request's path (unique per resource, as the draft leaves to the
server). The insert of a key is the lock: :meth:`Receipts.claim` inserts it ``in-flight`` in
its own transaction, so a concurrent duplicate finds the row and gets 409, never a second execution.
:meth:`Receipts.complete` stores the records, the response and ``done`` in ONE transaction:
a crash before it leaves only the in-flight row, which the next start releases
(:meth:`Receipts.release_interrupted`) so the client's retry executes the request, once.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

IN_FLIGHT, DONE = "in-flight", "done"

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS idempotency_keys (scope TEXT NOT NULL, key TEXT NOT NULL, "
    "fingerprint TEXT NOT NULL, state TEXT NOT NULL CHECK (state IN ('in-flight', 'done')), "
    "owner TEXT NOT NULL, created REAL NOT NULL, completed REAL, status INTEGER, "
    "content_type TEXT, body BLOB, PRIMARY KEY (scope, key))",
    "CREATE TABLE IF NOT EXISTS records (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT "
    "NULL, path TEXT NOT NULL, seq INTEGER NOT NULL, record TEXT NOT NULL, received REAL NOT "
    "NULL)",
    "CREATE INDEX IF NOT EXISTS records_by_path ON records (path)",
    "CREATE INDEX IF NOT EXISTS keys_by_created ON idempotency_keys (created)",
)


@dataclass(frozen=True)
class Stored:
    """A completed request's response, as it is replayed."""

    status: int
    content_type: str
    body: bytes


@dataclass(frozen=True)
class Claim:
    """What :meth:`Receipts.claim` found: claimed (execute it), in flight, a mismatch, or a
    stored response to replay."""

    claimed: bool = False
    in_flight: bool = False
    stored_fingerprint: str | None = None  # set on a mismatch
    stored: Stored | None = None


class Receipts:
    """The receiver's database (see the module docstring); not thread-safe: one thread."""

    def __init__(self, path: str | Path, owner: str) -> None:
        self.owner = owner
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("PRAGMA busy_timeout=10000")
        for statement in _SCHEMA:
            self.db.execute(statement)

    def close(self) -> None:
        self.db.close()

    def claim(self, scope: str, key: str, fingerprint: str, now: float, expiry_s: float,
              ) -> Claim:
        """Insert ``key`` in flight unless it is known in ``scope`` (and not expired)."""
        with self._transaction():
            row = self.db.execute(
                "SELECT fingerprint, state, created, status, content_type, body "
                "FROM idempotency_keys WHERE scope = ? AND key = ?", (scope, key)).fetchone()
            if row is not None and row[2] + expiry_s <= now:
                self.db.execute("DELETE FROM idempotency_keys WHERE scope = ? AND key = ?",
                                (scope, key))
                row = None
            if row is None:
                self.db.execute(
                    "INSERT INTO idempotency_keys (scope, key, fingerprint, state, owner, "
                    "created) VALUES (?, ?, ?, ?, ?, ?)",
                    (scope, key, fingerprint, IN_FLIGHT, self.owner, now))
                return Claim(claimed=True)
        stored_fingerprint, state, _, status, content_type, body = row
        if stored_fingerprint != fingerprint:
            return Claim(stored_fingerprint=stored_fingerprint)
        if state == IN_FLIGHT:
            return Claim(in_flight=True)
        return Claim(stored=Stored(status, content_type, bytes(body)))

    def complete(self, scope: str, key: str, records: Sequence[Any], response: Stored,
                 now: float) -> None:
        """Store the records (under the scope's path), the (2xx) response and ``done``,
        atomically."""
        with self._transaction():
            self.db.executemany(
                "INSERT INTO records (key, path, seq, record, received) VALUES (?, ?, ?, ?, ?)",
                ((key, scope, seq, json.dumps(record, separators=(",", ":")), now)
                 for seq, record in enumerate(records)))
            self.db.execute(
                "UPDATE idempotency_keys SET state = ?, completed = ?, status = ?, "
                "content_type = ?, body = ? WHERE scope = ? AND key = ?",
                (DONE, now, response.status, response.content_type, response.body, scope, key))

    def release(self, scope: str, key: str) -> None:
        """Forget an in-flight key whose execution failed (the client will retry it)."""
        with self._transaction():
            self.db.execute(
                "DELETE FROM idempotency_keys WHERE scope = ? AND key = ? AND state = ?",
                (scope, key, IN_FLIGHT))

    def release_interrupted(self) -> int:
        """At the start: forget the keys a previous (crashed) process left in flight."""
        with self._transaction():
            return self.db.execute(
                "DELETE FROM idempotency_keys WHERE state = ? AND owner <> ?",
                (IN_FLIGHT, self.owner)).rowcount

    def purge_expired(self, now: float, expiry_s: float) -> int:
        """Forget completed keys older than the window (their records stay)."""
        with self._transaction():
            return self.db.execute(
                "DELETE FROM idempotency_keys WHERE state = ? AND created <= ?",
                (DONE, now - expiry_s)).rowcount

    def _transaction(self) -> _Transaction:
        return _Transaction(self.db)


class _Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on an error)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")
