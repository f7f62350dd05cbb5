"""``mode="keyed"`` on MySQL: a task's changes applied under row locks inside its XA branch, the
newest version of each key winning, deletes remembered in a tombstone table (the rules:
:mod:`twophase._keyed`).

A branch's rows are reduced across its chunks to the newest change of each key and applied
set-based every :data:`~twophase.kit.HELD_CHUNKS` ``* chunk_size`` keys and at the end, by
statements over the branch's temporary table ``_twophase_changes`` (part by part is right: every
step is guarded by the version, and a later part reads what an earlier one wrote in the same
branch):

====  ===============================================  ========================================
step  statements                                       why
====  ===============================================  ========================================
1     (Arrow, or Python for ``write``'s rows)           one change per key: its newest, the
      :meth:`~twophase.kit.Keyed.newest_in_tables`      delete marker read into a flag
2     ``LOAD DATA`` (``INSERT`` with ``bulk=            the changes into the branch's temporary
      "insert"``) into ``_twophase_changes``            table (emptied first)
3     ``SELECT COUNT(*) FROM changes STRAIGHT_JOIN      the keys' rows and tombstones locked
      target FORCE INDEX (key) ... FOR UPDATE``; the    until the decision (a locking read sees
      same on the tombstone table                       and waits for another branch's
                                                        uncommitted row of the key too)
4     ``DELETE c FROM changes c STRAIGHT_JOIN target    late and repeated changes dropped: not
      t ... WHERE t.version >= c.version``; the same    newer than the key's row or tombstone
      with the tombstones
5     ``DELETE t FROM changes c STRAIGHT_JOIN target    the deletes
      t ... WHERE c.deleted``
6     ``INSERT INTO tombstones ... SELECT ... WHERE     the deletes' tombstones (of keys the
      deleted ON DUPLICATE KEY UPDATE`` (guarded)       target never held too)
7     ``DELETE b FROM changes c STRAIGHT_JOIN           the tombstones of keys written again
      tombstones b ... WHERE NOT c.deleted``
8     ``INSERT INTO target ... SELECT ... WHERE NOT     the upserts, each assignment guarded by
      deleted ON DUPLICATE KEY UPDATE c = IF(newer,     the version, the version assigned last
      VALUES(c), c), ..., version = IF(newer,           (MySQL assigns left to right)
      VALUES(version), version)``
====  ===============================================  ========================================

Why ``STRAIGHT_JOIN`` and ``FORCE INDEX`` (measured, MariaDB 10.11): every statement that reads
the target or the tombstones must reach them from the changes, one key's row by the key's index
(``eq_ref``). Left to itself, the optimizer reads ``key IN (...)`` of a small table by scanning
it, even on the primary key, and a locking scan waits for every row another task's prepared
branch holds, READ COMMITTED or not; a single-table DELETE takes no index hint. The upsert's
guard stays in SQL although step 3 locked the rows: it is what makes a step idempotent where a
key is absent (a locking read of an absent key locks nothing under READ COMMITTED).

The temporary table is the session's own (created before ``XA START``, of the target's written
columns, every one nullable, and the flag; indexed by the key but not unique on it, so that keys
the collation takes as one, ``'a'`` and ``'A'``, both load and the version decides): MariaDB
10.11 accepts its use inside an XA branch and its prepare (measured); the sink's user needs
``CREATE TEMPORARY TABLES`` on the database (checked by ``check_schema``). MySQL 8 refuses a
temporary table *created* inside an XA transaction; this one is created outside (not measured on
MySQL 8 here). Versions compare as the server compares them: a string version under its
column's collation.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pymysql

from sinks.mysql.bulk import insert_selected
from sinks.mysql.connection import Connection, query
from sinks.mysql.encoding import utc_naive
from sinks.mysql.errors import DATABASE_ACCESS_DENIED, LOCK_WAIT_TIMEOUT, error_code
from sinks.mysql.schema import (
    Table,
    check_columns,
    column_list,
    key_index,
    quote_identifier,
    quote_user,
    table_engine,
)
from twophase import Column, ConfigurationError, SchemaMismatchError
from twophase.kit import DELETED_FLAG, Keyed
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
#: The session's temporary table of a chunk's changes (see the module docstring).
CHANGES_TABLE = "_twophase_changes"
#: Tombstones read per page of a purge.
PURGE_CHUNK = 1_000

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

    def check_changes_table(self, conn: Connection, written: Sequence[str], user: str) -> None:
        """Create (and drop) the temporary table a writer makes: refuse a user without
        ``CREATE TEMPORARY TABLES`` on the target's database, naming the grant."""
        try:
            query(conn, self.changes_ddl(written))
        except pymysql.err.MySQLError as exc:
            if error_code(exc) != DATABASE_ACCESS_DENIED:
                raise
            database = quote_identifier(self.target.database)
            raise ConfigurationError(
                f"user {user!r} lacks CREATE TEMPORARY TABLES ON {database}.* (mode='keyed' "
                "applies each chunk of changes from a temporary table of its session).",
                fix=f"GRANT CREATE TEMPORARY TABLES ON {database}.* TO {quote_user(user)} "
                    "(docs/sinks/mysql.md, 'Grants', lists what the sink needs)") from exc
        query(conn, f"DROP TEMPORARY TABLE {self.changes}")

    # -- executor ------------------------------------------------------------------------------

    def begin(self, conn: Connection, written: Sequence[str]) -> str:
        """Set a writer's session up before ``XA START``: READ COMMITTED (see the module
        docstring) and the temporary table of the changes (of the ``written`` columns); returns
        the name of the key's index (SchemaMismatchError if none)."""
        query(conn, READ_COMMITTED)
        index = key_index(conn, self.target, self.keyed.key)
        if index is None:
            raise SchemaMismatchError(
                f"table {self.target} has no PRIMARY or UNIQUE key of exactly the columns "
                f"{list(self.keyed.key)} (mode='keyed' locks and updates rows by it).",
                fix=f"create a unique index on ({', '.join(self.keyed.key)}), or name the "
                    "table's key in key=")
        query(conn, self.changes_ddl(written))
        return index

    def changes_ddl(self, written: Sequence[str]) -> str:
        """The session's temporary table of a chunk's changes: the target's ``written`` columns
        (their types, every one nullable: a delete carries only its key and version), the
        delete flag, an index of the key."""
        picked = ", ".join(f"t.{quote_identifier(c)}" for c in written)
        return (f"CREATE TEMPORARY TABLE {self.changes} ({quote_identifier(DELETED_FLAG)} "
                f"BOOLEAN NOT NULL DEFAULT FALSE, KEY ({column_list(self.keyed.key)})) "
                f"SELECT {picked} FROM (SELECT 1) AS one LEFT JOIN {self.target} AS t ON FALSE "
                "LIMIT 0")

    @property
    def changes(self) -> Table:
        """The session's temporary table of a chunk's changes (in the target's database)."""
        return Table(self.target.database, CHANGES_TABLE)

    def clear(self, conn: Connection) -> None:
        """Empty the temporary table before a chunk is loaded into it."""
        query(conn, f"DELETE FROM {self.changes}")

    def apply(self, conn: Connection, written: Sequence[str], *, loaded: int, index: str,
              what: str) -> int:
        """Apply the ``loaded`` changes of the temporary table in the caller's branch (steps 3
        to 8 of the module docstring; a step over rows or tombstones the keys do not have is
        left out); returns how many were newer than what the keys held."""
        flag = quote_identifier(DELETED_FLAG)
        version = quote_identifier(self.keyed.version)
        target = self._joined(self.target, index)
        tombstones = self._joined(self.tombstones, PRIMARY)
        rows, buried = (self._locked(conn, joined) for joined in (target, tombstones))
        stale = sum(self._drop_stale(conn, joined, version)
                    for joined, held in ((target, rows), (tombstones, buried)) if held)
        if rows:
            query(conn, f"DELETE t FROM {target} WHERE c.{flag}")
        insert_selected(conn, self.tombstones,
                        f"SELECT {column_list(self.stamp)} FROM {self.changes} WHERE {flag}",
                        columns=self.stamp, what=f"{what} (tombstones in {self.tombstones})",
                        on_duplicate=newer_wins({TOMBSTONE_TIME_COLUMN: "UTC_TIMESTAMP(6)"},
                                                self.keyed.version, self.tombstones))
        if buried:
            query(conn, f"DELETE t FROM {tombstones} WHERE NOT c.{flag}")
        kept = {*self.keyed.key, self.keyed.version}
        assignments = {c: f"VALUES({quote_identifier(c)})" for c in written if c not in kept}
        insert_selected(conn, self.target,
                        f"SELECT {column_list(written)} FROM {self.changes} WHERE NOT {flag}",
                        columns=written, what=what,
                        on_duplicate=newer_wins(assignments, self.keyed.version, self.target))
        log.debug("%s: %d of %d changes newer", what, loaded - stale, loaded)
        return loaded - stale

    @staticmethod
    def _locked(conn: Connection, joined: str) -> int:
        """Lock the rows of the changes' keys in the joined table; how many there are."""
        return int(query(conn, f"SELECT COUNT(*) FROM {joined} FOR UPDATE")[0][0])

    @staticmethod
    def _drop_stale(conn: Connection, joined: str, version: str) -> int:
        """Delete the changes not newer than the joined table's row of their key; how many."""
        with conn.cursor() as cursor:
            return int(cursor.execute(
                f"DELETE c FROM {joined} WHERE t.{version} >= c.{version}"))

    def _joined(self, table: Table, index: str) -> str:
        """The temporary table ``c`` joined to ``table`` as ``t``, one key's row by ``index``
        (see the module docstring)."""
        same = " AND ".join(f"t.{quote_identifier(k)} = c.{quote_identifier(k)}"
                            for k in self.keyed.key)
        return (f"{self.changes} AS c STRAIGHT_JOIN {table} AS t "
                f"FORCE INDEX ({quote_identifier(index)}) ON {same}")

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


def newer_wins(assignments: Mapping[str, str], version: str, table: Table) -> str:
    """``ON DUPLICATE KEY UPDATE`` assignments that apply only when the new row's ``version`` is
    newer than the stored one (or the stored one is NULL): each column of ``assignments``
    (name -> SQL of its new value), then the version itself, last, since MySQL assigns from
    left to right and later assignments see earlier ones. Columns are named by ``table``, the
    one inserted into (an ``INSERT ... SELECT`` may read columns of the same names)."""
    held = f"{table}.{quote_identifier(version)}"
    newer = f"{held} IS NULL OR VALUES({quote_identifier(version)}) > {held}"
    pairs = [*((f"{table}.{quote_identifier(c)}", value) for c, value in assignments.items()),
             (held, f"VALUES({quote_identifier(version)})")]
    return ", ".join(f"{column} = IF({newer}, {value}, {column})" for column, value in pairs)


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
