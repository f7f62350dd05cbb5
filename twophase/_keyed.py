"""The keyed mode (``mode="keyed"``): the latest state of each key, exactly once.

Delivery once per row is not enough for a table that mirrors a changing state: a late change,
a replayed one (Debezium delivers at least once) or two changes of one key in one batch must
not decide what the table says. Every table sink gives ``mode="keyed"`` this one meaning:

===========  ==================================================================================
rule         meaning
===========  ==================================================================================
key          ``key=``: the columns that name a row (a PRIMARY or UNIQUE key of the target)
version      ``version=``: one column, increasing per key (a log sequence number, a Kafka
             offset, an event time). A change applies only if its version is **newer** than
             the key's current one: its row's, or its tombstone's. A late change is a no-op
repeat      a change whose version equals the key's current one is the same change again: a
             no-op. Of one key's changes with one version in one batch, the first applies
delete       ``deleted=``: a column that marks a delete: a boolean (true deletes) or Debezium's
             ``op`` (``'d'`` deletes). It is read, never written (the target needs no such
             column). A delete removes the key's row and keeps a **tombstone** (key, version)
             in a table the sink owns, so that an older change cannot bring the key back
batch        one key's changes in one batch reduce to the newest (deletes too): a delete
             followed by a newer insert ends inserted, an insert followed by a newer delete
             ends deleted
retention    tombstones older than ``tombstone_retention_s`` are purged by
             ``python -m twophase.cleanup``: a change older than a purged tombstone can bring
             its key back (choose a retention longer than any change can be late)
routing      a sink that writes under locks before the decision (MySQL XA, PostgreSQL
             prepared) needs each key of a batch in one task, or a task waits on the lock of
             another task's prepared transaction, which only the decision releases:
             ``write_stream`` and ``write`` route rows by key (``route_by_key=``)
===========  ==================================================================================

``mode="upsert"`` (unchanged) replaces a row with whatever comes last, whatever its age, and
cannot delete; ``mode="keyed"`` is what a mirror of a changing state needs.

Two shapes of applying it share this module: an executor that writes a task's changes under
the sink's locks (:meth:`Keyed.reduce`, then :func:`newer_than` against the versions it
reads), and a publisher that applies staged rows in SQL (:func:`keyed_apply_statements`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from twophase._rows import ArrowT
from twophase.errors import ConfigurationError, SchemaMismatchError
from twophase.sink import Column

if TYPE_CHECKING:
    import pyarrow as pa

#: The mode's name (a value of :data:`twophase.kit.MODES`).
KEYED: Final = "keyed"
#: The values of a delete marker column that mark a delete (a boolean, Debezium's ``op``).
DELETE_MARKS: Final = (True, "d")
#: How long a tombstone is kept after its delete (seven days) unless told otherwise.
DEFAULT_TOMBSTONE_RETENTION_S: Final = 7 * 24 * 3600.0
#: The start of a tombstone table's name: ``_twophase_tombstones_<table>``.
TOMBSTONES_PREFIX: Final = "_twophase_tombstones_"
#: A tombstone's own columns beside the key and version: when its delete was applied.
TOMBSTONE_TIME_COLUMN: Final = "deleted_at"
#: The scratch column of the SQL publishers: whether a reduced change is a delete.
DELETED_FLAG: Final = "_twophase_deleted"
#: Spark types (``simpleString``) a version cannot have: they do not order changes.
UNORDERED_TYPES: Final = frozenset({"boolean", "binary", "void", "variant", "null"})
UNORDERED_PREFIXES: Final = ("array", "map", "struct")
#: A keyed writer reduces a task's changes across chunks and applies them once it holds this
#: many chunks' worth of keys (and at the end): a stream whose chunks each hold every key once
#: (a key's changes spread evenly over the stream) would otherwise apply every chunk whole.
HELD_CHUNKS: Final = 10
_RANK = "_twophase_rank"
_SEQ = "_twophase_seq"
_HASH_LENGTH = 10


@dataclass(frozen=True)
class Change:
    """One key's newest change of a chunk: its key values, version and, unless it is a
    delete, the row it writes (the written columns' values)."""

    key: tuple[Any, ...]
    version: Any
    row: tuple[Any, ...] | None

    @property
    def deleted(self) -> bool:
        return self.row is None


@dataclass(frozen=True)
class Keyed:
    """The keyed mode of one sink: its key, version and delete marker columns (see the
    module's table)."""

    key: tuple[str, ...]
    version: str
    deleted: str | None = None
    tombstone_retention_s: float = DEFAULT_TOMBSTONE_RETENTION_S

    def written(self, columns: Sequence[str]) -> tuple[str, ...]:
        """The columns a change writes into the target: all but the delete marker."""
        return tuple(c for c in columns if c != self.deleted)

    def check_rows(self, where: str, columns: Sequence[str]) -> None:
        """Refuse rows that lack the key, the version or the delete marker column."""
        needed = (*self.key, self.version, *((self.deleted,) if self.deleted else ()))
        if missing := [c for c in needed if c not in columns]:
            raise SchemaMismatchError(
                f"{where}: mode='keyed' reads column {', '.join(map(repr, missing))}, which "
                f"the rows do not have (their columns: {', '.join(columns)}).",
                fix="select the key, version and delete marker columns in the DataFrame, or "
                    "name the right ones in key=, version= and deleted=")

    def check_columns(self, where: str, columns: Sequence[Column]) -> None:
        """:meth:`check_rows`, and the version's type one that orders: a number, a string, a
        date or an instant (not a boolean, bytes or a nested value)."""
        self.check_rows(where, [column.name for column in columns])
        kind = next(column.type for column in columns if column.name == self.version)
        if kind in UNORDERED_TYPES or kind.startswith(UNORDERED_PREFIXES):
            raise SchemaMismatchError(
                f"{where}: the version column {self.version!r} is of type {kind}, which "
                "does not order changes.",
                fix="use a column that increases per key: a log sequence number, an offset "
                    "(bigint), a decimal, a string that sorts, a date or a timestamp")

    def reduce(self, rows: Iterable[Sequence[Any]], columns: Sequence[str]) -> list[Change]:
        """``rows`` reduced to the newest change of each key, in the order of each key's first
        row (of one version, the first row stays)."""
        at = {name: i for i, name in enumerate(columns)}
        keys = [at[name] for name in self.key]
        version = at[self.version]
        marker = at[self.deleted] if self.deleted else None
        kept = [i for i, name in enumerate(columns) if name != self.deleted]
        return [Change(tuple(row[i] for i in keys), row[version],
                       None if marker is not None and is_delete(row[marker])
                       else tuple(row[i] for i in kept))
                for row in self.reduce_rows(rows, columns)]

    def reduce_rows(self, rows: Iterable[Sequence[Any]], columns: Sequence[str]
                    ) -> list[Sequence[Any]]:
        """``rows`` reduced as :meth:`reduce` does, each kept row as it came."""
        keys = [columns.index(name) for name in self.key]
        version = columns.index(self.version)
        newest: dict[tuple[Any, ...], Sequence[Any]] = {}
        for row in rows:
            key = tuple(row[i] for i in keys)
            stamp = row[version]
            if stamp is None or None in key:
                raise self._null(key, stamp)
            held = newest.get(key)
            if held is None or stamp > held[version]:
                newest[key] = row
        return list(newest.values())

    def flagged_columns(self, columns: Sequence[str]) -> tuple[str, ...]:
        """The columns of a flagged change: the written ones, then :data:`DELETED_FLAG`."""
        return (*self.written(columns), DELETED_FLAG)

    def flagged_rows(self, rows: Iterable[Sequence[Any]], columns: Sequence[str]
                     ) -> Iterator[tuple[Any, ...]]:
        """``rows`` of ``columns`` as rows of :meth:`flagged_columns`: the delete marker read
        into the boolean flag, the other values as they are."""
        marker = columns.index(self.deleted) if self.deleted else None
        kept = [i for i, name in enumerate(columns) if name != self.deleted]
        for row in rows:
            yield (*(row[i] for i in kept), marker is not None and is_delete(row[marker]))

    def flagged_arrow(self, batch: ArrowT) -> ArrowT:
        """A record batch or table as one of :meth:`flagged_columns` (the flag in Arrow)."""
        import pyarrow as pa  # noqa: PLC0415 - only the Arrow path needs pyarrow

        kept: list[str] = [name for name in batch.schema.names if name != self.deleted]
        flag = (delete_flags(batch.column(self.deleted)) if self.deleted
                else pa.repeat(False, batch.num_rows))
        return type(batch).from_arrays([*(batch.column(name) for name in kept), flag],
                                       names=[*kept, DELETED_FLAG])

    def newest_in_chunks(self, chunks: Iterable[Sequence[Sequence[Any]]],
                         columns: Sequence[str], size: int) -> Iterator[list[tuple[Any, ...]]]:
        """One task's chunks of rows (of ``columns``, in stream order) reduced across chunks to
        the newest change of each key, handed on as rows of :meth:`flagged_columns` whenever
        ``size`` keys or more are held (a sink: :data:`HELD_CHUNKS` times its chunk size), and
        at the end (memory: ``size`` keys and a chunk). A key may come again in a later
        hand-over, newer: applied in order, every step guarded by the version, that is right."""
        held: list[Sequence[Any]] = []
        for chunk in chunks:
            held = self.reduce_rows([*held, *chunk], columns)
            if len(held) >= size:
                yield list(self.flagged_rows(held, columns))
                held = []
        if held:
            yield list(self.flagged_rows(held, columns))

    def newest_in_tables(self, tables: Iterable[pa.Table], size: int) -> Iterator[pa.Table]:
        """:meth:`newest_in_chunks` for Arrow tables (reduced in Arrow, flagged in Arrow)."""
        import pyarrow as pa  # noqa: PLC0415 - only the Arrow path needs pyarrow

        held: pa.Table | None = None
        for table in tables:
            held = self.reduce_arrow(table if held is None else pa.concat_tables([held, table]))
            if held.num_rows >= size:
                yield self.flagged_arrow(held)
                held = None
        if held is not None and held.num_rows:
            yield self.flagged_arrow(held)

    def reduce_arrow(self, table: pa.Table) -> pa.Table:
        """An Arrow table reduced as :meth:`reduce` does, in columns (stream order kept)."""
        import pyarrow as pa  # noqa: PLC0415 - only the Arrow path needs pyarrow
        import pyarrow.compute as pc  # noqa: PLC0415

        self.require_present_arrow(table)
        if table.num_rows < 2:
            return table
        seq = pa.array(range(table.num_rows), pa.int64())
        ordered = table.append_column(_SEQ, seq).sort_by(
            [*((name, "ascending") for name in self.key), (self.version, "descending"),
             (_SEQ, "ascending")])
        first = None
        for name in self.key:
            column = ordered.column(name)
            differs = pc.not_equal(column.slice(1), column.slice(0, ordered.num_rows - 1))
            first = differs if first is None else pc.or_(first, differs)
        keep = pa.concat_arrays([pa.array([True]), *pa.chunked_array(first).chunks])
        reduced = ordered.filter(keep)
        return reduced.sort_by(_SEQ).drop_columns([_SEQ])

    def require_present(self, rows: Iterable[Sequence[Any]], columns: Sequence[str]
                        ) -> Iterator[Sequence[Any]]:
        """``rows`` as they come, refused (SchemaMismatchError) at the first whose key or
        version is null: for a sink that stages rows and reduces them later, in SQL."""
        at = [columns.index(name) for name in (*self.key, self.version)]
        for row in rows:
            if any(row[i] is None for i in at):
                raise self._null(tuple(row[i] for i in at[:-1]), row[at[-1]])
            yield row

    def require_present_arrow(self, batch: pa.RecordBatch | pa.Table) -> None:
        """The same for Arrow columns."""
        for name in (*self.key, self.version):
            if batch.column(name).null_count:
                raise self._null((name,), None)

    def _null(self, key: tuple[Any, ...], version: Any) -> SchemaMismatchError:
        return SchemaMismatchError(
            f"a change with a null key or version (key {dict(zip(self.key, key, strict=False))}"
            f", version {version!r}): mode='keyed' needs key= and version= in every row.",
            fix=f"filter the rows whose {', '.join(self.key)} or {self.version} is null, or "
                "fill them in the query")


def delete_flags(marker: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """:func:`is_delete` in Arrow: true for a true boolean or the string ``'d'``, else false."""
    import pyarrow as pa  # noqa: PLC0415 - only the Arrow path needs pyarrow
    import pyarrow.compute as pc  # noqa: PLC0415

    if pa.types.is_boolean(marker.type):
        return pc.fill_null(marker, False)
    if pa.types.is_string(marker.type) or pa.types.is_large_string(marker.type):
        return pc.fill_null(pc.equal(marker, "d"), False)
    return pa.repeat(False, len(marker))


def is_delete(mark: Any) -> bool:
    """Whether a delete marker's value marks a delete (true, or Debezium's ``'d'``)."""
    return any(mark is m or (isinstance(mark, str) and mark == m) for m in DELETE_MARKS)


def newer_than(changes: Iterable[Change],
               current: Mapping[tuple[Any, ...], Any]) -> list[Change]:
    """The changes whose version is newer than their key's current version (``current``: the
    target's rows and tombstones, the newest of the two per key; an absent key, or a stored
    NULL version, has none). Python compares the values: a sink gives ``current`` keys and
    versions of the types its changes carry (aware datetimes, the key's case as written)."""
    return [change for change in changes
            if (held := current.get(change.key)) is None or change.version > held]


def validate_keyed(sink: str, mode: str, key: Sequence[str], version: str | None,
                   deleted: str | None, *,
                   tombstone_retention_s: float = DEFAULT_TOMBSTONE_RETENTION_S) -> Keyed | None:
    """The keyed mode of a sink's options (None in another mode), or ConfigurationError."""
    if mode != KEYED:
        if version is not None or deleted is not None:
            raise ConfigurationError(
                f"{sink}: version= and deleted= belong to mode='keyed', not mode={mode!r}.",
                fix="pass mode='keyed' (the latest state of each key, by version), or leave "
                    "version= and deleted= out")
        return None
    if not key or not version:
        raise ConfigurationError(
            f"{sink}: mode='keyed' needs the key columns and a version column.",
            fix="pass key=('id',) (a unique key of the target) and version='lsn' (a column "
                "that increases per key: a log sequence number, an offset, an event time)")
    if version in key or (deleted is not None and deleted in (*key, version)):
        raise ConfigurationError(
            f"{sink}: key={list(key)}, version={version!r} and deleted={deleted!r} must be "
            "different columns.", fix="name a separate column for each")
    if isinstance(tombstone_retention_s, bool) or not tombstone_retention_s > 0:
        raise ConfigurationError(
            f"{sink}: tombstone_retention_s={tombstone_retention_s!r} must be positive.",
            fix=f"leave it at {DEFAULT_TOMBSTONE_RETENTION_S:.0f} (7 days) or pass seconds "
                "longer than any change can arrive late")
    return Keyed(tuple(key), version, deleted, float(tombstone_retention_s))


def tombstone_table_name(table: str, max_length: int = 63) -> str:
    """The name of the table that keeps ``table``'s tombstones (within ``max_length``: a
    long name is cut and ends with a hash of the whole)."""
    name = TOMBSTONES_PREFIX + table
    if len(name) <= max_length:
        return name
    digest = hashlib.sha256(table.encode()).hexdigest()[:_HASH_LENGTH]
    return f"{name[:max_length - _HASH_LENGTH - 1]}_{digest}"


def keyed_apply_statements(keyed: Keyed, *, quote: Callable[[str], str], source: str,
                           target: str, tombstones: str, scratch: str,
                           columns: Sequence[str], deleted: str, order: str,
                           now: str) -> list[str]:
    """The SQL that applies staged changes to ``target`` in the keyed mode, in one transaction
    of the caller's (SQLite 3.35+, PostgreSQL): reduce ``source`` to the newest change per key
    into the temporary table ``scratch``, drop what is not newer than the target's row or
    tombstone, delete and record tombstones, upsert the rest, drop ``scratch``.

    ``quote`` quotes a column name; ``source``/``target``/``tombstones``/``scratch`` are quoted
    table references; ``columns`` the written columns (key and version among them);
    ``deleted`` an SQL expression over ``source``'s columns that is true for a delete;
    ``order`` one over them that orders a key's changes as they came (the first of one version
    applies); ``now`` the SQL of the current time (a tombstone's ``deleted_at``). Statements
    take no parameters.
    """
    key = [quote(c) for c in keyed.key]
    version = quote(keyed.version)
    names = ", ".join(quote(c) for c in columns)
    flag = quote(DELETED_FLAG)

    def same_key(left: str, right: str) -> str:
        return " AND ".join(f"{left}.{k} = {right}.{k}" for k in key)

    def not_newer(table: str) -> str:
        return (f"EXISTS (SELECT 1 FROM {table} t WHERE {same_key('t', scratch)} "
                f"AND t.{version} >= {scratch}.{version})")

    on_key = same_key("t", "s")
    updates = ", ".join(f"{quote(c)} = excluded.{quote(c)}"
                        for c in columns if c not in keyed.key)
    return [
        f"CREATE TEMPORARY TABLE {scratch} AS SELECT {names}, {flag} FROM ("
        f"SELECT {names}, ({deleted}) AS {flag}, ROW_NUMBER() OVER (PARTITION BY "
        f"{', '.join(key)} ORDER BY {version} DESC NULLS LAST, {order} ASC) AS {_RANK} "
        f"FROM {source}) ranked WHERE {_RANK} = 1",
        f"DELETE FROM {scratch} WHERE {not_newer(target)} OR {not_newer(tombstones)}",
        f"DELETE FROM {target} AS t WHERE EXISTS (SELECT 1 FROM {scratch} s WHERE "
        f"s.{flag} AND {on_key})",
        f"INSERT INTO {tombstones} AS t ({', '.join(key)}, {version}, "
        f"{quote(TOMBSTONE_TIME_COLUMN)}) SELECT {', '.join(key)}, {version}, {now} "
        f"FROM {scratch} WHERE {flag} ON CONFLICT ({', '.join(key)}) DO UPDATE SET "
        f"{version} = excluded.{version}, "
        f"{quote(TOMBSTONE_TIME_COLUMN)} = excluded.{quote(TOMBSTONE_TIME_COLUMN)} "
        f"WHERE t.{version} IS NULL OR t.{version} < excluded.{version}",
        f"DELETE FROM {tombstones} AS t WHERE EXISTS (SELECT 1 FROM {scratch} s WHERE "
        f"NOT s.{flag} AND {on_key})",
        f"INSERT INTO {target} AS t ({names}) SELECT {names} FROM {scratch} WHERE NOT {flag} "
        f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates} "
        f"WHERE t.{version} IS NULL OR t.{version} < excluded.{version}",
        f"DROP TABLE {scratch}",
    ]
