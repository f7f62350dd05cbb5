"""``mode="keyed"`` on MySQL: a task's changes applied under row locks inside its XA branch, the
newest version of each key winning, deletes remembered in a tombstone table (the rules:
:mod:`twophase._keyed`).

Each chunk of a branch's rows (chunk by chunk is right: every step is guarded by the version,
and a later chunk reads what an earlier one wrote in the same branch):

====  ===============================================  ========================================
step  statements                                       why
====  ===============================================  ========================================
1     (Python) :meth:`~twophase.kit.Keyed.reduce`      one change per key: its newest
2     ``SELECT key, version ... FORCE INDEX (key)      the version each key holds, as row or
      WHERE key IN (...) FOR UPDATE`` on the target,   as tombstone, locked until the decision
      the same on the tombstone table, 500 keys a
      statement (:data:`KEYS_PER_READ`)
3     (Python) :func:`~twophase.kit.newer_than`        late and repeated changes dropped
4     multi-row ``INSERT ... ON DUPLICATE KEY UPDATE   the upserts, each assignment guarded by
      c = IF(newer, VALUES(c), c), ..., version =      the version, the version assigned last
      IF(newer, VALUES(version), version)``            (MySQL assigns left to right)
5     ``DELETE FROM target WHERE key = ... AND         the deletes, one key per statement
      (version < ...)``
6     ``INSERT ... ON DUPLICATE KEY UPDATE`` into the  the deletes' tombstones (of keys the
      tombstone table, guarded alike                   target never held too)
7     ``DELETE FROM tombstones WHERE key = ... AND     the tombstones of keys inserted again
      (version < ...)``
====  ===============================================  ========================================

Why the guards in SQL although step 2 locked the rows: under READ COMMITTED a locking read of an
absent key locks nothing, so another session may insert it before step 4. Why ``FORCE INDEX``
and a DELETE per key (measured, MariaDB 10.11): on a small table the optimizer reads ``key IN
(...)`` by scanning the whole table, even on the primary key, and a locking scan waits for every
row another task's prepared branch holds, READ COMMITTED or not; a single-table DELETE takes no
index hint, and one of a multi-table DELETE did not stop the wait either. A DELETE's version
guard is wrapped (``COALESCE(version < %s, TRUE)``) so that no index of the version can serve
it: the optimizer chose a range of such an index over the key's single row, scanning rows other
branches hold (measured on the tombstones' ``deleted_at`` index).

The branches run READ COMMITTED (:meth:`KeyedTables.begin`): under REPEATABLE READ the locking
read of an absent key (a delete of a key the table never held, the insert of a new one) locks
the gap around it, so a task inserting a neighbouring key waits for this task: on MariaDB 10.11
until its branch is prepared (XA PREPARE releases gap locks there: measured), on MySQL 8 until
the batch's decision, which waits for the waiting task (MySQL releases gap locks at prepare
under READ COMMITTED only: its source, not measured here). A server logging statements
(``binlog_format=STATEMENT``) refuses InnoDB writes under READ COMMITTED (1665, classified in
:mod:`sinks.mysql.errors`); ``ROW`` and ``MIXED`` (MariaDB's default) work. With the key a
secondary UNIQUE key rather than the PRIMARY KEY, InnoDB's duplicate checks still lock gaps of
that index: neighbouring new keys of two tasks may wait for each other's prepared branch until
``lock_wait_timeout_s``.

The tombstone table ``_twophase_tombstones_<table>``
(:func:`~twophase.kit.sql.tombstone_table_name`, 64 characters at most) sits in the target's
database: the key columns and the version column with
the target's own types (``CREATE TABLE ... SELECT ... LIMIT 0``), the key its primary key, and
``deleted_at`` (UTC), indexed for :meth:`KeyedTables.purge`.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pymysql

from sinks.mysql.bulk import insert_rows
from sinks.mysql.connection import Connection, query
from sinks.mysql.encoding import utc_naive
from sinks.mysql.errors import LOCK_WAIT_TIMEOUT, error_code
from sinks.mysql.schema import (
    Table,
    check_columns,
    column_list,
    key_index,
    quote_identifier,
    table_engine,
)
from twophase import Column, SchemaMismatchError
from twophase.kit import Change, Keyed, newer_than
from twophase.kit.sql import TOMBSTONE_TIME_COLUMN, tombstone_table_name

log = logging.getLogger(__name__)

#: The longest table name MySQL and MariaDB take.
MAX_NAME_LENGTH = 64
PRIMARY = "PRIMARY"
READ_COMMITTED = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"
#: The tombstone table of a target (``{table}`` left for :func:`sinks.mysql.schema.create_missing`).
TOMBSTONE_TABLE_DDL = """CREATE TABLE IF NOT EXISTS {{table}} (
  {deleted_at} DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) COMMENT 'the delete (UTC)',
  PRIMARY KEY ({key}),
  KEY by_deleted_at ({deleted_at})
) ENGINE=InnoDB COMMENT='twophase: the version of each deleted key (mode=keyed)'
SELECT {columns} FROM {target} LIMIT 0"""
#: Keys per locking read of their versions. MariaDB turns an ``IN`` list of
#: ``in_predicate_conversion_threshold`` (1,000) values or more into a join with a table of
#: them, which reads the key's index as a scan and waits for every row another task's prepared
#: branch holds: measured, a second task of a routed batch then waited out its lock timeout.
KEYS_PER_READ = 500
#: Tombstones read per page of a purge.
PURGE_CHUNK = 1_000

#: The version each key holds: key values -> version.
Versions = dict[tuple[Any, ...], Any]


@dataclass(frozen=True)
class KeyedTables:
    """The keyed mode of one target: its key, version and delete marker columns (``keyed``),
    the target, and the table of its tombstones."""

    keyed: Keyed
    target: Table
    tombstones: Table

    @classmethod
    def of(cls, keyed: Keyed, target: Table) -> KeyedTables:
        name = tombstone_table_name(target.name, MAX_NAME_LENGTH)
        return cls(keyed, target, Table(target.database, name))

    @property
    def stamp(self) -> tuple[str, ...]:
        """The columns a tombstone takes from its delete: the key and the version."""
        return (*self.keyed.key, self.keyed.version)

    def ddl(self) -> str:
        """The tombstone table's DDL, ``{table}`` in it (every other brace doubled)."""
        return TOMBSTONE_TABLE_DDL.format(
            deleted_at=_braced(quote_identifier(TOMBSTONE_TIME_COLUMN)),
            key=_braced(column_list(self.keyed.key)), columns=_braced(column_list(self.stamp)),
            target=_braced(str(self.target)))

    def check(self, conn: Connection, written: Sequence[Column], *, where: str) -> None:
        """Refuse a tombstone table made for another key or version (by an earlier run with
        other options, or by hand): it must have the key, as its PRIMARY or UNIQUE key, the
        version and ``deleted_at``. ``written``: the columns written into the target."""
        stamp = [column for column in written if column.name in self.stamp]
        check_columns(conn, self.tombstones, [*stamp, Column(TOMBSTONE_TIME_COLUMN, "timestamp")],
                      upsert_key=self.keyed.key,
                      where=f"tombstone table {self.tombstones} of {where}")

    # -- executor ------------------------------------------------------------------------------

    def begin(self, conn: Connection) -> str:
        """Set a writer's session up before ``XA START``: READ COMMITTED (see the module
        docstring); returns the name of the key's index (SchemaMismatchError if none)."""
        query(conn, READ_COMMITTED)
        index = key_index(conn, self.target, self.keyed.key)
        if index is None:
            raise SchemaMismatchError(
                f"table {self.target} has no PRIMARY or UNIQUE key of exactly the columns "
                f"{list(self.keyed.key)} (mode='keyed' locks and updates rows by it).",
                fix=f"create a unique index on ({', '.join(self.keyed.key)}), or name the "
                    "table's key in key=")
        return index

    def apply(self, conn: Connection, rows: Iterable[Sequence[Any]], columns: Sequence[str],
              *, index: str, what: str) -> int:
        """One chunk of rows applied in the caller's branch (the steps of the module
        docstring); returns how many changes were newer than what the keys held."""
        changes = [comparable(change) for change in self.keyed.reduce(rows, columns)]
        if not changes:
            return 0
        keys = [change.key for change in changes]
        held = self._versions(conn, self.target, index, keys)
        buried = self._versions(conn, self.tombstones, PRIMARY, keys)
        fresh = newer_than(changes, newest(held, buried))
        upserts = [change for change in fresh if not change.deleted]
        deletes = [change for change in fresh if change.deleted]
        self._upsert(conn, self.keyed.written(columns), upserts, what)
        self._delete(conn, self.target, deletes)
        self._bury(conn, deletes, what)
        self._delete(conn, self.tombstones, [c for c in upserts if c.key in buried])
        log.debug("%s: %d of %d changes newer (%d deletes)", what, len(fresh), len(changes),
                  len(deletes))
        return len(fresh)

    def _versions(self, conn: Connection, table: Table, index: str,
                  keys: Sequence[tuple[Any, ...]]) -> Versions:
        """The version ``table`` holds for each of ``keys`` it has, its rows locked; read
        :data:`KEYS_PER_READ` keys at a time (see the constant)."""
        width = len(self.keyed.key)
        found: Versions = {}
        for start in range(0, len(keys), KEYS_PER_READ):
            page = keys[start:start + KEYS_PER_READ]
            rows = query(conn, f"SELECT {column_list(self.stamp)} FROM {table} "
                               f"FORCE INDEX ({quote_identifier(index)}) "
                               f"WHERE {_keys_in(self.keyed.key, len(page))} FOR UPDATE",
                         [value for key in page for value in key])
            found.update((tuple(row[:width]), row[width]) for row in rows)
        return found

    def _upsert(self, conn: Connection, written: Sequence[str], upserts: Sequence[Change],
                what: str) -> None:
        if not upserts:
            return
        kept = {*self.keyed.key, self.keyed.version}
        assignments = {c: f"VALUES({quote_identifier(c)})" for c in written if c not in kept}
        insert_rows(conn, self.target, written, [change.row or () for change in upserts],
                    upsert=True, on_duplicate=newer_wins(assignments, self.keyed.version),
                    what=what)

    def _bury(self, conn: Connection, deletes: Sequence[Change], what: str) -> None:
        """The deletes' tombstones: inserted, or raised to the delete's version."""
        if not deletes:
            return
        stamped = {TOMBSTONE_TIME_COLUMN: "UTC_TIMESTAMP(6)"}
        insert_rows(conn, self.tombstones, self.stamp,
                    [(*change.key, change.version) for change in deletes], upsert=True,
                    on_duplicate=newer_wins(stamped, self.keyed.version),
                    what=f"{what} (tombstones in {self.tombstones})")

    def _delete(self, conn: Connection, table: Table, changes: Sequence[Change]) -> None:
        """Delete each change's key from ``table`` where it holds an older version (one key per
        statement, see the module docstring)."""
        if not changes:
            return
        older = f"{quote_identifier(self.keyed.version)} < %s"
        with conn.cursor() as cursor:
            cursor.executemany(f"DELETE FROM {table} WHERE {_key_is(self.keyed.key)} AND "
                               f"{_unindexed(older, null=True)}",
                               [(*change.key, change.version) for change in changes])

    # -- driver: status and purge --------------------------------------------------------------

    def count(self, conn: Connection) -> tuple[int, dt.datetime | None]:
        """How many tombstones there are, and the oldest one's ``deleted_at`` (UTC)."""
        if table_engine(conn, self.tombstones) is None:
            return 0, None
        count, oldest = query(conn, f"SELECT COUNT(*), MIN({_deleted_at()}) "
                                    f"FROM {self.tombstones}")[0]
        return int(count), None if oldest is None else oldest.replace(tzinfo=dt.UTC)

    def purge(self, conn: Connection, older_than: dt.datetime) -> int:
        """Delete the tombstones of deletes before ``older_than`` (naive = UTC), oldest first.

        Reads candidates without locks, then deletes them one key at a time, each still older
        than the cutoff; a tombstone a prepared branch holds (it changes it) is left once the
        session's lock wait runs out (the committer gives this session a short one), and a page
        of such tombstones ends the purge: the next one takes them.
        """
        if table_engine(conn, self.tombstones) is None:
            return 0
        cutoff = utc_naive(older_than)
        purged = 0
        while True:
            page = query(conn, f"SELECT {column_list(self.keyed.key)} FROM {self.tombstones} "
                               f"WHERE {_deleted_at()} < %s ORDER BY {_deleted_at()} "
                               f"LIMIT {PURGE_CHUNK}", (cutoff,))
            done = sum(self._purge_one(conn, tuple(key), cutoff) for key in page)
            purged += done
            if len(page) < PURGE_CHUNK or not done:
                return purged

    def _purge_one(self, conn: Connection, key: tuple[Any, ...], cutoff: dt.datetime) -> int:
        try:
            with conn.cursor() as cursor:
                return int(cursor.execute(
                    f"DELETE FROM {self.tombstones} WHERE {_key_is(self.keyed.key)} AND "
                    f"{_unindexed(f'{_deleted_at()} < %s', null=False)}", (*key, cutoff)))
        except pymysql.err.MySQLError as exc:
            if error_code(exc) != LOCK_WAIT_TIMEOUT:
                raise
            log.info("tombstone %s of %s is locked by a transaction (a prepared XA branch?): "
                     "left for the next purge", key, self.tombstones)
            return 0


def newer_wins(assignments: Mapping[str, str], version: str) -> str:
    """``ON DUPLICATE KEY UPDATE`` assignments that apply only when the new row's ``version`` is
    newer than the stored one (or the stored one is NULL): each column of ``assignments``
    (name -> SQL of its new value), then the version itself, last, since MySQL assigns from
    left to right and later assignments see earlier ones."""
    held = quote_identifier(version)
    newer = f"{held} IS NULL OR VALUES({held}) > {held}"
    pairs = [*((quote_identifier(c), value) for c, value in assignments.items()),
             (held, f"VALUES({held})")]
    return ", ".join(f"{column} = IF({newer}, {value}, {column})" for column, value in pairs)


def newest(*versions: Versions) -> Versions:
    """The newest non-NULL version of each key among ``versions``."""
    found: Versions = {}
    for held in versions:
        for key, version in held.items():
            if version is not None and (key not in found or version > found[key]):
                found[key] = version
    return found


def comparable(change: Change) -> Change:
    """``change`` with its key and version as the server returns them (an instant as its
    naive UTC time: every session is in UTC; binary as bytes), so that they compare with what
    it read. Its row is sent as it is (the INSERT's conversions do the same)."""
    return Change(tuple(map(_as_stored, change.key)), _as_stored(change.version), change.row)


def _as_stored(value: Any) -> Any:
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return utc_naive(value)
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return value


def _keys_in(key: Sequence[str], count: int) -> str:
    """``key IN (%s, ...)``, or ``(k1, k2) IN ((%s, %s), ...)`` for a composite key."""
    if len(key) == 1:
        return f"{quote_identifier(key[0])} IN ({', '.join(['%s'] * count)})"
    one = f"({', '.join(['%s'] * len(key))})"
    return f"({column_list(key)}) IN ({', '.join([one] * count)})"


def _key_is(key: Sequence[str]) -> str:
    return " AND ".join(f"{quote_identifier(column)} = %s" for column in key)


def _unindexed(condition: str, *, null: bool) -> str:
    """``condition`` (``null``: its value where it is NULL) in a form no index can serve, so
    that a DELETE finds its row by the key's index alone: read by an index of the version or
    of ``deleted_at`` it would scan, and wait for, rows other branches hold."""
    return f"COALESCE({condition}, {'TRUE' if null else 'FALSE'})"


def _deleted_at() -> str:
    return quote_identifier(TOMBSTONE_TIME_COLUMN)


def _braced(sql: str) -> str:
    """``sql`` with its braces doubled, to pass through ``str.format`` unchanged."""
    return sql.replace("{", "{{").replace("}", "}}")
