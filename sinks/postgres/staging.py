"""The staged mode (``PostgresSink(..., publish="staged")``): rows staged per transaction, then
published by the driver in ONE local transaction, which other publishers of the same database
may share (an Iceberg table whose SQL catalog lives there: :class:`twophase.kit.LocalCommitMember`).

Why: PostgreSQL makes one transaction visible at once. Prepared transactions (the default mode)
commit partition by partition, so neither their batch nor a lake table's catalog swap become
visible in one instant. Staged, they do: the executors' transactions only stage, and the
publishing transaction moves a batch's staged rows into the table, writes the proof, and (in a
sink group) swaps the lake catalog's pointer, committed once.

==========  ==========================================  =====================================
phase       what it does                                what a crash leaves
==========  ==========================================  =====================================
begin       a session; ``set_config('twophase.txn',     an open session: ends with it
            <txn id>, true)``
write       ``COPY`` into the staging table (the        an open transaction: ends with its
            target's columns, its defaults and CHECK    session
            constraints; the txn id column defaults
            to the session's setting)
pre-commit  the marker is not there (an id used once    committed: the staged rows, durable,
            is refused), ``COMMIT``                     invisible to readers of the target;
                                                        no handle names them: listed in
                                                        doubt, aborted
commit      one local transaction: the markers of the   nothing (rolled back), or the batch
(driver)    handles (proof: ALREADY_COMMITTED), else    published whole: rows in the target,
            ``WITH moved AS (DELETE FROM staging ...    staged rows gone, markers written
            RETURNING *) INSERT INTO target SELECT``,   (stamped committed)
            the markers; ``COMMIT``
abort       ``DELETE`` the transaction's staged rows    the rows deleted, or still staged
==========  ==========================================  =====================================

In doubt: the transaction ids that have staged rows (``list_in_doubt``), never an open
transaction's (invisible until the executor commits, and ended with its session).

The keyed mode (``mode="keyed"``, :mod:`~sinks.postgres.keyed`) changes two rows: write stages
the rows as they came, the delete marker replaced by the boolean ``_twophase_deleted`` and
numbered by ``_twophase_seq`` (an identity: the order of a task's rows); commit moves the
batch's staged rows into a temporary table and applies them with
:func:`twophase.kit.sql.keyed_apply_statements` (newest version per key, no older change applied,
deletes with tombstones) in place of the plain ``INSERT ... SELECT``. Its staging table also
takes a delete's NULLs in the target's NOT NULL columns (a CHECK refuses them in other rows)
and refuses NULL keys and versions. No row is locked before the decision, so one key may be
written by many tasks of a batch: its rows need no routing by key.

What the staged mode does not do: upsert (one ``INSERT ... SELECT`` cannot update a key twice:
the keyed mode can); it checks the target's unique keys only at publication, after the
decision: a row whose key the target already holds makes the batch's commit fail (fatal, the
batch not published: fix the table, then recovery publishes it), where a prepared transaction
would fail its partition before the decision. The staging table gets the target's columns,
defaults and CHECK constraints (``LIKE``), not its keys; it is created by ``check_schema`` (or
by a DBA from :func:`staging_ddl` and, keyed, :func:`keyed_staging_ddl`); the sink's user needs
SELECT, INSERT, DELETE on it, and TEMPORARY on the database in the keyed mode (granted to
PUBLIC by default).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Literal

from psycopg import sql

from sinks.postgres.connection import Connection
from sinks.postgres.errors import lost_staged
from sinks.postgres.keyed import (
    SEQ_COLUMN,
    SOURCE_TABLE,
    apply_staged,
)
from sinks.postgres.schema import MAX_IDENTIFIER, Table, exists, has_column, not_null_columns
from twophase import CommitOutcome, ConfigurationError, Handle, RetryableError, TxnId
from twophase.kit import DELETED_FLAG, KEYED, Keyed, validate_namespace

if TYPE_CHECKING:
    from sinks.postgres.committer import PostgresCommitter

log = logging.getLogger(__name__)

Publish = Literal["prepared", "staged"]
PUBLISH_MODES: tuple[Publish, ...] = ("prepared", "staged")
#: The staging table's column naming each row's transaction.
TXN_COLUMN = "_twophase_txn"
#: The session setting the txn column defaults to (set for the writer's transaction).
TXN_SETTING = "twophase.txn"
STAGING_PREFIX = "_twophase_staged_"


def validate_publish(sink: str, publish: str, mode: str) -> Publish:
    if publish not in PUBLISH_MODES:
        raise ConfigurationError(f"{sink}: unknown publish={publish!r}.",
                                 fix="use publish='prepared' (the default) or 'staged'")
    if publish == "staged" and mode not in ("insert", KEYED):
        raise ConfigurationError(
            f"{sink}: publish='staged' takes mode='insert' or mode='keyed' (one INSERT ... "
            "SELECT cannot update a key twice).",
            fix="use mode='keyed' with version= (the newest change of each key wins), or "
                "publish='prepared' to upsert")
    return "staged" if publish == "staged" else "prepared"


def staging_table_of(target: Table) -> Table:
    """The default staging table beside ``target``: ``_twophase_staged_<table>`` (cut to 63
    bytes)."""
    name = f"{STAGING_PREFIX}{target.name}".encode()[:MAX_IDENTIFIER].decode(errors="ignore")
    return Table(target.schema, name)


def staging_ddl(staging: Table, target: Table) -> sql.Composed:
    index = sql.Identifier(f"{staging.name[:MAX_IDENTIFIER - 4]}_txn")
    return sql.SQL(
        "CREATE TABLE IF NOT EXISTS {staging} (LIKE {target} INCLUDING DEFAULTS "
        "INCLUDING CONSTRAINTS, {txn} text NOT NULL DEFAULT current_setting({setting}));"
        "CREATE INDEX IF NOT EXISTS {index} ON {staging} ({txn});"
        "COMMENT ON TABLE {staging} IS 'twophase: rows staged per transaction, until published "
        "into {target_name} or aborted'").format(
        staging=staging.ident, target=target.ident, txn=sql.Identifier(TXN_COLUMN),
        setting=sql.Literal(TXN_SETTING), index=index,
        target_name=sql.SQL(str(target).replace("'", "''")))


def keyed_staging_ddl(staging: Table, keyed: Keyed, not_null: Sequence[str]) -> sql.Composed:
    """What the keyed mode adds to the staging table: the delete flag, the rows' order, NOT
    NULL key and version columns, and the target's other NOT NULL columns (``not_null``) NULL
    in a delete only."""
    flag = sql.Identifier(DELETED_FLAG)
    required = (*keyed.key, keyed.version)
    relaxed = [name for name in not_null if name not in required]
    changes = [
        sql.SQL("ADD COLUMN IF NOT EXISTS {} boolean NOT NULL DEFAULT false").format(flag),
        sql.SQL("ADD COLUMN IF NOT EXISTS {} bigint GENERATED BY DEFAULT AS IDENTITY").format(
            sql.Identifier(SEQ_COLUMN)),
        *(sql.SQL("ALTER COLUMN {} SET NOT NULL").format(sql.Identifier(name))
          for name in required),
        *(sql.SQL("ALTER COLUMN {} DROP NOT NULL").format(sql.Identifier(name))
          for name in relaxed)]
    checks = [sql.SQL("ALTER TABLE {} ADD CHECK ({} OR {} IS NOT NULL)").format(
        staging.ident, flag, sql.Identifier(name)) for name in relaxed]
    return sql.SQL(";").join([
        sql.SQL("ALTER TABLE {} ").format(staging.ident) + sql.SQL(", ").join(changes),
        *checks])


def create_missing_staging(conn: Connection, staging: Table, target: Table,
                           keyed: Keyed | None = None) -> None:
    """The staging table unless it exists; keyed, with :func:`keyed_staging_ddl` unless it
    has the delete flag."""
    if not exists(conn, staging):
        log.info("creating %s", staging)
        conn.execute(staging_ddl(staging, target))
    if keyed is not None and not has_column(conn, staging, DELETED_FLAG):
        log.info("adding the keyed mode's columns to %s", staging)
        conn.execute(keyed_staging_ddl(staging, keyed, not_null_columns(conn, target)))


def begin_staging(conn: Connection, txn_id: TxnId) -> None:
    """Name the writer's transaction: its staged rows take this id."""
    conn.execute("SELECT set_config(%s, %s, true)", (TXN_SETTING, str(txn_id)))


def staged_in(conn: Connection, staging: Table, namespace: str) -> list[TxnId]:
    """The transaction ids of ``namespace`` with staged rows."""
    prefix = f"{validate_namespace(namespace)}."
    rows = conn.execute(sql.SQL("SELECT DISTINCT {txn} FROM {staging} WHERE starts_with({txn}, "
                                "%s) ORDER BY 1").format(txn=sql.Identifier(TXN_COLUMN),
                                                         staging=staging.ident),
                        (prefix,)).fetchall()
    return [TxnId.parse(row[0]) for row in rows]


def delete_staged(conn: Connection, staging: Table, txn_id: TxnId) -> int:
    cursor = conn.execute(sql.SQL("DELETE FROM {} WHERE {} = %s").format(
        staging.ident, sql.Identifier(TXN_COLUMN)), (str(txn_id),))
    return cursor.rowcount


def move_staged(conn: Connection, staging: Table, into: sql.Composable,
                columns: Sequence[str], ids: list[str]) -> dict[str, int]:
    """Staged rows of ``ids`` (their ``columns``) into ``into``, deleted from staging, in one
    statement; how many rows each transaction had."""
    names = _names(columns)
    statement = sql.SQL(
        "WITH moved AS (DELETE FROM {staging} WHERE {txn} = ANY(%s) RETURNING *), "
        "published AS (INSERT INTO {into} ({names}) SELECT {names} FROM moved) "
        "SELECT {txn}, count(*) FROM moved GROUP BY 1").format(
        staging=staging.ident, txn=sql.Identifier(TXN_COLUMN), into=into, names=names)
    return {txn: int(count) for txn, count in conn.execute(statement, (ids,))}


def _names(columns: Sequence[str]) -> sql.Composed:
    return sql.SQL(", ").join(map(sql.Identifier, columns))


def columns_of(handle: Handle) -> list[str]:
    columns = handle.data.get("columns")
    if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
        raise ConfigurationError(f"the handle of {handle.txn_id} names no staged columns.",
                                 fix="the handle is damaged or not from a staged PostgresSink")
    return columns


class StagedPublisher:
    """The staged sink's :class:`twophase.kit.LocalCommitMember` (its committer's
    ``local_commit()``): publishes a batch inside a local transaction of its database."""

    def __init__(self, committer: PostgresCommitter) -> None:
        self.committer = committer
        self.sink = committer.sink

    def local_domain(self) -> str | None:
        server = self.sink.server
        return f"postgresql://{server.host}:{server.port}/{server.database}"

    @contextlib.contextmanager
    def local_transaction(self) -> Iterator[Connection]:
        """A pooled session in one transaction, committed at the end of the block."""
        with self.committer.session("publishing staged transactions") as conn, \
                conn.transaction():
            yield conn

    def settle_in(self, connection: Connection, handles: Sequence[Handle]
                  ) -> Mapping[TxnId, CommitOutcome]:
        """Prove or publish ``handles`` in ``connection``'s transaction (module docstring)."""
        markers, target = self.sink.markers, self.sink.target
        ids = [str(handle.txn_id) for handle in handles]
        proven = {row[0] for row in connection.execute(
            markers.statement("SELECT txn_id FROM {} WHERE txn_id = ANY(%s)"), (ids,)).fetchall()}
        pending = [handle for handle in handles if str(handle.txn_id) not in proven]
        moved: dict[str, int] = {}
        by_columns: dict[tuple[str, ...], list[Handle]] = {}
        for handle in pending:
            if handle.rows:
                by_columns.setdefault(tuple(columns_of(handle)), []).append(handle)
        for columns, group in by_columns.items():
            moved.update(self._move(connection, columns, [str(h.txn_id) for h in group]))
        if short := [handle for handle in pending if moved.get(str(handle.txn_id), 0)
                     != handle.rows]:
            self._refuse(connection, short[0], moved.get(str(short[0].txn_id), 0))
        for handle in pending:
            markers.insert(connection, handle.txn_id, target=target, rows=handle.rows,
                           where=self.sink.where, committed=True)
        outcomes = {handle.txn_id: CommitOutcome.ALREADY_COMMITTED for handle in handles
                    if str(handle.txn_id) in proven}
        outcomes.update({handle.txn_id: CommitOutcome.COMMITTED for handle in pending})
        return outcomes

    def _move(self, connection: Connection, columns: Sequence[str], ids: list[str]
              ) -> dict[str, int]:
        """Staged rows of ``ids`` published (keyed: applied), deleted from staging; how many
        rows each transaction had."""
        keyed, sink = self.sink.keyed, self.sink
        if keyed is None:
            return move_staged(connection, sink.staging, sink.target.ident, columns, ids)
        source, staged = sql.Identifier(SOURCE_TABLE), [*keyed.flagged_columns(columns),
                                                         SEQ_COLUMN]
        connection.execute(sql.SQL("CREATE TEMPORARY TABLE {} AS SELECT {} FROM {} WITH NO DATA"
                                   ).format(source, _names(staged), sink.staging.ident))
        moved = move_staged(connection, sink.staging, source, staged, ids)
        apply_staged(connection, keyed, source=source, target=sink.target,
                     tombstones=sink.tombstones, columns=keyed.written(columns))
        connection.execute(sql.SQL("DROP TABLE {}").format(source))
        return moved

    def _refuse(self, connection: Connection, handle: Handle, found: int) -> None:
        """A decided transaction's staged rows are not (all) there: a racing publisher took
        them (retry: its markers prove them), else the transaction is lost."""
        raced = connection.execute(  # read committed: a new snapshot sees a racer's markers
            self.sink.markers.statement("SELECT 1 FROM {} WHERE txn_id = %s"),
            (str(handle.txn_id),)).fetchone() is not None
        if raced:
            raise RetryableError(
                f"transaction {handle.txn_id} was published by another committer meanwhile.",
                fix="retried automatically: the retry finds its proof")
        raise lost_staged(handle, found, where=self.sink.where,
                          staging=str(self.sink.staging))
