"""XA: the xid of a transaction, the XA statements, and reading ``XA RECOVER``.

Every partition's branch is named after its transaction id::

    gtrid = "tph." + txn_id.global_part      (namespace.query.epoch.batch, <= 63 bytes)
    bqual = txn_id.branch_part               (partition.attempt.created, <= 32 bytes)

formatID is left at its default: MariaDB ignores it when matching xids, so nothing relies on it.
The namespace filter of ``list_in_doubt`` is the gtrid prefix ``tph.<namespace>.``.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass

import pymysql

from sinks.mysql.connection import Connection, is_mariadb, query
from sinks.mysql.errors import XAER_NOTA, error_code
from twophase import ConfigurationError, Handle, RetryableError, TxnId
from twophase.kit import validate_namespace

log = logging.getLogger(__name__)

XID_PREFIX = "tph."
XID_PART_MAX_BYTES = 64
DETACH_WAIT_S = 2.0  # how long commit/abort wait for a just-closed writer session to end
DETACH_POLL_S = 0.02

# Only these characters ever reach an XA statement. XA statements cannot take ``%s``
# placeholders on every server (they are not preparable), so xids are validated against this
# strict character set and then embedded as single-quoted literals: nothing in the set needs
# escaping in either quoting mode (with or without NO_BACKSLASH_ESCAPES).
_XID_PART_RE = re.compile(rf"^[A-Za-z0-9_.-]{{1,{XID_PART_MAX_BYTES}}}$")
_MARIADB_SQL_XID_RE = re.compile(r"^X'([0-9A-Fa-f]*)',X'([0-9A-Fa-f]*)'(?:,\d+)?$")
_MYSQL_HEX_XID_RE = re.compile(r"^0x([0-9A-Fa-f]*)$")


@dataclass(frozen=True)
class Xid:
    """An XA transaction id restricted to ``[A-Za-z0-9_.-]``, safe to embed in XA statements."""

    gtrid: str
    bqual: str

    def __post_init__(self) -> None:
        for part in (self.gtrid, self.bqual):
            if not _XID_PART_RE.match(part):
                raise ConfigurationError(
                    f"{part!r} cannot be part of an XA xid written by twophase.",
                    fix="the handle is damaged or not from twophase; inspect the state file",
                )

    @classmethod
    def of(cls, txn_id: TxnId) -> Xid:
        return cls(XID_PREFIX + txn_id.global_part, txn_id.branch_part)

    @classmethod
    def of_handle(cls, handle: Handle) -> Xid:
        """The xid a handle names (recorded at pre-commit, else derived from its id)."""
        gtrid, bqual = handle.data.get("gtrid"), handle.data.get("bqual")
        if isinstance(gtrid, str) and isinstance(bqual, str):
            return cls(gtrid, bqual)
        return cls.of(handle.txn_id)

    def txn_id(self) -> TxnId:
        """The transaction id this xid names; ValueError/ConfigurationError if none."""
        if not self.gtrid.startswith(XID_PREFIX):
            raise ValueError(f"gtrid {self.gtrid!r} does not start with {XID_PREFIX!r}")
        return TxnId.from_parts(self.gtrid[len(XID_PREFIX):], self.bqual)

    def sql(self) -> str:
        """The xid as XA statements take it; the parts were validated in ``__post_init__``."""
        return f"'{self.gtrid}','{self.bqual}'"

    def __str__(self) -> str:
        return self.sql()


def namespace_prefix(namespace: str) -> str:
    """The gtrid prefix of every branch of ``namespace``."""
    return f"{XID_PREFIX}{validate_namespace(namespace)}."


def xa(conn: Connection, verb: str, xid: Xid) -> None:
    """``XA <verb> <xid>``: START, END, PREPARE, COMMIT or ROLLBACK."""
    with conn.cursor() as cursor:
        cursor.execute(f"XA {verb} {xid.sql()}")


def recover(conn: Connection) -> list[tuple[bytes, bytes]]:
    """(gtrid, bqual) of every prepared branch on the server, read in each flavour's hex form."""
    if is_mariadb(conn):
        rows, pattern = query(conn, "XA RECOVER FORMAT='SQL'"), _MARIADB_SQL_XID_RE
    else:
        rows, pattern = query(conn, "XA RECOVER CONVERT XID"), _MYSQL_HEX_XID_RE
    xids = []
    for _format_id, gtrid_length, _bqual_length, data in rows:
        text = data.decode("ascii") if isinstance(data, bytes) else str(data)
        match = pattern.match(text)
        if match is None:
            log.warning("XA RECOVER returned an xid this sink cannot read: %r", text)
            continue
        raw = b"".join(bytes.fromhex(group) for group in match.groups())
        xids.append((raw[:gtrid_length], raw[gtrid_length:]))
    return xids


def prepared_in(conn: Connection, namespace: str) -> list[Xid]:
    """The xids of ``namespace``'s prepared branches; foreign or damaged ones are skipped."""
    prefix = namespace_prefix(namespace).encode()
    found = []
    for gtrid, bqual in recover(conn):
        if not gtrid.startswith(prefix):
            continue
        try:
            xid = Xid(gtrid.decode("ascii"), bqual.decode("ascii"))
            xid.txn_id()
        except (ValueError, ConfigurationError):
            log.warning("prepared XA branch %r,%r looks like twophase's but does not parse; "
                        "leaving it alone", gtrid, bqual)
            continue
        found.append(xid)
    return found


def is_prepared(conn: Connection, xid: Xid) -> bool:
    return (xid.gtrid.encode(), xid.bqual.encode()) in recover(conn)


def resolve(conn: Connection, verb: str, xid: Xid, *, where: str) -> bool:
    """``XA COMMIT``/``XA ROLLBACK``; False if the server does not know the xid (1397).

    A 1397 while ``XA RECOVER`` still lists the branch means the session that prepared it has
    not ended yet: its writer closed the connection a moment ago and the server is still
    tearing the session down. That resolves within milliseconds, so wait for it (up to
    ``DETACH_WAIT_S``) before calling it a retryable error.
    """
    deadline = time.monotonic() + DETACH_WAIT_S
    while True:
        try:
            xa(conn, verb, xid)
            return True
        except pymysql.err.MySQLError as exc:
            if error_code(exc) != XAER_NOTA:
                raise
        if not is_prepared(conn, xid):
            return False
        if time.monotonic() > deadline:
            raise RetryableError(
                f"XA branch {xid} is prepared on {where} but still attached to the session "
                f"that prepared it after {DETACH_WAIT_S:.0f}s, so no other session can resolve "
                "it (MariaDB does not detach prepared branches).",
                fix="retried automatically; it resolves when that session disconnects",
            )
        time.sleep(DETACH_POLL_S)
