"""The two bulk statements: ``LOAD DATA LOCAL INFILE`` and multi-row ``INSERT``.

In ``insert`` mode the sink loads each chunk of rows with ``LOAD DATA LOCAL INFILE`` from a
private temporary file (PyMySQL sends local files by name): measured 2-2.5x faster than
PyMySQL's multi-row ``INSERT`` (see ``bench/mysql_xa.py``). ``LOAD DATA LOCAL`` implies IGNORE:
it turns row errors (duplicate key, NULL into NOT NULL, truncation) into *warnings* and skips
the row, so every load checks the affected-row and warning counts and fails the branch on any
warning. ``upsert`` mode uses ``INSERT ... ON DUPLICATE KEY UPDATE`` (``LOAD DATA`` cannot
update); so does ``bulk="insert"``, and ``bulk="auto"`` once the server refuses local loads;
``keyed`` mode loads each chunk's newest changes into a temporary table the same two ways and
applies them with ``INSERT ... SELECT ... ON DUPLICATE KEY UPDATE`` (:func:`insert_selected`),
each assignment guarded by the version (see :mod:`sinks.mysql.keyed`).
Enabling local loads lets the server ask the client for any file it can read (PyMySQL does not
check the name the server asks for): use ``bulk="insert"`` with servers you do not trust.

Both functions are used by ``bench/mysql_xa.py`` for its plain baselines too.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Sequence
from typing import Any

from sinks.mysql.connection import CHARSET, Connection
from sinks.mysql.errors import DEPRECATED_SYNTAX, rejected_rows
from sinks.mysql.schema import Table, column_list, quote_identifier

#: Bytes LOAD DATA reads; a bytes-like object (bytes, memoryview, a pyarrow Buffer).
Text = Any


def load_tsv(conn: Connection, target: Table | str, columns: Sequence[str], parts: Iterable[Text],
             *, rows: int, what: str) -> None:
    """``LOAD DATA LOCAL INFILE`` the text ``parts`` (``rows`` rows in all) into ``target``."""
    with tempfile.NamedTemporaryFile(prefix="twophase-", suffix=".tsv") as spool:
        for part in parts:
            spool.write(part)
        spool.flush()
        sql = (f"LOAD DATA LOCAL INFILE {conn.escape(spool.name)} INTO TABLE {target} "
               f"CHARACTER SET {CHARSET} FIELDS TERMINATED BY X'09' ESCAPED BY X'5C' "
               f"LINES TERMINATED BY X'0A' ({column_list(columns)})")
        with conn.cursor() as cursor:
            affected = cursor.execute(sql)
            _check_warnings(cursor, expected=rows, affected=affected, what=what)


def insert_rows(conn: Connection, target: Table | str, columns: Sequence[str],
                rows: Sequence[Sequence[Any]], *, upsert: bool, what: str,
                on_duplicate: str | None = None) -> None:
    """Multi-row ``INSERT`` (PyMySQL's executemany packs rows up to ~1 MB per statement).

    ``upsert``: ``ON DUPLICATE KEY UPDATE`` every column to the new row's value, or as the
    assignments ``on_duplicate`` (SQL, no parameters) say."""
    placeholders = ", ".join(["%s"] * len(columns))
    sql = f"INSERT INTO {target} ({column_list(columns)}) VALUES ({placeholders})"
    if upsert:
        sql += " ON DUPLICATE KEY UPDATE " + (on_duplicate or ", ".join(
            f"{quote_identifier(c)} = VALUES({quote_identifier(c)})" for c in columns))
    with conn.cursor() as cursor:
        affected = cursor.executemany(sql, rows)
        _check_warnings(cursor, expected=None if upsert else len(rows), affected=affected,
                        what=what)


def insert_selected(conn: Connection, target: Table, select: str, *, columns: Sequence[str],
                    on_duplicate: str, what: str) -> None:
    """``INSERT INTO target (columns) <select> ON DUPLICATE KEY UPDATE <on_duplicate>``: rows
    the server holds already (SQL, no parameters)."""
    sql = (f"INSERT INTO {target} ({column_list(columns)}) {select} "
           f"ON DUPLICATE KEY UPDATE {on_duplicate}")
    with conn.cursor() as cursor:
        affected = cursor.execute(sql)
        _check_warnings(cursor, expected=None, affected=affected, what=what)


def _check_warnings(cursor: Any, *, expected: int | None, affected: int, what: str) -> None:
    """Fail on any warning (LOAD DATA LOCAL downgrades row errors to warnings) or lost row."""
    if cursor.warning_count == 0 and expected in (None, affected):
        return
    cursor.execute("SHOW WARNINGS")
    warnings = [(code, message) for _level, code, message in cursor.fetchall()
                if code != DEPRECATED_SYNTAX]
    if not warnings and expected in (None, affected):
        return
    raise rejected_rows(warnings, affected=affected, expected=expected, what=what)
