"""Tables: names, the DDL of the sink's marker table, and the checks made before a start.

``check_schema`` refuses, before a query starts: a server with ``max_prepared_transactions =
0`` (PREPARE TRANSACTION would fail every task), a missing target table, the column checks of
:func:`twophase.kit.check_columns` (a column the table lacks, a NOT NULL column without default
the rows lack, an instant into a ``timestamp`` column that keeps no zone, an upsert or keyed
key that is no unique key), and a user without the privileges of :data:`MODE_PRIVILEGES` on
the table (and, keyed, on its tombstone table) or without the rights on the marker table. It
creates the marker table if missing: a DBA may create it from :data:`MARKER_TABLE_DDL` instead
and grant no CREATE right.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from psycopg import sql

from sinks.postgres.connection import Connection
from twophase import Column, ConfigurationError, SchemaMismatchError
from twophase.kit import KEYED, Mode, TableColumn, check_columns

log = logging.getLogger(__name__)

MARKER_TABLE_DDL = """CREATE TABLE IF NOT EXISTS {table} (
  txn_id varchar(96) PRIMARY KEY,
  namespace varchar(24) NOT NULL,
  target_table text NOT NULL,
  row_count bigint NOT NULL,
  created_at timestamptz NOT NULL,
  prepared_at timestamptz NOT NULL DEFAULT now(),
  committed_at timestamptz NULL
);
CREATE INDEX IF NOT EXISTS {index} ON {table} (namespace, committed_at);
COMMENT ON TABLE {table} IS
  'twophase: one row per prepared transaction, written inside it: the proof of its commit'"""

#: PostgreSQL's longest identifier, in bytes.
MAX_IDENTIFIER = 63
MARKER_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")
#: What each mode does to the target: COPY inserts; an upsert's ON CONFLICT DO UPDATE reads the
#: row it updates; the keyed mode reads versions, upserts and deletes (its tombstone table too).
MODE_PRIVILEGES: Mapping[Mode, tuple[str, ...]] = {
    "insert": ("INSERT",),
    "upsert": ("INSERT", "SELECT", "UPDATE"),
    KEYED: ("SELECT", "INSERT", "UPDATE", "DELETE"),
}


@dataclass(frozen=True)
class Table:
    """A table of a schema; ``str()`` is its quoted, qualified name: "schema"."table"."""

    schema: str
    name: str

    def __post_init__(self) -> None:
        for part in (self.schema, self.name):
            if not part or "\x00" in part:
                raise ConfigurationError(f"{part!r} is not a usable PostgreSQL identifier.",
                                         fix="name a non-empty schema and table without NUL")

    @property
    def ident(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.name)

    def __str__(self) -> str:
        return self.ident.as_string()


def marker_ddl(table: Table) -> sql.Composed:
    index = sql.Identifier(f"{table.name}_by_namespace_committed")
    return sql.SQL(MARKER_TABLE_DDL).format(table=table.ident, index=index)


def exists(conn: Connection, table: Table) -> bool:
    return conn.execute("SELECT to_regclass(%s) IS NOT NULL", (str(table),)).fetchone() == (
        True,)


def create_missing_markers(conn: Connection, table: Table) -> None:
    if not exists(conn, table):
        log.info("creating %s", table)
        conn.execute(marker_ddl(table))


def check_prepared_transactions(conn: Connection, address: str) -> None:
    """PREPARE TRANSACTION needs ``max_prepared_transactions`` > 0 (a restart to change)."""
    row = conn.execute("SELECT setting::int FROM pg_settings "
                       "WHERE name = 'max_prepared_transactions'").fetchone()
    if not row or row[0] < 1:
        raise ConfigurationError(
            f"the PostgreSQL server {address} has max_prepared_transactions = 0: prepared "
            "transactions are disabled, so no partition could be pre-committed.",
            fix="set max_prepared_transactions to at least twice the partitions of a batch "
            "in postgresql.conf and restart the server")


def check_columns_of(conn: Connection, table: Table, columns: Sequence[Column], *,
                     upsert_key: Sequence[str] | None, where: str) -> None:
    """The kit's column checks on the table's catalog (identifiers are case-sensitive)."""
    rows = conn.execute(
        "SELECT column_name, is_nullable = 'NO' AND column_default IS NULL "
        "AND is_identity = 'NO' AND is_generated = 'NEVER', data_type "
        "FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
        "ORDER BY ordinal_position", (table.schema, table.name)).fetchall()
    catalog = [TableColumn(name, required=required, zoned=_zoned(data_type))
               for name, required, data_type in rows]
    check_columns(where, catalog, columns, upsert_key=upsert_key,
                  unique_keys=unique_keys(conn, table) if upsert_key is not None else ())


def _zoned(data_type: str) -> bool | None:
    if data_type == "timestamp with time zone":
        return True
    return False if data_type == "timestamp without time zone" else None


def unique_keys(conn: Connection, table: Table) -> list[list[str]]:
    """The columns of every unique index (the primary key too) without a predicate."""
    rows = conn.execute(
        "SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_index i "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = to_regclass(%s) AND i.indisunique AND i.indpred IS NULL "
        "GROUP BY i.indexrelid", (str(table),)).fetchall()
    return [list(row[0]) for row in rows]


def check_privileges(conn: Connection, wanted: Mapping[Table, Sequence[str]], *,
                     user: str) -> None:
    """Every privilege ``wanted`` on each table (the target's: :data:`MODE_PRIVILEGES`; the
    marker table's: :data:`MARKER_PRIVILEGES`), each missing one named with its GRANT."""
    missing = [f"{privilege} ON {table}" for table, privileges in wanted.items()
               for privilege in privileges
               if conn.execute("SELECT has_table_privilege(%s, %s)",
                               (str(table), privilege)).fetchone() != (True,)]
    if missing:
        raise ConfigurationError(
            f"user {user!r} lacks {', '.join(missing)}.",
            fix="GRANT " + "; GRANT ".join(f"{m} TO {sql.Identifier(user).as_string()}"
                                           for m in missing))


def not_null_columns(conn: Connection, table: Table) -> list[str]:
    """The columns of ``table`` declared NOT NULL."""
    rows = conn.execute("SELECT column_name FROM information_schema.columns WHERE "
                        "table_schema = %s AND table_name = %s AND is_nullable = 'NO' "
                        "ORDER BY ordinal_position", (table.schema, table.name)).fetchall()
    return [row[0] for row in rows]


def has_column(conn: Connection, table: Table, column: str) -> bool:
    return conn.execute("SELECT 1 FROM information_schema.columns WHERE table_schema = %s "
                        "AND table_name = %s AND column_name = %s",
                        (table.schema, table.name, column)).fetchone() is not None


def check_table(conn: Connection, table: Table, where: str) -> None:
    if not exists(conn, table):
        raise SchemaMismatchError(f"{where} does not exist.",
                                  fix=f"create it (CREATE TABLE {table} (...)) or fix table=")
