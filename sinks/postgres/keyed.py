"""The keyed mode (``PostgresSink(..., mode="keyed")``): the latest state of each key, by
version, with tombstones (the rules: :mod:`twophase._keyed`).

=================  ==============================================================================
where              what it does
=================  ==============================================================================
executor,          per chunk (:class:`KeyedWriter`), three statements whatever its size: the
prepared mode      chunk reduced to the newest change per key (in Arrow on the data source path)
                   and sent as one array per column; (1) the keys' rows locked (``SELECT ...
                   FOR UPDATE``: they stay locked until the decision); (2) their tombstones
                   locked, a placeholder held for a key with neither (:data:`HOLD_TOMBSTONES`:
                   a read does not see another transaction's uncommitted tombstone, a unique
                   index does); (3) one statement: the changes newer than both row and tombstone
                   kept, the deleted keys' rows deleted and their tombstones upserted, the
                   tombstones of the keys written again deleted and their rows upserted
                   (``INSERT ... ON CONFLICT (key) DO UPDATE ... WHERE t.version <
                   EXCLUDED.version``). Chunk by chunk is correct: every step is guarded by the
                   version. Each key of a batch must be written by one task
                   (:meth:`PostgresSink.route_key <sinks.postgres.PostgresSink.route_key>`),
                   else a task waits on the row lock of another task's prepared transaction
                   (bounded by ``lock_timeout``, named by :mod:`~sinks.postgres.locks`)
executor, staged   the rows as they came into the staging table, the delete marker replaced by
                   the boolean ``_twophase_deleted`` (:meth:`Keyed.flagged_rows
                   <twophase.kit.Keyed.flagged_rows>`, ``flagged_arrow``); the staging table
                   numbers them (``_twophase_seq``)
driver, staged     :func:`apply_staged`: the staged rows of the batch's handles, moved into a
                   temporary table, applied by :func:`twophase.kit.sql.keyed_apply_statements`
                   (reduce with ``ROW_NUMBER``, drop what is not newer, delete, keep tombstones,
                   upsert with the version guard) in the publishing transaction
tombstones         ``_twophase_tombstones_<table>`` beside the target (:func:`tombstones_of`):
                   the key and version columns with the target's types, ``deleted_at``; created
                   by ``check_schema``/``create_tables`` (or by a DBA from
                   :func:`tombstone_ddl`); purged by :func:`purge_tombstones` without waiting
                   on rows a prepared transaction holds
=================  ==============================================================================

The delete marker column (``deleted=``) is read, never written: the target needs no such
column. The sink's user needs SELECT, INSERT, UPDATE, DELETE on the target and the tombstone
table.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from psycopg import sql

from sinks.postgres.connection import Connection
from sinks.postgres.schema import MAX_IDENTIFIER, Table, exists
from twophase.kit import DELETED_FLAG, Keyed, as_utc, columns_of
from twophase.kit.sql import TOMBSTONE_TIME_COLUMN, keyed_apply_statements, tombstone_table_name

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

#: The staging table's column that numbers the rows as they came (keyed, staged).
SEQ_COLUMN = "_twophase_seq"
#: The publisher's temporary tables: the staged rows of a batch, and their reduced changes.
SOURCE_TABLE = "_twophase_keyed_source"
CHANGES_TABLE = "_twophase_keyed_changes"
_ORDINAL = "_twophase_ord"


def tombstones_of(target: Table) -> Table:
    """The tombstone table of ``target``, in its schema (a name of at most 63 characters)."""
    return Table(target.schema, tombstone_table_name(target.name, MAX_IDENTIFIER))


def tombstone_ddl(tombstones: Table, target: Table, keyed: Keyed) -> sql.Composed:
    """The tombstone table: the key and version columns of ``target`` (their types), the key
    its primary key, and when the delete was applied."""
    key = sql.SQL(", ").join(map(sql.Identifier, keyed.key))
    return sql.SQL(
        "CREATE TABLE IF NOT EXISTS {tombstones} AS SELECT {key}, {version} FROM {target} "
        "WITH NO DATA;"
        "ALTER TABLE {tombstones} ADD PRIMARY KEY ({key}), "
        "ADD COLUMN {deleted_at} timestamptz NOT NULL DEFAULT now();"
        "COMMENT ON TABLE {tombstones} IS 'twophase: the keys deleted from {target_name} and "
        "the version of their delete, until purged after the tombstone retention'").format(
        tombstones=tombstones.ident, key=key, version=sql.Identifier(keyed.version),
        target=target.ident, deleted_at=sql.Identifier(TOMBSTONE_TIME_COLUMN),
        target_name=sql.SQL(str(target).replace("'", "''")))


def create_missing_tombstones(conn: Connection, tombstones: Table, target: Table,
                              keyed: Keyed) -> None:
    if not exists(conn, tombstones):
        log.info("creating %s", tombstones)
        conn.execute(tombstone_ddl(tombstones, target, keyed))


# -- executor, prepared: the changes written under the rows' locks -----------------------------

class KeyedWriter:
    """One transaction's keyed writes into ``target`` and ``tombstones`` (see the module
    docstring): :meth:`apply_rows` or :meth:`apply_arrow`, the task's rows of ``columns``."""

    def __init__(self, conn: Connection, keyed: Keyed, target: Table, tombstones: Table,
                 columns: Sequence[str]) -> None:
        self.conn, self.keyed = conn, keyed
        self.target, self.tombstones = target, tombstones
        self.columns, self.flagged = tuple(columns), keyed.flagged_columns(columns)
        self._types: dict[str, str] | None = None

    def apply_rows(self, chunks: Iterable[Sequence[Sequence[Any]]], size: int) -> None:
        """A task's chunks of rows: reduced in Python across chunks, applied in three statements
        every ``size`` keys (:meth:`~twophase.kit.Keyed.newest_in_chunks`)."""
        for newest in self.keyed.newest_in_chunks(chunks, self.columns, size):
            self._apply([list(column) for column in zip(*newest, strict=True)])

    def apply_arrow(self, tables: Iterable[pa.Table], size: int) -> None:
        """A task's chunks of record batches: the same, reduced in Arrow."""
        for newest in self.keyed.newest_in_tables(tables, size):
            self._apply(columns_of(newest))

    def _apply(self, values: list[list[Any]]) -> None:
        """The newest changes (one list per column of :attr:`flagged`): lock the keys' rows,
        lock or hold their tombstones, apply what is newer (the module docstring's steps)."""
        keys = [values[self.flagged.index(name)] for name in self.keyed.key]
        arrays = self._arrays(self.keyed.key)
        for statement in (LOCK_ROWS, HOLD_TOMBSTONES):
            self.conn.execute(self._sql(statement, keys=arrays), keys)
        self.conn.execute(self._sql(APPLY, changes=self._arrays(self.flagged)), values)

    def _sql(self, template: str, **arrays: sql.Composable) -> sql.Composed:
        key = self.keyed.key
        written = self.flagged[:-1]
        return sql.SQL(template).format(
            **arrays, target=self.target.ident, tombstones=self.tombstones.ident,
            key=_names(key), k_key=_names(key, "k"), columns=_names(self.flagged),
            written=_names(written), f_written=_names(written, "f"),
            k_same=_same(key, "t", "k"), c_same=_same(key, "t", "c"), f_same=_same(key, "t", "f"),
            version=sql.Identifier(self.keyed.version), flag=sql.Identifier(DELETED_FLAG),
            deleted_at=sql.Identifier(TOMBSTONE_TIME_COLUMN),
            updates=sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c))
                                       for c in written if c not in key) or sql.SQL(
                "{0} = EXCLUDED.{0}").format(sql.Identifier(self.keyed.version)))

    def _arrays(self, names: Sequence[str]) -> sql.Composed:
        """``unnest`` of one array parameter per column of ``names``, each cast to the target's
        type of it (the flag: boolean)."""
        types = {**self._column_types(), DELETED_FLAG: "boolean"}
        return _typed_arrays([types[name] for name in names])

    def _column_types(self) -> dict[str, str]:
        """The target's types of the written columns (without a length or precision: a cast to
        ``varchar(3)`` would cut a longer key to another key)."""
        if self._types is None:
            rows = self.conn.execute(
                "SELECT a.attname, format_type(a.atttypid, NULL) FROM pg_attribute a "
                "WHERE a.attrelid = %s::regclass AND a.attname = ANY(%s) AND NOT a.attisdropped",
                (str(self.target), list(self.flagged[:-1]))).fetchall()
            self._types = {name: kind for name, kind in rows}
        return self._types


#: Step 1: the rows of the chunk's keys locked (waiting for any transaction that holds one).
LOCK_ROWS = ("SELECT count(*) FROM (SELECT 1 FROM {target} t JOIN unnest({keys}) AS k ({key}) "
             "ON {k_same} FOR UPDATE OF t) locked")
#: Step 2: the tombstones of the keys without a row locked, and a placeholder (NULL version)
#: inserted for each key with neither: a tombstone another transaction inserted and has not
#: committed (prepared, the batch before) is invisible to step 1's read, but not to a unique
#: index, so the insert waits for it. Step 3 turns a placeholder into the key's tombstone or
#: deletes it: none outlives the transaction.
HOLD_TOMBSTONES = (
    "INSERT INTO {tombstones} AS t ({key}, {version}) SELECT {k_key}, NULL "
    "FROM unnest({keys}) AS k ({key}) WHERE NOT EXISTS (SELECT 1 FROM {target} t WHERE {k_same}) "
    "ON CONFLICT ({key}) DO UPDATE SET {version} = t.{version} WHERE false")
#: Step 3, one statement (its snapshot taken after steps 1 and 2 waited): the changes newer than
#: both row and tombstone, the deletes (row deleted, tombstone kept), the tombstones of keys
#: written again deleted, the upserts (guarded by the version too).
APPLY = (
    "WITH c AS (SELECT * FROM unnest({changes}) AS c ({columns})), "
    "f AS (SELECT * FROM c WHERE "
    "NOT EXISTS (SELECT 1 FROM {target} t WHERE {c_same} AND t.{version} >= c.{version}) AND "
    "NOT EXISTS (SELECT 1 FROM {tombstones} t WHERE {c_same} AND t.{version} >= c.{version})), "
    "gone AS (DELETE FROM {target} t USING f WHERE f.{flag} AND {f_same}), "
    "buried AS (INSERT INTO {tombstones} AS t ({key}, {version}) SELECT {key}, {version} FROM f "
    "WHERE f.{flag} ON CONFLICT ({key}) DO UPDATE SET {version} = EXCLUDED.{version}, "
    "{deleted_at} = now() WHERE t.{version} IS NULL OR t.{version} < EXCLUDED.{version}), "
    "unburied AS (DELETE FROM {tombstones} t USING c WHERE NOT c.{flag} AND {c_same} "
    "AND (t.{version} IS NULL OR t.{version} < c.{version})) "
    "INSERT INTO {target} AS t ({written}) SELECT {f_written} FROM f WHERE NOT f.{flag} "
    "ON CONFLICT ({key}) DO UPDATE SET {updates} "
    "WHERE t.{version} IS NULL OR t.{version} < EXCLUDED.{version}")


def _names(names: Sequence[str], table: str | None = None) -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(*((table,) if table else ()), name)
                              for name in names)


def _same(key: Sequence[str], left: str, right: str) -> sql.Composed:
    return sql.SQL(" AND ").join(sql.SQL("{} = {}").format(sql.Identifier(left, name),
                                                           sql.Identifier(right, name))
                                 for name in key)


def _typed_arrays(types: Sequence[str]) -> sql.Composed:
    """One array parameter per type, cast to it (types from ``format_type``: valid SQL)."""
    return sql.SQL(", ").join(sql.SQL("%s::{}[]").format(sql.SQL(kind)) for kind in types)


# -- driver, staged: the batch's staged rows applied in SQL ------------------------------------

def apply_staged(conn: Connection, keyed: Keyed, *, source: sql.Identifier, target: Table,
                 tombstones: Table, columns: Sequence[str]) -> None:
    """Apply the staged changes in the temporary table ``source`` (written ``columns``, the
    delete flag and :data:`SEQ_COLUMN`) to ``target``, in the caller's transaction."""
    for statement in keyed_apply_statements(
            keyed, quote=lambda name: sql.Identifier(name).as_string(conn),
            source=source.as_string(conn), target=target.ident.as_string(conn),
            tombstones=tombstones.ident.as_string(conn),
            scratch=sql.Identifier(CHANGES_TABLE).as_string(conn), columns=columns,
            deleted=sql.Identifier(DELETED_FLAG).as_string(conn),
            order=sql.Identifier(SEQ_COLUMN).as_string(conn), now="now()"):
        conn.execute(statement)


# -- driver: the tombstones' purge and count ---------------------------------------------------

def purge_tombstones(conn: Connection, tombstones: Table, older_than: dt.datetime) -> int:
    """Delete the tombstones of deletes applied before ``older_than`` (naive: UTC), skipping
    those a transaction holds (a prepared writer's: it is about to change them anyway)."""
    if not exists(conn, tombstones):
        return 0
    cursor = conn.execute(sql.SQL(
        "DELETE FROM {table} WHERE ctid IN (SELECT ctid FROM {table} WHERE {deleted_at} < %s "
        "FOR UPDATE SKIP LOCKED)").format(
        table=tombstones.ident, deleted_at=sql.Identifier(TOMBSTONE_TIME_COLUMN)),
        (as_utc(older_than),))
    return cursor.rowcount


def count_tombstones(conn: Connection, tombstones: Table) -> tuple[int, dt.datetime | None]:
    """How many tombstones there are, and when the oldest one's delete was applied."""
    if not exists(conn, tombstones):
        return 0, None
    row = conn.execute(sql.SQL("SELECT count(*), min({deleted_at}) FROM {table}").format(
        deleted_at=sql.Identifier(TOMBSTONE_TIME_COLUMN), table=tombstones.ident)).fetchone()
    count, oldest = row if row is not None else (0, None)
    return int(count), oldest
