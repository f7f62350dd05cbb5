"""PostgreSQL sink: one prepared transaction per partition, committed by the driver.

Every partition's slice of a micro-batch is written in one transaction of its own session,
with a marker row (:mod:`~sinks.postgres.markers`, the proof of commit), and prepared under
the gid ``tph.<txn id>`` (:mod:`~sinks.postgres.prepared`); the session then closes, and any
other session of the same user (the driver, recovery, cleanup) resolves it.

What a crash leaves behind, phase by phase (client crash = executor or driver process killed;
a server crash rolls back every transaction that is not prepared and keeps every prepared one):

==========  ==================  =====================  =====================  =====================
phase       calls               a crash here leaves    resolved by            raises
==========  ==================  =====================  =====================  =====================
begin       connect (UTC,       an open session, no    the server: the        RetryableError (no
            lock and idle       rows                   transaction ends with  server, lost
            timeouts)                                  its session            connection: begin is
                                                                              retried),
                                                                              ConfigurationError
                                                                              (login, TLS)
write       ``COPY`` (Arrow's   an open transaction    the server, as above   SchemaMismatchError
            CSV in one          holding row locks      (idle-in-transaction   (a row refused, an
            statement, or rows  until its session      timeout if the client  unsendable value),
            per ``chunk_size``) ends                   host vanished); Spark  RetryableError (lock
            or ``INSERT ... ON                         re-runs the task       timeout: the holder
            CONFLICT``; keyed:                                                named, lost
            per chunk the                                                     connection),
            keys' versions                                                    FatalError (a lock
            ``FOR UPDATE``,                                                   of a prepared
            ``DELETE``,                                                       transaction of the
            tombstones, the                                                   same batch: not
            version-guarded                                                   routed by key)
            upsert
pre-commit  marker ``INSERT``,  before PREPARE         an orphan (prepared,   FatalError (the id
            ``PREPARE           returns: as write, or  no handle in any       was committed once),
            TRANSACTION``,      (reply lost) a         decision) is aborted   ConfigurationError
            close               prepared transaction   by the driver's sweep  (no marker table,
                                no handle names.       or by                  prepared
                                After: PREPARED:       ``twophase.cleanup``;  transactions
                                durable, invisible,    its gid names query,   disabled),
                                row locks held,        batch and creation     RetryableError
                                listed in              time
                                ``pg_prepared_xacts``
commit      ``COMMIT            before: still          driver recovery        TransactionLostError
            PREPARED``, stamp   prepared. After:       commits again: 42704   (rolled back, no
            ``committed_at``    visible; the marker    + marker row =         marker),
                                says so (the stamp     ALREADY_COMMITTED,     RetryableError
                                follows on recovery)   and stamps it
abort       ``ROLLBACK          rolled back, or still  repeat it: 42704       RetryableError
            PREPARED``          prepared               means NOT_FOUND
==========  ==================  =====================  =====================  =====================

In doubt: the committer's ``list_in_doubt`` lists the prepared transactions of the namespace in
the sink's database (``pg_prepared_xacts``). An unprepared transaction is never listed: it cannot be
named by id (``application_name`` holds 63 bytes, an id up to 92) and it ends with its
session, so the server rolls it back when the writer dies or disconnects, and after
``WRITER_IDLE_TIMEOUT_S`` idle if the writer's host vanished (half-open connection).

Staged (``publish="staged"``, :mod:`~sinks.postgres.staging`): the partitions COPY into a
staging table and commit (durable, invisible); the driver publishes a batch in ONE local
transaction (rows moved, markers written), which an Iceberg table's catalog swap in the same
database can share (a sink group: both visible in the same instant). No prepared transaction.

Keyed (``mode="keyed"``, :mod:`~sinks.postgres.keyed`): the latest state of each key by
version, deletes kept as tombstones in ``_twophase_tombstones_<table>`` (the rules:
:mod:`twophase._keyed`). Prepared, a task's keyed writes lock the rows of its keys until the
decision, so every key of a batch must reach one task: :meth:`PostgresSink.route_key` names
the key, and ``twophase.spark`` routes the rows by it. A task that waits on another task's
prepared transaction all the same (``route_by_key=False`` over a stream that is not keyed)
fails after ``lock_timeout_s`` with an error naming that transaction
(:mod:`~sinks.postgres.locks`): no lock wait is unbounded unless ``lock_timeout_s=None`` is
passed. Staged, the publishing transaction applies the batch's changes in SQL; no routing is
needed.

Fencing: none beyond the state file's epoch, for the reason given in
:mod:`~sinks.postgres.committer`. Privileges: INSERT (+SELECT, UPDATE for upsert; SELECT,
INSERT, UPDATE, DELETE for keyed, on the tombstone table too) on the table; SELECT, INSERT,
UPDATE, DELETE on the marker table (CREATE once, or create it from ``MARKER_TABLE_DDL``).
``COMMIT PREPARED`` needs the same user that prepared (or a superuser). The server needs
``max_prepared_transactions`` > 0 (checked at the start).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, cast

import psycopg

from sinks.postgres import schema
from sinks.postgres.bulk import copy_batches, copy_rows, upsert_rows
from sinks.postgres.committer import PostgresCommitter
from sinks.postgres.connection import (
    DEFAULT_LOCK_TIMEOUT_S,
    RESERVED_CONNECT_ARGS,
    URL,
    Connection,
    Server,
    SslMode,
    close_quietly,
    tls_settings,
)
from sinks.postgres.errors import SYSTEM, classify_unprepared, wrong_width
from sinks.postgres.keyed import (
    KeyedWriter,
    create_missing_tombstones,
    tombstones_of,
)
from sinks.postgres.locks import classify_lock_wait
from sinks.postgres.markers import DEFAULT_MARKER_TABLE, Markers
from sinks.postgres.prepared import gid_of, prepare
from sinks.postgres.schema import MARKER_PRIVILEGES, MODE_PRIVILEGES, Table
from sinks.postgres.staging import (
    Publish,
    begin_staging,
    create_missing_staging,
    staging_table_of,
    validate_publish,
)
from twophase import (
    Column,
    ConfigurationError,
    FatalError,
    Handle,
    TransactionContext,
    TwoPhaseCommitSink,
    TwoPhaseError,
    TxnId,
)
from twophase.kit import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_TOMBSTONE_RETENTION_S,
    HELD_CHUNKS,
    KEYED,
    Keyed,
    Mode,
    NamespaceOfTarget,
    SecretOption,
    TlsMode,
    batch_chunks,
    chunks,
    classified,
    renamed_option,
    rows_of,
    transaction_id_reused,
    validate_chunk_size,
    validate_keyed,
    validate_mode,
)
from twophase.kit.sql import ConnectionOption

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

DEFAULT_SCHEMA = "public"


@dataclass
class PostgresTransaction:
    """One partition's open transaction (lives on the executor between begin and pre-commit)."""

    txn_id: TxnId
    columns: tuple[str, ...]
    conn: Connection | None
    rows: int = 0
    #: The keyed mode's writes (prepared), made at the first chunk.
    keyed: KeyedWriter | None = None


class PostgresSink(NamespaceOfTarget, TwoPhaseCommitSink[PostgresTransaction]):
    """Exactly-once rows into one PostgreSQL table, one prepared transaction per partition.

    ``host``/``port``/``user``/``password``/``database``: where to connect (TCP); ``password``
    is the clear text or a :class:`twophase.Secret` (``Secret(env=...)``, ``Secret(file=...)``),
    read in the process that connects, when it connects (the pickled sink holds the reference).
    ``connection``: the same, and the TLS options and ``connect_timeout_s``, as one value
    instead (:class:`twophase.kit.sql.ConnectionUrl`): a URL
    ``postgresql://user[:password]@host[:port]/database?tls=verify&ca_bundle=/ca.pem`` (or
    ``postgres://``; user and password percent-encoded; the query takes ``tls``,
    ``ca_bundle``, ``client_cert``, ``client_key``, ``connect_timeout_s``, not libpq's
    ``sslmode``), a :class:`twophase.Secret` holding such a URL (read as the sink is made; its
    password stays a reference, read at every connection) or a mapping of those options
    (``{"host": ..., "user": ..., ...}``). Beside it, ``password`` may give a password the
    connection lacks (credentials apart).
    ``table`` (in ``schema``): the target; it must exist. ``mode``: ``"insert"`` (COPY; a
    repeated key is an error), ``"upsert"`` (``INSERT ... ON CONFLICT (key) DO UPDATE``, the
    last row wins; ``key`` must be a unique key of the table) or ``"keyed"`` (the latest state
    of each key, :mod:`sinks.postgres.keyed`): ``key`` a PRIMARY or UNIQUE key of the table,
    ``version`` a column of the table that increases per key (a change applies only if newer
    than the key's row or tombstone), ``deleted`` a column of the rows (not of the table: read,
    never written) that marks a delete (a boolean, or Debezium's ``op``: ``'d'``), None if the
    stream has no deletes; ``tombstone_retention_s`` how long a deleted key's tombstone is kept
    (purged by ``python -m twophase.cleanup``). ``chunk_size``: rows per statement (keyed,
    prepared: a task's rows reduced to the newest change per key, applied every
    :data:`~twophase.kit.HELD_CHUNKS` ``* chunk_size`` keys).
    ``publish``: ``"prepared"`` (one prepared transaction per partition; keyed: rows routed by
    key, :meth:`route_key`) or ``"staged"`` (rows staged in ``staging_table``, default
    ``_twophase_staged_<table>``, published by the driver in one local transaction: see
    :mod:`sinks.postgres.staging`; insert and keyed modes). ``tls``: ``"verify"`` (the
    default: the certificate must come from a CA of ``ca_bundle``, libpq's ``sslrootcert``, and
    name ``host``), ``"require"`` (encrypted, not verified) or ``"off"`` (plain text); libpq's
    ``prefer``/``allow`` (a silent fall back to plain text) are not offered.
    ``client_cert``/``client_key``: the client certificate and its key (PEM files, libpq's
    ``sslcert``/``sslkey``) for a ``clientcert=`` line of ``pg_hba.conf``: mutual TLS. (The
    TLS options are every prebuilt sink's; the former ``sslmode=`` works and warns until
    0.6.0.) ``lock_timeout_s``: how long a statement of the sink's sessions waits for a
    lock (``lock_timeout``) before it fails naming the holder: ``DEFAULT_LOCK_TIMEOUT_S`` (50 s)
    unless given; None, passed explicitly, leaves the server's setting (by default no limit:
    a keyed task waiting on another task's prepared transaction would hang its batch).
    ``connect_args``: further libpq options (not TLS: that is ``tls=`` and its options).
    """

    kind: ClassVar[str] = "postgres"

    def __init__(
        self,
        *,
        table: str,
        connection: ConnectionOption | None = None,
        host: str | None = None,
        user: str | None = None,
        password: SecretOption | None = None,
        database: str | None = None,
        schema: str = DEFAULT_SCHEMA,
        port: int | None = None,
        mode: Mode = "insert",
        key: Sequence[str] = (),
        version: str | None = None,
        deleted: str | None = None,
        tombstone_retention_s: float = DEFAULT_TOMBSTONE_RETENTION_S,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        marker_table: str = DEFAULT_MARKER_TABLE,
        tls: TlsMode | None = None,
        ca_bundle: str | None = None,
        client_cert: str | None = None,
        client_key: str | None = None,
        connect_timeout_s: float | None = None,
        lock_timeout_s: float | None = DEFAULT_LOCK_TIMEOUT_S,
        connect_args: Mapping[str, Any] | None = None,
        publish: Publish = "prepared",
        staging_table: str | None = None,
        sslmode: SslMode | None = None,
    ) -> None:
        former_tls: SslMode | None = renamed_option(
            SYSTEM, "sslmode", sslmode, "tls", None,
            same="'verify' for 'verify-full', 'off' for 'disable'")
        libpq_args = dict(connect_args or {})
        client_cert = renamed_option(SYSTEM, "connect_args['sslcert']",
                                     libpq_args.pop("sslcert", None), "client_cert", client_cert)
        client_key = renamed_option(SYSTEM, "connect_args['sslkey']",
                                    libpq_args.pop("sslkey", None), "client_key", client_key)
        #: Where and how to connect (``repr`` shows it): the password a reference if given so.
        self.connection_settings = settings = URL.settings(
            connection, host=host, port=port, user=user, password=password, database=database,
            tls=tls, ca_bundle=ca_bundle, client_cert=client_cert, client_key=client_key,
            connect_timeout_s=connect_timeout_s, also={"sslmode": former_tls})
        self.mode = validate_mode(SYSTEM, mode, key)
        self.keyed = validate_keyed(SYSTEM, self.mode, key, version, deleted,
                                    tombstone_retention_s=tombstone_retention_s)
        self.publish = validate_publish(SYSTEM, publish, self.mode)
        self.key = tuple(key)
        self.chunk_size = validate_chunk_size(SYSTEM, chunk_size)
        if reserved := sorted(RESERVED_CONNECT_ARGS & set(libpq_args)):
            raise ConfigurationError(f"{SYSTEM}: connect_args {reserved} are set by the sink "
                                     "itself.", fix="pass them as the sink's own options")
        self.server = Server(host=settings.host, port=settings.port, user=settings.user,
                             password=settings.password, database=settings.database,
                             **tls_settings(settings.tls, settings.ca_bundle,
                                            settings.client_cert, settings.client_key,
                                            former_tls),
                             connect_timeout_s=settings.connect_timeout_s,
                             lock_timeout_s=lock_timeout_s,
                             connect_args=libpq_args)
        self.table = table
        self.target = Table(schema, table)
        self.markers = Markers(Table(schema, marker_table))
        self.staging = (Table(schema, staging_table) if staging_table
                        else staging_table_of(self.target))
        #: The keyed mode's deleted keys (key, version, ``deleted_at``).
        self.tombstones = tombstones_of(self.target)

    def __repr__(self) -> str:
        server = self.server
        return (f"PostgresSink({self.connection_settings.shown()}, "
                f"table={str(self.target)!r}, mode={self.mode!r}, tls={server.tls.mode!r})")

    @property
    def where(self) -> str:
        """The target, as messages name it."""
        return f"table {self.target} on PostgreSQL server {self.server.address}"

    def target_name_and_place(self) -> tuple[str, ...]:
        """The table's name, its database and its schema (a server's prepared transactions are
        listed across its databases)."""
        return (self.table, self.server.database, self.target.schema)

    # -- driver: schema ------------------------------------------------------------------------

    def check_schema(self, columns: Sequence[Column]) -> None:
        """Check the server, the table, its columns, key and privileges; create the marker
        table (staged: the staging table; keyed: the tombstone table) if missing (see
        :mod:`sinks.postgres.schema`). Keyed, the rows must have the key, version and delete
        marker columns; the table is checked for the written ones (not the marker)."""
        written = self._written_columns(columns)
        with self.server.session(f"checking {self.target}") as conn:
            if self.publish == "prepared":
                schema.check_prepared_transactions(conn, self.server.address)
            schema.check_table(conn, self.target, self.where)
            schema.create_missing_markers(conn, self.markers.table)
            # before the columns: a user without privileges on the table sees none of them
            schema.check_privileges(conn, {self.target: MODE_PRIVILEGES[self.mode],
                                           self.markers.table: MARKER_PRIVILEGES},
                                    user=self.server.user)
            schema.check_columns_of(conn, self.target, written,
                                    upsert_key=self.key if self.mode != "insert" else None,
                                    where=self.where)
            self._create_own_tables(conn)
            if self.keyed is not None:
                schema.check_privileges(conn, {self.tombstones: MODE_PRIVILEGES[KEYED]},
                                        user=self.server.user)

    def _written_columns(self, columns: Sequence[Column]) -> Sequence[Column]:
        """The columns written into the table: keyed, all but the delete marker (the rows
        checked for the key, version and marker first)."""
        if self.keyed is None:
            return columns
        self.keyed.check_columns(self.where, columns)
        return [column for column in columns if column.name != self.keyed.deleted]

    def _create_own_tables(self, conn: Connection) -> None:
        """The staging table (staged) and the tombstone table (keyed), unless they exist."""
        if self.publish == "staged":
            create_missing_staging(conn, self.staging, self.target, self.keyed)
        if self.keyed is not None:
            create_missing_tombstones(conn, self.tombstones, self.target, self.keyed)

    def route_key(self) -> tuple[str, ...] | None:
        """Keyed and prepared, the key: a task's writes lock its keys' rows until the
        decision, so every key of a batch must be written by one task (else None)."""
        if self.keyed is not None and self.publish == "prepared":
            return self.keyed.key
        return None

    # -- executor: begin, write, pre-commit ----------------------------------------------------

    def begin_transaction(self, ctx: TransactionContext) -> PostgresTransaction:
        if self.keyed is not None:
            self.keyed.check_rows(self.where, ctx.column_names)
        conn = self.server.connect(autocommit=False, writer=True)
        txn = PostgresTransaction(ctx.txn_id, ctx.column_names, conn)
        if self.publish == "staged":
            with self._guard(txn, "beginning"):
                begin_staging(conn, ctx.txn_id)
        return txn

    @property
    def written(self) -> Table:
        """Where the executors write: the target, or (staged) the staging table."""
        return self.staging if self.publish == "staged" else self.target

    @property
    def copies(self) -> bool:
        """Whether the executors COPY their rows (insert mode, or staged), or else write them
        by statements (upsert, keyed prepared)."""
        return self.mode == "insert" or self.publish == "staged"

    def write(self, txn: PostgresTransaction, rows: Iterable[Sequence[Any]]) -> None:
        conn = self._open(txn)
        with self._guard(txn, "writing"):
            received = self._received(txn, chunks(rows, self.chunk_size))
            if self.copies or self.keyed is None:
                for chunk in received:
                    self._write_chunk(txn, conn, chunk)
            else:
                self._keyed_writer(txn, conn).apply_rows(received,
                                                         HELD_CHUNKS * self.chunk_size)

    def _received(self, txn: PostgresTransaction, received: Iterable[Sequence[Sequence[Any]]]
                  ) -> Iterator[Sequence[Sequence[Any]]]:
        """The chunks of rows a task receives, each checked for its width and counted."""
        for chunk in received:
            if misfit := next((len(row) for row in chunk if len(row) != len(txn.columns)), None):
                raise wrong_width(misfit, txn.columns)
            txn.rows += len(chunk)
            yield chunk

    def _write_chunk(self, txn: PostgresTransaction, conn: Connection,
                     chunk: Sequence[Sequence[Any]]) -> None:
        if self.copies and self.keyed is not None:
            copy_rows(conn, self.written, self.keyed.flagged_columns(txn.columns),
                      self.keyed.flagged_rows(chunk, txn.columns))
        elif self.copies:
            copy_rows(conn, self.written, txn.columns, chunk)
        else:
            upsert_rows(conn, self.target, txn.columns, self.key, chunk)

    def write_arrow(self, txn: PostgresTransaction, batches: Iterable[pa.RecordBatch]) -> None:
        """Insert mode and staged: the batches in one COPY of Arrow's CSV (see
        :mod:`sinks.postgres.bulk`; keyed, the delete marker as the staged flag); keyed
        prepared: reduced in Arrow (:mod:`sinks.postgres.keyed`); upsert: their rows."""
        if not self.copies and self.keyed is None:
            self.write(txn, rows_of(batches))
            return
        conn = self._open(txn)
        with self._guard(txn, "writing"):
            if not self.copies:
                self._keyed_writer(txn, conn).apply_arrow(
                    self._received_tables(txn, batches), HELD_CHUNKS * self.chunk_size)
            elif self.keyed is not None:
                txn.rows += copy_batches(conn, self.written,
                                         self.keyed.flagged_columns(txn.columns),
                                         (self.keyed.flagged_arrow(batch) for batch in batches))
            else:
                txn.rows += copy_batches(conn, self.written, txn.columns, batches)

    def _received_tables(self, txn: PostgresTransaction, batches: Iterable[pa.RecordBatch]
                         ) -> Iterator[pa.Table]:
        """The batches a task receives as tables of at most ``chunk_size`` rows, counted."""
        import pyarrow as pa  # noqa: PLC0415 - the Arrow path has pyarrow

        for chunk in batch_chunks(batches, self.chunk_size):
            table = pa.Table.from_batches(chunk)
            txn.rows += table.num_rows
            yield table

    def _keyed_writer(self, txn: PostgresTransaction, conn: Connection) -> KeyedWriter:
        """The transaction's keyed writer (keyed, prepared), made at its first chunk."""
        if txn.keyed is None:
            txn.keyed = KeyedWriter(conn, cast(Keyed, self.keyed), self.target, self.tombstones,
                                    txn.columns)
        return txn.keyed

    def pre_commit(self, txn: PostgresTransaction) -> Handle:
        if self.publish == "staged":
            return self._stage(txn)
        conn = self._open(txn)
        gid = gid_of(txn.txn_id)
        with self._guard(txn, "preparing (it may be prepared: then cleanup aborts it)"):
            self.markers.insert(conn, txn.txn_id, target=self.target, rows=txn.rows,
                                where=self.where)
            prepare(conn, gid)
        self._close(txn)
        log.debug("prepared %s: %d rows, gid %s", txn.txn_id, txn.rows, gid)
        return self.handle(txn.txn_id, rows=txn.rows, gid=gid)

    def _stage(self, txn: PostgresTransaction) -> Handle:
        """Staged: commit the staged rows (durable, invisible), unless the id was committed
        once."""
        conn = self._open(txn)
        with self._guard(txn, "staging"):
            if self.markers.visible(conn, txn.txn_id):
                raise transaction_id_reused(txn.txn_id, where=self.where)
            conn.commit()
        self._close(txn)
        log.debug("staged %s: %d rows in %s", txn.txn_id, txn.rows, self.staging)
        return self.handle(txn.txn_id, rows=txn.rows, columns=list(txn.columns))

    def discard(self, txn: PostgresTransaction) -> None:
        """Close the session: the server rolls the unprepared transaction back. Never raises."""
        self._close(txn)

    @staticmethod
    def _open(txn: PostgresTransaction) -> Connection:
        if txn.conn is None:
            raise FatalError(f"transaction {txn.txn_id} is already prepared or discarded.",
                             fix="begin a new transaction for every partition attempt")
        return txn.conn

    @staticmethod
    def _close(txn: PostgresTransaction) -> None:
        close_quietly(txn.conn)
        txn.conn = None

    def _guard(self, txn: PostgresTransaction, step: str) -> AbstractContextManager[None]:
        """Any failure discards the transaction (it is never committed) and is classified; a
        lock wait that ran out names the lock's holder (:mod:`sinks.postgres.locks`)."""
        def classify(exc: BaseException, what: str) -> TwoPhaseError:
            return (classify_lock_wait(self.server, self._locked_tables, txn.txn_id, exc, what)
                    or classify_unprepared(exc, what))

        return classified(classify,
                          self.server.on(f"{step} transaction {txn.txn_id} into {self.target}"),
                          psycopg.Error, on_error=lambda: self.discard(txn))

    @property
    def _locked_tables(self) -> tuple[Table, ...]:
        """The tables whose rows a writer may wait for (not the marker table, which every
        sink of the schema shares: its holders would name every query's transactions)."""
        own = (self.tombstones,) if self.keyed is not None and not self.copies else ()
        return (self.written, *own)

    # -- driver: everything in the committer -------------------------------------------------

    #: Deprecated on the sink (removed in 0.6.0): call them on ``sink.committer()``.
    moved_to_committer = frozenset({"list_in_doubt", "purge_commit_records"})

    def committer(self) -> PostgresCommitter:
        """Commits, aborts, lists in doubt and purges through pooled autocommit sessions."""
        return PostgresCommitter(self)

    def create_tables(self) -> None:
        """Create the marker table (and, staged, the staging table; keyed, the tombstone
        table) unless it exists."""
        with self.server.session("creating twophase's marker table") as conn:
            schema.create_missing_markers(conn, self.markers.table)
            self._create_own_tables(conn)
