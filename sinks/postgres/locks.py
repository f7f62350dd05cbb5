"""Who holds the lock a writer waited for, when its wait ran out (SQLSTATE 55P03 after
``lock_timeout``), and what that means.

A wait is bounded (:data:`~sinks.postgres.connection.DEFAULT_LOCK_TIMEOUT_S`); when it runs
out, the writer's error names the holder, found in a session of its own (the writer's
transaction is gone by then):

1. the tuple waited for, when the server's CONTEXT names it (``while locking tuple (0,1) in
   relation "t"``: a row that exists): its ``xmax`` is the holder's transaction, matched in
   ``pg_prepared_xacts`` and ``pg_stat_activity``;
2. else (a key being inserted, whose holder's row is invisible): every transaction holding
   locks on the written tables (``pg_locks``), one of which holds the key: the prepared ones
   of the writer's own batch first (where a batch is not routed by key, the likely cause; in
   a routed batch, they hold other keys).

=================================  ===========================================================
holder                             what the error says
=================================  ===========================================================
a prepared transaction of this     :class:`FatalError`: a key of the batch is written by two
query's batch (same epoch)         tasks, the stream is not routed by key; retrying waits
                                   again, as only the decision, which waits for this task,
                                   releases it
another prepared transaction of    retryable: an undecided orphan (an earlier batch, run or
this namespace                     query); the driver's sweep or ``python -m
                                   twophase.cleanup`` aborts it, ``python -m twophase.status``
                                   lists it
another prepared transaction       retryable: not this namespace's; resolve it by its gid
another session                    retryable: its pid, application_name, user and how long
                                   its transaction has been open
nobody found (it ended meanwhile)  retryable, with :data:`~sinks.postgres.errors.FIX_LOCKS`
=================================  ===========================================================
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg

from sinks.postgres.connection import Connection, Server
from sinks.postgres.errors import (
    LOCK_NOT_AVAILABLE,
    SYSTEM,
    UNPREPARED_NOTE,
    classify,
    error_code,
)
from sinks.postgres.prepared import GID_PREFIX
from sinks.postgres.schema import Table
from twophase import ConfigurationError, FatalError, RetryableError, TwoPhaseError, TxnId

log = logging.getLogger(__name__)

#: The CONTEXT of a wait on an existing row: the tuple's ctid and its table's name.
_TUPLE_WAIT = re.compile(
    r'while (?:locking|updating|deleting) tuple \((\d+),(\d+)\) in relation "([^"]+)"')

_PREPARED_HOLDERS = """
SELECT p.gid, NULL::int, p.owner::text, '', p.prepared, '' FROM pg_prepared_xacts p
 WHERE p.database = current_database() AND {which}"""
_SESSION_HOLDERS = """
SELECT NULL, a.pid, a.application_name, a.usename::text, a.xact_start, a.state
  FROM pg_stat_activity a WHERE a.pid <> pg_backend_pid() AND {which}"""
_BY_XID = "transaction = %(xid)s::xid", "backend_xid = %(xid)s::xid"
_BY_TABLES = (
    "EXISTS (SELECT 1 FROM pg_locks x JOIN pg_locks r ON r.virtualtransaction = "
    "x.virtualtransaction AND r.locktype = 'relation' AND r.granted WHERE x.locktype = "
    "'transactionid' AND x.transactionid = p.transaction AND x.pid IS NULL AND r.relation IN "
    "(SELECT to_regclass(n) FROM unnest(%(tables)s::text[]) n))",
    "EXISTS (SELECT 1 FROM pg_locks r WHERE r.pid = a.pid AND r.locktype = 'relation' AND "
    "r.granted AND r.relation IN (SELECT to_regclass(n) FROM unnest(%(tables)s::text[]) n))")


@dataclass(frozen=True)
class Holder:
    """A transaction holding a lock: prepared (``gid``) or of a session (``pid``)."""

    gid: str | None
    pid: int | None
    name: str  # the session's application_name, or the prepared transaction's owner
    user: str
    since: dt.datetime | None
    state: str

    def txn_id(self) -> TxnId | None:
        """The twophase transaction a prepared holder is, if it is one."""
        if self.gid is None or not self.gid.startswith(GID_PREFIX):
            return None
        try:
            return TxnId.parse(self.gid[len(GID_PREFIX):])
        except (ValueError, ConfigurationError):
            return None


@dataclass(frozen=True)
class Holders:
    """The holders found: of the row waited for (``exact``), else of locks on the tables."""

    found: list[Holder]
    exact: bool


def lock_holders(conn: Connection, tables: Sequence[Table], context: str | None,
                 txn_id: TxnId) -> Holders:
    """The holders of the lock a writer of ``txn_id`` waited for on ``tables`` (see the
    module docstring for how they are found)."""
    if (xid := _tuple_holder_xid(conn, tables, context)) is not None and (
            found := _holders(conn, _BY_XID, {"xid": xid})):
        return Holders(found, exact=True)
    holding = _holders(conn, _BY_TABLES, {"tables": [str(table) for table in tables]})
    return Holders(sorted(holding, key=lambda holder: not _same_batch(holder, txn_id)),
                   exact=False)


def _tuple_holder_xid(conn: Connection, tables: Sequence[Table], context: str | None
                      ) -> str | None:
    match = _TUPLE_WAIT.search(context or "")
    table = next((t for t in tables if match and t.name == match[3]), None)
    if match is None or table is None:
        return None
    row = conn.execute(psycopg.sql.SQL("SELECT xmax::text FROM {} WHERE ctid = %s::tid").format(
        table.ident), (f"({match[1]},{match[2]})",)).fetchone()
    return row[0] if row and row[0] != "0" else None


def _holders(conn: Connection, which: tuple[str, str], params: dict[str, object]
             ) -> list[Holder]:
    prepared, session = which
    statement = (_PREPARED_HOLDERS.format(which=prepared) + " UNION ALL "
                 + _SESSION_HOLDERS.format(which=session) + " ORDER BY 5")
    return [Holder(*row) for row in conn.execute(statement, params).fetchall()]


def _same_batch(holder: Holder, txn_id: TxnId) -> bool:
    """Whether ``holder`` is another task's prepared transaction of ``txn_id``'s batch."""
    other = holder.txn_id()
    return other is not None and other != txn_id and (
        other.namespace, other.query, other.epoch, other.batch) == (
        txn_id.namespace, txn_id.query, txn_id.epoch, txn_id.batch)


def lock_wait_error(exc: BaseException, what: str, holders: Holders, tables: Sequence[Table],
                    txn_id: TxnId) -> TwoPhaseError:
    """The writer's error for a lock wait that ran out, naming ``holders`` (module
    docstring): the cause and the fix of each kind of holder."""
    if not holders.found:
        error = classify(exc, what)
        return RetryableError(f"{error.cause} Nobody holds a lock on {_names(tables)} any "
                              f"more. {UNPREPARED_NOTE}", fix=error.fix)
    told = [_told(holder, txn_id) for holder in holders.found]
    detail = "; ".join(cause for cause, _fix, _fatal in told)
    fixes = "; ".join(dict.fromkeys(fix for _cause, fix, _fatal in told))
    held = (f"a lock held by {detail}" if holders.exact else
            f"a lock on a key in {_names(tables)}; locks on them are held by {detail}")
    cause = (f"{SYSTEM}: {what} failed: [{LOCK_NOT_AVAILABLE}] it waited lock_timeout for "
             f"{held}.")
    if any(fatal for _cause, _fix, fatal in told):
        return FatalError(cause, fix=fixes)
    return RetryableError(f"{cause} {UNPREPARED_NOTE}", fix=fixes)


def _names(tables: Sequence[Table]) -> str:
    return str(tables[0]) if len(tables) == 1 else f"one of {', '.join(map(str, tables))}"


def _told(holder: Holder, txn_id: TxnId) -> tuple[str, str, bool]:
    """What ``holder`` is, what to do about it, and whether retrying cannot help."""
    since = f"{holder.since:%Y-%m-%d %H:%M:%S%z}" if holder.since else "an unknown time"
    if holder.gid is None:
        return (f"session pid {holder.pid} (application_name {holder.name!r}, user "
                f"{holder.user!r}, {holder.state or 'state unknown'}, in a transaction since "
                f"{since})",
                f"end that client's transaction (SELECT pg_terminate_backend({holder.pid}) if "
                "it is stuck), or raise lock_timeout_s", False)
    other = holder.txn_id()
    if other is not None and _same_batch(holder, txn_id):
        return (f"prepared transaction {holder.gid}, a prepared transaction of this query "
                f"(batch {other.batch}, task {other.partition}): a key of the batch is written "
                "by two tasks, so the stream is not routed by key (route_by_key=False with a "
                "stream that is not keyed?)",
                "let twophase.spark route the rows by key (route_by_key=True, the default, or "
                "a number of partitions), or key the stream so that each key of a batch stays "
                "in one partition; the batch's prepared transactions are aborted when the "
                "query fails or restarts", True)
    if other is not None and other.namespace == txn_id.namespace:
        return (f"prepared transaction {holder.gid} (prepared {since}), an undecided orphan "
                f"of namespace {other.namespace} (batch {other.batch} of query {other.query})",
                "the driver's next sweep aborts it; else run `python -m twophase.cleanup` "
                "(`python -m twophase.status` lists it)", False)
    return (f"prepared transaction {holder.gid} (owner {holder.name!r}, prepared {since}), "
            f"not of namespace {txn_id.namespace}",
            f"resolve it: COMMIT PREPARED or ROLLBACK PREPARED '{holder.gid}' (a twophase "
            "transaction: `python -m twophase.cleanup` of its own query)", False)


def classify_lock_wait(server: Server, tables: Sequence[Table], txn_id: TxnId,
                       exc: BaseException, what: str) -> TwoPhaseError | None:
    """:func:`lock_wait_error` for a lock wait that ran out (None for another error); the
    holders looked up in a session of its own (none found if that fails)."""
    if error_code(exc) != LOCK_NOT_AVAILABLE:
        return None
    context = getattr(getattr(exc, "diag", None), "context", None)
    holders = Holders([], exact=False)
    try:
        with server.session("looking up who holds a lock") as conn:
            holders = lock_holders(conn, tables, context, txn_id)
    except (TwoPhaseError, psycopg.Error) as lookup:
        log.warning("could not look up who holds the lock %s waited for: %s", txn_id, lookup)
    return lock_wait_error(exc, what, holders, tables, txn_id)
