"""Tables: names, the DDL of the sink's own tables, and the checks made before anything is written.

``check_schema`` refuses, before a query starts: a server too old for XA, a missing or
non-transactional target table, a column the table lacks, a NOT NULL column without default
that the rows lack, an upsert without a unique key made of written columns (or whose ``key=``
is no PRIMARY or UNIQUE key; ``mode="keyed"``: its key and version columns), ``bulk='load_data'``
against a server that refuses local loads, a user lacking a privilege on the table or on the
sink's own tables (:func:`check_privileges`: every missing one named, with its ``GRANT``), and
(MySQL 8) a user without ``XA_RECOVER_ADMIN``.
It creates the marker (and fence) table if missing: CREATE only what is missing, so a DBA may
create them from :data:`MARKER_TABLE_DDL` / :data:`FENCE_TABLE_DDL` and grant no CREATE right;
so too ``mode="keyed"``'s tombstone table (:mod:`sinks.mysql.keyed`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pymysql

from sinks.mysql.connection import Connection, query, server_version
from sinks.mysql.errors import error_code
from twophase import Column, ConfigurationError, SchemaMismatchError
from twophase.kit import TableColumn
from twophase.kit import check_columns as check_columns_of

log = logging.getLogger(__name__)

TRANSACTIONAL_ENGINES = frozenset({"innodb"})
MIN_MARIADB = (10, 5)
MIN_MYSQL = (8, 0)

MARKER_TABLE_DDL = """CREATE TABLE IF NOT EXISTS {table} (
  txn_id VARCHAR(96) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  namespace VARCHAR(24) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  target_table VARCHAR(200) NOT NULL,
  row_count BIGINT UNSIGNED NOT NULL,
  created_at DATETIME(6) NOT NULL COMMENT 'transaction opened (UTC, from the txn id)',
  prepared_at DATETIME(6) NOT NULL COMMENT 'XA PREPARE (UTC)',
  committed_at DATETIME(6) NULL COMMENT 'set by the committing twophase process (UTC)',
  PRIMARY KEY (txn_id),
  KEY by_namespace_committed (namespace, committed_at)
) ENGINE=InnoDB COMMENT='twophase: one row per XA branch, written inside the branch'"""

FENCE_TABLE_DDL = """CREATE TABLE IF NOT EXISTS {table} (
  namespace VARCHAR(24) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  query CHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  epoch BIGINT UNSIGNED NOT NULL,
  fenced_at DATETIME(6) NOT NULL COMMENT 'last raise of the epoch (UTC)',
  PRIMARY KEY (namespace, query)
) ENGINE=InnoDB COMMENT='twophase: epoch of the newest run of each query'"""


def quote_identifier(name: str) -> str:
    """A MySQL identifier in backticks, any backtick doubled."""
    if not name or "\x00" in name:
        raise ConfigurationError(f"{name!r} is not a usable MySQL identifier.",
                                 fix="name a non-empty table or column without NUL characters")
    return "`" + name.replace("`", "``") + "`"


def column_list(columns: Sequence[str]) -> str:
    return ", ".join(quote_identifier(column) for column in columns)


@dataclass(frozen=True)
class Table:
    """A table of a database; ``str()`` is its quoted, qualified name: `db`.`table`."""

    database: str
    name: str

    def __post_init__(self) -> None:
        quote_identifier(self.database)
        quote_identifier(self.name)

    def __str__(self) -> str:
        return f"{quote_identifier(self.database)}.{quote_identifier(self.name)}"


def create_missing(conn: Connection, tables: Mapping[Table, str]) -> None:
    """CREATE each table from its DDL (``{table}`` in it) unless it exists."""
    for table, ddl in tables.items():
        if table_engine(conn, table) is None:
            log.info("creating %s", table)
            query(conn, ddl.format(table=table))


def table_engine(conn: Connection, table: Table) -> str | None:
    """The table's storage engine, or None if it does not exist."""
    found = query(conn, "SELECT ENGINE FROM information_schema.TABLES "
                        "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                  (table.database, table.name))
    return str(found[0][0] or "") if found else None


def check_server(conn: Connection, address: str) -> None:
    info = conn.get_server_info()
    flavour, version = server_version(info)
    minimum = MIN_MARIADB if flavour == "MariaDB" else MIN_MYSQL
    if version < minimum:
        wanted = ".".join(map(str, minimum))
        raise ConfigurationError(
            f"{flavour} {info} at {address} is too old for XA: prepared branches do not "
            f"survive a disconnect before {flavour} {wanted}.",
            fix=f"upgrade to {flavour} >= {wanted}",
        )


def check_table(conn: Connection, table: Table, address: str) -> None:
    engine = table_engine(conn, table)
    if engine is None:
        raise SchemaMismatchError(
            f"table {table} does not exist on {address}.",
            fix=f"create it (CREATE TABLE {table} (...) ENGINE=InnoDB) or fix table=",
        )
    if engine.lower() not in TRANSACTIONAL_ENGINES:
        raise SchemaMismatchError(
            f"table {table} uses the {engine} engine, which ignores transactions: rows would "
            "be visible before commit and survive an abort.",
            fix=f"ALTER TABLE {table} ENGINE=InnoDB",
        )


def check_columns(conn: Connection, table: Table, columns: Sequence[Column], *,
                  upsert_key: Sequence[str] | None, where: str) -> None:
    """The kit's column checks (:func:`twophase.kit.check_columns`) on the table's catalog;
    ``upsert_key``: None (insert), the key that must be a PRIMARY or UNIQUE key of the table
    made of written columns, or ``()`` for any such key (upsert without ``key=``).

    MySQL names are case-insensitive; instants are stored as their UTC wall-clock time in a
    ``DATETIME`` as in a ``TIMESTAMP`` (every session is in UTC), so zones are not checked."""
    rows = query(conn, "SELECT COLUMN_NAME, IS_NULLABLE, COLUMN_DEFAULT, EXTRA "
                       "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s "
                       "AND TABLE_NAME = %s ORDER BY ORDINAL_POSITION",
                 (table.database, table.name))
    catalog = [TableColumn(str(name), required=nullable == "NO" and default is None
                           and "auto_increment" not in str(extra)
                           and "GENERATED" not in str(extra))
               for name, nullable, default, extra in rows]
    check_columns_of(where, catalog, columns, upsert_key=upsert_key,
                     unique_keys=list(unique_keys(conn, table).values()), case_sensitive=False)


def unique_keys(conn: Connection, table: Table) -> dict[str, list[str]]:
    """The table's PRIMARY and UNIQUE keys: index name -> its columns."""
    rows = query(conn, "SELECT INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS "
                       "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s AND NON_UNIQUE = 0 "
                       "ORDER BY INDEX_NAME, SEQ_IN_INDEX", (table.database, table.name))
    keys: dict[str, list[str]] = {}
    for index, column in rows:
        keys.setdefault(str(index), []).append(str(column))
    return keys


def key_index(conn: Connection, table: Table, key: Sequence[str]) -> str | None:
    """The name of the PRIMARY or UNIQUE index made of exactly the columns ``key`` (names
    compared as MySQL does: case-insensitive), the primary key first; None if there is none."""
    wanted = {name.lower() for name in key}
    found = [index for index, columns in unique_keys(conn, table).items()
             if {name.lower() for name in columns} == wanted]
    return min(found, key=lambda index: index != "PRIMARY", default=None)


#: A table privilege, and the statement whose ``EXPLAIN`` needs exactly it: ``EXPLAIN`` runs
#: a statement's privilege checks without running the statement (``{column}``: one the
#: sink writes or stamps).
PRIVILEGE_PROBES = {
    "SELECT": "EXPLAIN SELECT 1 FROM {table} WHERE FALSE",
    "INSERT": "EXPLAIN INSERT INTO {table} ({column}) VALUES (NULL)",
    "UPDATE": "EXPLAIN UPDATE {table} SET {column} = NULL WHERE FALSE",
    "DELETE": "EXPLAIN DELETE FROM {table} WHERE FALSE",
}
PRIVILEGE_DENIED = frozenset({1142, 1143})


def check_privileges(conn: Connection, wanted: Mapping[Table, tuple[Sequence[str], str]],
                     user: str) -> None:
    """Refuse a user lacking any of ``wanted`` (table: its privileges, and the column the
    probes name), every missing privilege named with its ``GRANT``."""
    missing = [f"{privilege} ON {table}" for table, (privileges, column) in wanted.items()
               for privilege in privileges
               if not _granted(conn, PRIVILEGE_PROBES[privilege].format(
                   table=table, column=quote_identifier(column)))]
    if missing:
        raise ConfigurationError(
            f"user {user!r} lacks {', '.join(missing)}.",
            fix="GRANT " + "; GRANT ".join(f"{m} TO {quote_user(user)}" for m in missing)
            + " (docs/sinks/mysql.md, 'Grants', lists what the sink needs)")


def _granted(conn: Connection, probe: str) -> bool:
    try:
        query(conn, probe)
    except pymysql.err.MySQLError as exc:
        if error_code(exc) in PRIVILEGE_DENIED:
            return False
        raise
    return True


def quote_user(user: str) -> str:
    """``'user'@'%'``: the account as GRANT names it (the host is the DBA's to choose)."""
    return "'" + user.replace("'", "''") + "'@'%'"


def check_local_infile(conn: Connection, address: str) -> None:
    if not query(conn, "SELECT @@GLOBAL.local_infile")[0][0]:
        raise ConfigurationError(
            f"bulk='load_data' but the server {address} refuses LOAD DATA LOCAL.",
            fix="SET GLOBAL local_infile=1, or use bulk='auto' or 'insert'",
        )
