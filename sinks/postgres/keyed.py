"""The keyed mode (``PostgresSink(..., mode="keyed")``): the latest state of each key, by
version, with tombstones (the rules: :mod:`twophase._keyed`).

=================  ==============================================================================
where              what it does
=================  ==============================================================================
executor,          per chunk (:class:`KeyedWriter`): reduce to the newest change per key; read the
prepared mode      keys' versions in the target and the tombstone table (``SELECT ... FOR
                   UPDATE``: the rows stay locked until the decision); keep the changes newer than
                   both; ``DELETE`` the deleted keys' rows and upsert their tombstones; ``DELETE``
                   the tombstones of the keys written again and upsert their rows (``INSERT ... ON
                   CONFLICT (key) DO UPDATE ... WHERE t.version < EXCLUDED.version``). Chunk by
                   chunk is correct: every step is guarded by the version. Each key of a batch
                   must be written by one task (:meth:`PostgresSink.route_key
                   <sinks.postgres.PostgresSink.route_key>`), else a task waits on the row lock of
                   another task's prepared transaction (bounded by ``lock_timeout``, named by
                   :mod:`~sinks.postgres.locks`)
executor, staged   the rows as they came into the staging table, the delete marker replaced by
                   the boolean ``_twophase_deleted`` (:func:`staged_rows`,
                   :func:`staged_batches`); the staging table numbers them (``_twophase_seq``)
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
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from psycopg import sql

from sinks.postgres.bulk import upsert_rows
from sinks.postgres.connection import Connection
from sinks.postgres.schema import MAX_IDENTIFIER, Table, exists
from twophase.kit import DELETED_FLAG, Change, Keyed, as_utc, is_delete, newer_than
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
    docstring): :meth:`apply` per chunk of rows of ``columns``."""

    def __init__(self, conn: Connection, keyed: Keyed, target: Table, tombstones: Table,
                 columns: Sequence[str]) -> None:
        self.conn, self.keyed = conn, keyed
        self.target, self.tombstones = target, tombstones
        self.columns, self.written = tuple(columns), keyed.written(columns)
        self._types: tuple[str, ...] | None = None

    def apply(self, rows: Sequence[Sequence[Any]]) -> None:
        changes = self.keyed.reduce(rows, self.columns)
        if not changes:
            return
        fresh = newer_than(changes, self._current([change.key for change in changes]))
        gone = [change for change in fresh if change.deleted]
        kept = [change for change in fresh if not change.deleted]
        if gone:
            self._delete(self.target, [change.key for change in gone])
            self._bury(gone)
        if kept:
            self._delete(self.tombstones, [change.key for change in kept])
            upsert_rows(self.conn, self.target, self.written, self.keyed.key,
                        [change.row for change in kept if change.row is not None],
                        newer=self.keyed.version)

    def _current(self, keys: Sequence[tuple[Any, ...]]) -> dict[tuple[Any, ...], Any]:
        """The newest version of each key in the target or its tombstone, the rows locked."""
        current: dict[tuple[Any, ...], Any] = {}
        for table in (self.target, self.tombstones):
            for ordinal, version in self._versions(table, keys):
                key = keys[ordinal - 1]
                if key not in current or version > current[key]:
                    current[key] = version
        return current

    def _versions(self, table: Table, keys: Sequence[tuple[Any, ...]]
                  ) -> list[tuple[int, Any]]:
        source, arrays = self._keys(keys, ordinal=True)
        statement = sql.SQL("SELECT k.{ordinal}, t.{version} FROM {table} t JOIN {source} "
                            "ON {same} FOR UPDATE OF t").format(
            ordinal=sql.Identifier(_ORDINAL), version=sql.Identifier(self.keyed.version),
            table=table.ident, source=source, same=self._same_key())
        return [(int(ordinal), version)
                for ordinal, version in self.conn.execute(statement, arrays).fetchall()]

    def _delete(self, table: Table, keys: Sequence[tuple[Any, ...]]) -> None:
        source, arrays = self._keys(keys)
        self.conn.execute(sql.SQL("DELETE FROM {table} t USING {source} WHERE {same}").format(
            table=table.ident, source=source, same=self._same_key()), arrays)

    def _bury(self, deletes: Sequence[Change]) -> None:
        """Upsert the tombstones of ``deletes`` (a newer version wins)."""
        types = self._column_types()
        key = sql.SQL(", ").join(map(sql.Identifier, self.keyed.key))
        version = sql.Identifier(self.keyed.version)
        self.conn.execute(sql.SQL(
            "INSERT INTO {tombstones} AS t ({key}, {version}) SELECT * FROM unnest({arrays}) "
            "ON CONFLICT ({key}) DO UPDATE SET {version} = EXCLUDED.{version}, "
            "{deleted_at} = now() WHERE t.{version} < EXCLUDED.{version}").format(
            tombstones=self.tombstones.ident, key=key, version=version,
            arrays=_typed_arrays(types), deleted_at=sql.Identifier(TOMBSTONE_TIME_COLUMN)),
            [*map(list, zip(*(change.key for change in deletes), strict=True)),
             [change.version for change in deletes]])

    def _keys(self, keys: Sequence[tuple[Any, ...]], *, ordinal: bool = False
              ) -> tuple[sql.Composed, list[list[Any]]]:
        """``keys`` as a relation ``k`` of the key columns (cast to the target's types; and
        their position, 1-based, if ``ordinal``), and its parameters: one array per column."""
        names = [*map(sql.Identifier, self.keyed.key),
                 *((sql.Identifier(_ORDINAL),) if ordinal else ())]
        source = sql.SQL("unnest({arrays}){ordinality} AS k ({names})").format(
            arrays=_typed_arrays(self._column_types()[:len(self.keyed.key)]),
            ordinality=sql.SQL(" WITH ORDINALITY" if ordinal else ""),
            names=sql.SQL(", ").join(names))
        return source, [list(column) for column in zip(*keys, strict=True)]

    def _same_key(self) -> sql.Composed:
        return sql.SQL(" AND ").join(sql.SQL("t.{0} = k.{0}").format(sql.Identifier(name))
                                     for name in self.keyed.key)

    def _column_types(self) -> tuple[str, ...]:
        """The target's types of the key columns and the version column (without a length or
        precision: a cast to ``varchar(3)`` would cut a longer key to another key)."""
        if self._types is None:
            names = [*self.keyed.key, self.keyed.version]
            rows = self.conn.execute(
                "SELECT format_type(a.atttypid, NULL) FROM unnest(%s::text[]) WITH ORDINALITY "
                "AS n(name, i) JOIN pg_attribute a ON a.attrelid = %s::regclass "
                "AND a.attname = n.name AND NOT a.attisdropped ORDER BY n.i",
                (names, str(self.target))).fetchall()
            self._types = tuple(row[0] for row in rows)
        return self._types


def _typed_arrays(types: Sequence[str]) -> sql.Composed:
    """One array parameter per type, cast to it (types from ``format_type``: valid SQL)."""
    return sql.SQL(", ").join(sql.SQL("%s::{}[]").format(sql.SQL(kind)) for kind in types)


# -- executor, staged: the rows as they came, the marker as a flag -----------------------------

def staged_columns(keyed: Keyed, columns: Sequence[str]) -> tuple[str, ...]:
    """The staging table's columns a task writes: the written ones and the delete flag."""
    return (*keyed.written(columns), DELETED_FLAG)


def staged_rows(keyed: Keyed, columns: Sequence[str], rows: Iterable[Sequence[Any]]
                ) -> Iterator[tuple[Any, ...]]:
    """``rows`` of ``columns`` as rows of :func:`staged_columns`."""
    marker = columns.index(keyed.deleted) if keyed.deleted else None
    kept = [i for i, name in enumerate(columns) if name != keyed.deleted]
    for row in rows:
        yield (*(row[i] for i in kept), marker is not None and is_delete(row[marker]))


def staged_batches(keyed: Keyed, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Record batches as batches of :func:`staged_columns` (the flag computed in Arrow)."""
    import pyarrow as pa  # noqa: PLC0415 - only the Arrow path needs pyarrow

    for batch in batches:
        kept = [name for name in batch.schema.names if name != keyed.deleted]
        flag = (_delete_flags(batch.column(keyed.deleted)) if keyed.deleted
                else pa.repeat(False, batch.num_rows))
        yield pa.RecordBatch.from_arrays([*(batch.column(name) for name in kept), flag],
                                         names=[*kept, DELETED_FLAG])


def _delete_flags(marker: pa.Array) -> pa.Array:
    """:func:`twophase.kit.is_delete` in Arrow: a true boolean, or the string ``'d'``."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.compute as pc  # noqa: PLC0415

    if pa.types.is_boolean(marker.type):
        return pc.fill_null(marker, False)
    if pa.types.is_string(marker.type) or pa.types.is_large_string(marker.type):
        return pc.fill_null(pc.equal(marker, "d"), False)
    return pa.repeat(False, len(marker))


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
