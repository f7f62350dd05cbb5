"""Prepared transactions: the gid of a transaction id, the statements, ``pg_prepared_xacts``.

Every partition's transaction is prepared under the gid ``tph.<txn id>`` (at most 96 of the
200 bytes a gid may have; only ``[A-Za-z0-9_.-]``). Gids are unique in the whole cluster, so the
in-doubt listing is scoped by the gid prefix ``tph.<namespace>.`` *and* the sink's database.
``COMMIT PREPARED`` / ``ROLLBACK PREPARED`` run from any session of the same user (or a
superuser), outside a transaction block (autocommit); a gid the server does not know gives
42704 (undefined_object): committed or rolled back, only the marker row tells which.
"""

from __future__ import annotations

import logging
import re

import psycopg
from psycopg import sql

from sinks.postgres.connection import Connection
from sinks.postgres.errors import UNDEFINED_OBJECT
from twophase import ConfigurationError, Handle, TxnId
from twophase.kit import validate_namespace

log = logging.getLogger(__name__)

GID_PREFIX = "tph."
_GID_RE = re.compile(r"^tph\.[A-Za-z0-9_.-]{1,96}$")


def gid_of(txn_id: TxnId) -> str:
    return f"{GID_PREFIX}{txn_id}"


def gid_of_handle(handle: Handle) -> str:
    """The gid a handle names (recorded at pre-commit, else derived from its id), validated."""
    gid = handle.data.get("gid")
    gid = gid if isinstance(gid, str) else gid_of(handle.txn_id)
    if not _GID_RE.match(gid):
        raise ConfigurationError(f"{gid!r} cannot be a gid written by twophase.",
                                 fix="the handle is damaged or not from twophase; inspect the "
                                 "state file")
    return gid


def prepare(conn: Connection, gid: str) -> None:
    conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))


def resolve(conn: Connection, verb: str, gid: str) -> bool:
    """``COMMIT PREPARED`` / ``ROLLBACK PREPARED`` (``verb``); False if the gid is unknown."""
    statement = {"COMMIT": "COMMIT PREPARED {}", "ROLLBACK": "ROLLBACK PREPARED {}"}[verb]
    try:
        conn.execute(sql.SQL(statement).format(sql.Literal(gid)))
    except psycopg.Error as exc:
        if exc.sqlstate == UNDEFINED_OBJECT:
            return False
        raise
    return True


def prepared_in(conn: Connection, namespace: str) -> list[TxnId]:
    """The transaction ids of ``namespace``'s prepared transactions in this database."""
    prefix = f"{GID_PREFIX}{validate_namespace(namespace)}."
    rows = conn.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
                        "AND starts_with(gid, %s) ORDER BY gid", (prefix,)).fetchall()
    found = []
    for (gid,) in rows:
        try:
            found.append(TxnId.parse(gid[len(GID_PREFIX):]))
        except (ValueError, ConfigurationError):
            log.warning("prepared transaction %r looks like twophase's but does not parse; "
                        "leaving it alone", gid)
    return found
