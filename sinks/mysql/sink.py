"""MySQL 8 / MariaDB >= 10.5 sink: one XA branch per partition, committed by the driver.

Every partition's slice of a micro-batch is written inside one XA transaction branch
(:mod:`~sinks.mysql.xa`: the xid is the transaction id) and prepared; the connection is then
closed, so any other session (the driver, cleanup) can resolve the branch: MariaDB cannot detach
a prepared branch from a live session. Inside every branch the sink also inserts a marker row
(:mod:`~sinks.mysql.markers`), the proof that a branch committed once the server forgets its xid.

What a crash leaves behind, phase by phase (client crash = executor or driver process killed;
a server crash rolls back every branch that is not prepared and keeps every prepared one, given
binary logging and durable InnoDB settings):

==========  ==================  =====================  =====================  =====================
phase       calls               a crash here leaves    resolved by            raises
==========  ==================  =====================  =====================  =====================
begin       connect, [keyed:    an ACTIVE branch, no   the server: it rolls   RetryableError (no
            READ COMMITTED,     rows                   back an ACTIVE branch  server, lost
            the key's index],                          when its connection    connection: begin is
            ``XA START``                               ends                   retried),
                                                                              ConfigurationError
                                                                              (login, grants),
                                                                              [keyed:
                                                                              SchemaMismatchError
                                                                              (no such key)]
write       ``LOAD DATA         an ACTIVE branch       the server, as above;  SchemaMismatchError
            LOCAL`` or          holding row locks      Spark re-runs the      (a row refused, also
            multi-row           until its connection   task (a new attempt    as a warning; an
            ``INSERT`` per      ends                   id, a new branch)      unsendable value; a
            ``chunk_size``                                                    null key or
            rows; keyed: per                                                  version),
            chunk, locking                                                    RetryableError (lock
            reads, guarded                                                    wait, lost
            upserts, deletes,                                                 connection),
            tombstones (see                                                   [keyed:
            below)                                                            ConfigurationError
                                                                              (1665: binlog_format
                                                                              STATEMENT)]
pre-commit  marker ``INSERT``,  before PREPARE         an orphan (prepared,   FatalError (the id
            ``XA END``, ``XA    returns: as write, or  no handle in any       was committed once),
            PREPARE``, close    (reply lost) a         decision) is aborted   ConfigurationError
                                prepared branch no     by the driver's sweep  (no marker table),
                                handle names. After:   or by                  RetryableError
                                PREPARED: durable,     ``twophase.cleanup``;
                                invisible, row locks   its xid names query,
                                held, listed by ``XA   batch and creation
                                RECOVER``              time
commit      [fence check],      before XA COMMIT:      driver recovery        TransactionLostError
            ``XA COMMIT``,      still prepared.        commits it again:      (rolled back, no
            stamp               After: visible; the    1397 + marker row =    marker), FencedError,
            ``committed_at``    marker row says so     ALREADY_COMMITTED      RetryableError
abort       [fence check],      rolled back, or still  repeat it: 1397 means  FencedError,
            ``XA ROLLBACK``     prepared               NOT_FOUND              RetryableError
==========  ==================  =====================  =====================  =====================

The sink writes; everything the driver does (commit, abort, fencing, the listing in doubt by
``XA RECOVER``, the purge of markers) runs through
:class:`~sinks.mysql.committer.MySQLCommitter` (pooled connections, the fence claim). Rows go in
chunks of ``chunk_size`` through ``LOAD DATA LOCAL`` or ``INSERT`` (:mod:`~sinks.mysql.bulk`),
from rows or, on Spark's Arrow path, from record batches encoded without per-row Python
(:mod:`~sinks.mysql.encoding`, :mod:`~sinks.mysql.arrow`). Errors are classified in
:mod:`~sinks.mysql.errors`, connections and session settings made in
:mod:`~sinks.mysql.connection`, tables checked in :mod:`~sinks.mysql.schema`, zombie runs
fenced in :mod:`~sinks.mysql.fencing`.

``mode="keyed"`` changes no phase: what a crash leaves is, as in the other modes, a branch
prepared or not. Its writes are guarded by version (:mod:`~sinks.mysql.keyed`), so a batch
replayed after a crash, or a late or repeated change, changes nothing; its branches run READ
COMMITTED, so tasks writing different keys never wait for each other's prepared branches, and
Spark routes each key of a batch to one task (:meth:`MySQLXASink.route_key`): two tasks writing
one key would wait for each other's row locks, which only the batch's decision releases.

Known limitation: an orphan keeps the row locks of what it wrote until the driver's sweep (at
the batch's commit) or cleanup aborts it. A retried task that writes the same keys (upsert, or
a unique key) waits for those locks, fails with 1205 (retryable) after
``lock_wait_timeout_s`` and is retried by Spark; if the orphan outlives Spark's task retries the
query fails and the next run's sweep clears it. Tables whose keys never repeat across attempts
(an auto-increment key) are not affected. A writer whose host vanished mid-write (its
connection half-open: the server never learns) holds its not yet prepared branch, and the
branch's locks, until its session has been idle for ``WRITER_IDLE_TIMEOUT_S`` (10 minutes).

Privileges (checked by ``check_schema``; the README lists the GRANTs): INSERT (+SELECT, UPDATE
for upsert; SELECT, INSERT, UPDATE, DELETE for keyed) on the table; SELECT, INSERT, UPDATE,
DELETE on the marker table (and keyed's tombstone table), SELECT, INSERT, UPDATE on the fence
table (CREATE on each once, or create them from ``MARKER_TABLE_DDL``); none
for the XA statements on MariaDB (any account may resolve any branch); MySQL 8 also needs
``XA_RECOVER_ADMIN`` for ``XA RECOVER``. The server needs binary logging for crash safety
of prepared branches (MySQL before 8.0.30 has known XA/binlog crash-safety gaps).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar, cast

import pymysql

from sinks.mysql import schema
from sinks.mysql.bulk import insert_rows, load_tsv
from sinks.mysql.committer import MySQLCommitter
from sinks.mysql.connection import (
    DEFAULT_READ_TIMEOUT_S,
    RESERVED_CONNECT_ARGS,
    URL,
    WRITER_IDLE_TIMEOUT_S,
    Connection,
    Server,
    close_quietly,
)
from sinks.mysql.encoding import Chunk, RowChunk
from sinks.mysql.errors import (
    LOCAL_INFILE_REFUSED,
    SYSTEM,
    classify_unprepared,
    error_code,
    error_text,
    unsendable,
    wrong_width,
)
from sinks.mysql.fencing import DEFAULT_FENCE_TABLE, Fence
from sinks.mysql.keyed import PRIMARY, KeyedTables
from sinks.mysql.markers import DEFAULT_MARKER_TABLE, Markers
from sinks.mysql.schema import FENCE_TABLE_DDL, MARKER_TABLE_DDL, Table
from sinks.mysql.xa import Xid, recover, xa
from twophase import (
    Column,
    ConfigurationError,
    FatalError,
    Handle,
    TransactionContext,
    TwoPhaseCommitSink,
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
    Tls,
    TlsMode,
    chunks,
    classified,
    renamed_option,
    validate_chunk_size,
    validate_keyed,
    validate_mode,
)
from twophase.kit.sql import ConnectionOption

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

Bulk = Literal["auto", "load_data", "insert"]
ChunkT = TypeVar("ChunkT", bound=Chunk)
BULK_METHODS: tuple[Bulk, ...] = ("auto", "load_data", "insert")
#: What each mode does to the target table (checked by ``check_schema``): an upsert's ON
#: DUPLICATE KEY UPDATE reads the row it updates; the keyed mode locks rows with SELECT ... FOR
#: UPDATE and deletes. The keyed mode's tombstone table takes the same.
TABLE_PRIVILEGES: dict[Mode, tuple[str, ...]] = {
    "insert": ("INSERT",),
    "upsert": ("SELECT", "INSERT", "UPDATE"),
    KEYED: ("SELECT", "INSERT", "UPDATE", "DELETE"),
}


@dataclass
class MySQLBranch:
    """One partition's open XA branch (lives on the executor between begin and pre-commit)."""

    txn_id: TxnId
    xid: Xid
    columns: tuple[str, ...]
    conn: Connection | None
    use_load_data: bool
    rows: int = 0
    #: ``mode="keyed"``: the target's index of the key (looked up at begin).
    key_index: str = PRIMARY


class MySQLXASink(NamespaceOfTarget, TwoPhaseCommitSink[MySQLBranch]):
    """Exactly-once rows into one MySQL/MariaDB table, one XA branch per partition.

    ``host``/``port``/``user``/``password``/``database``: where to connect (TCP); ``password``
    is the clear text or a :class:`twophase.Secret` (``Secret(env=...)``, ``Secret(file=...)``),
    read in the process that connects, when it connects (the pickled sink holds the reference).
    ``connection``: the same, and the TLS options and ``connect_timeout_s``, as one value
    instead (:class:`twophase.kit.sql.ConnectionUrl`): a URL
    ``mysql://user[:password]@host[:port]/database?tls=verify&ca_bundle=/ca.pem`` (or
    ``mariadb://``; user and password percent-encoded; the query takes ``tls``, ``ca_bundle``,
    ``client_cert``, ``client_key``, ``connect_timeout_s``), a :class:`twophase.Secret` holding
    such a URL (read as the sink is made; its password stays a reference, read at every
    connection) or a mapping of those options (``{"host": ..., "user": ..., ...}``). Beside it,
    ``password`` may give a password the connection lacks (credentials apart).
    ``tls``: ``"verify"`` (the default: the certificate must come from a CA of ``ca_bundle``,
    the system's CA store if None, and name ``host``), ``"require"`` (encrypted, not verified),
    ``"off"`` (plain text); TLS asked for and not offered is refused, never a fall back.
    ``client_cert``/``client_key``: the client certificate and its key (PEM files, the key
    unencrypted) the sink presents, for a user the server requires one of (``REQUIRE X509``,
    ``SUBJECT``, ``ISSUER``): mutual TLS. (The TLS options are every prebuilt sink's; the former
    ``ssl_cert``/``ssl_key`` work and warn until 0.6.0.)
    ``table``: the target table in ``database``; it must exist and be InnoDB.
    ``mode``: ``"insert"`` (a repeated key is an error), ``"upsert"`` (``INSERT ... ON
    DUPLICATE KEY UPDATE`` every written column, whatever comes last; the table needs a
    PRIMARY or UNIQUE key) or ``"keyed"`` (the latest state of each key by its version,
    deletes too: :mod:`twophase._keyed` states the rules, :mod:`sinks.mysql.keyed` the
    statements).
    ``key``: the columns of a PRIMARY or UNIQUE key of the table: required by ``"keyed"``
    (Spark routes rows by it: :meth:`route_key`); optional for ``"upsert"``, which then
    checks that it is one (its ``ON DUPLICATE KEY UPDATE`` acts on any unique key as before).
    ``version`` (``"keyed"`` only, required): the column that orders one key's changes (a log
    sequence number, an offset, an event time); the table must have it: a change applies
    only if its version is newer than the one the key's row or tombstone holds.
    ``deleted`` (``"keyed"`` only): the column that marks a delete, true or Debezium's
    ``op = 'd'``; read, never written (the table need not have it). A delete removes the row
    and keeps the key's version in the tombstone table ``_twophase_tombstones_<table>``
    (created by ``check_schema``/``create_tables``, in ``database``).
    ``tombstone_retention_s``: how long a tombstone is kept (7 days by default): ``python -m
    twophase.cleanup`` purges older ones (:meth:`MySQLCommitter.purge_tombstones`); a change
    later than that can bring its key back.
    ``chunk_size``: rows per statement (LOAD DATA or multi-row INSERT; in ``"keyed"`` mode a
    task's rows are reduced to the newest change per key and applied every
    :data:`~twophase.kit.HELD_CHUNKS` ``* chunk_size`` keys).
    ``bulk``: ``"auto"`` (LOAD DATA LOCAL in insert mode, and in keyed mode into the branch's
    temporary table of changes, falling back to INSERT if the server refuses it),
    ``"load_data"`` (insist; not in upsert mode), ``"insert"`` (never read local files).
    ``fencing``: check the fence row in every commit/abort (see :mod:`sinks.mysql.fencing`).
    ``lock_wait_timeout_s``: the session's ``innodb_lock_wait_timeout`` (server default if None).
    ``connect_args``: further PyMySQL ``connect`` options (not TLS: that is ``tls=``).
    """

    kind: ClassVar[str] = "mysql"

    def __init__(
        self,
        *,
        table: str,
        connection: ConnectionOption | None = None,
        host: str | None = None,
        user: str | None = None,
        password: SecretOption | None = None,
        database: str | None = None,
        port: int | None = None,
        tls: TlsMode | None = None,
        ca_bundle: str | None = None,
        client_cert: str | None = None,
        client_key: str | None = None,
        mode: Mode = "insert",
        key: Sequence[str] = (),
        version: str | None = None,
        deleted: str | None = None,
        tombstone_retention_s: float = DEFAULT_TOMBSTONE_RETENTION_S,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        bulk: Bulk = "auto",
        fencing: bool = False,
        marker_table: str = DEFAULT_MARKER_TABLE,
        fence_table: str = DEFAULT_FENCE_TABLE,
        connect_timeout_s: float | None = None,
        read_timeout_s: float | None = DEFAULT_READ_TIMEOUT_S,
        lock_wait_timeout_s: int | None = None,
        connect_args: Mapping[str, Any] | None = None,
        ssl_cert: str | None = None,
        ssl_key: str | None = None,
    ) -> None:
        client_cert = renamed_option(SYSTEM, "ssl_cert", ssl_cert, "client_cert", client_cert)
        client_key = renamed_option(SYSTEM, "ssl_key", ssl_key, "client_key", client_key)
        #: Where and how to connect (``repr`` shows it): the password a reference if given so.
        self.connection_settings = settings = URL.settings(
            connection, host=host, port=port, user=user, password=password, database=database,
            tls=tls, ca_bundle=ca_bundle, client_cert=client_cert, client_key=client_key,
            connect_timeout_s=connect_timeout_s)
        self.mode = validate_mode(SYSTEM, mode, key, key_required=False)
        self.key = tuple(key)
        keyed = validate_keyed(SYSTEM, mode, key, version, deleted,
                               tombstone_retention_s=tombstone_retention_s)
        self.chunk_size = validate_chunk_size(SYSTEM, chunk_size)
        self.bulk = _validated_bulk(bulk, self.mode)
        self.fencing = fencing
        self.server = Server(host=settings.host, port=settings.port, user=settings.user,
                             password=settings.password, database=settings.database,
                             tls=Tls(settings.tls, settings.ca_bundle, settings.client_cert,
                                     settings.client_key, SYSTEM),
                             connect_timeout_s=settings.connect_timeout_s,
                             read_timeout_s=read_timeout_s, lock_wait_timeout_s=lock_wait_timeout_s,
                             connect_args=_validated_connect_args(connect_args or {}))
        self.table = table
        self.target = Table(settings.database, table)
        self.markers = Markers(Table(settings.database, marker_table))
        self.fences = Fence(Table(settings.database, fence_table), self.server.address)
        #: ``mode="keyed"``: the key, version and delete marker, and the tombstone table.
        self.keyed_tables = None if keyed is None else KeyedTables.of(keyed, self.target)

    def __repr__(self) -> str:
        server = self.server
        return (f"MySQLXASink({self.connection_settings.shown()}, table={self.table!r}, "
                f"tls={server.tls.mode!r}, mode={self.mode!r}{self._keyed_repr()}, "
                f"bulk={self.bulk!r}, fencing={self.fencing})")

    def _keyed_repr(self) -> str:
        keyed = self.keyed
        if keyed is None:
            return f", key={self.key!r}" if self.key else ""
        return (f", key={keyed.key!r}, version={keyed.version!r}, deleted={keyed.deleted!r}, "
                f"tombstone_retention_s={keyed.tombstone_retention_s!r}")

    @property
    def keyed(self) -> Keyed | None:
        """``mode="keyed"``'s key, version and delete marker columns (None in another mode)."""
        return None if self.keyed_tables is None else self.keyed_tables.keyed

    def route_key(self) -> tuple[str, ...] | None:
        """The key in ``mode="keyed"``: a task writes a key under row locks that its prepared
        branch holds until the batch is decided, so each key must reach one task."""
        return None if self.keyed is None else self.keyed.key

    @property
    def where(self) -> str:
        """The target, as messages name it."""
        return f"table {self.target} on MySQL server {self.server.address}"

    def target_name_and_place(self) -> tuple[str, ...]:
        """The table's name and its database (a server's XA transactions are listed across
        its databases: two databases' tables of one name need two namespaces)."""
        return (self.table, self.target.database)

    # -- driver: schema, tables ----------------------------------------------------------------

    def check_schema(self, columns: Sequence[Column]) -> None:
        """Check server, table, columns (and key for upsert and keyed); create the marker/fence
        tables (and the tombstone table in ``mode="keyed"``)."""
        address = self.server.address
        if self.keyed is not None:
            self.keyed.check_columns(self.where, columns)
        written = self._written(columns)
        with self.server.session(f"checking {self.target}") as conn:
            schema.check_server(conn, address)
            schema.create_missing(conn, self._own_tables())
            # first: a table the user holds no privilege on is not in its information_schema
            schema.check_privileges(conn, self._privileges(written), self.server.user)
            schema.check_table(conn, self.target, address)
            schema.check_columns(conn, self.target, written, where=self.where,
                                 upsert_key=None if self.mode == "insert" else self.key)
            if self.keyed_tables is not None:
                self._check_tombstones(conn, self.keyed_tables, written)
            if self.bulk == "load_data":
                schema.check_local_infile(conn, address)
            recover(conn)  # needs XA_RECOVER_ADMIN on MySQL 8: fail now, not in recovery

    def create_tables(self) -> None:
        """Create the marker table (the fence table if fencing, the tombstone table in
        ``mode="keyed"``) unless they exist."""
        with self.server.session("creating twophase's tables") as conn:
            schema.create_missing(conn, {**self._own_tables(), **self._tombstone_table()})

    def _written(self, columns: Sequence[Column]) -> list[Column]:
        """The columns written into the table: all but ``mode="keyed"``'s delete marker."""
        if self.keyed is None:
            return list(columns)
        kept = self.keyed.written([column.name for column in columns])
        return [column for column in columns if column.name in kept]

    def _privileges(self, written: Sequence[Column]) -> dict[Table, tuple[Sequence[str], str]]:
        """What the sink does on each table: the privileges, and a column the probes name."""
        wanted: dict[Table, tuple[Sequence[str], str]] = {
            self.markers.table: (("SELECT", "INSERT", "UPDATE", "DELETE"), "committed_at")}
        if written:
            wanted[self.target] = (TABLE_PRIVILEGES[self.mode], written[0].name)
        if self.fencing:
            wanted[self.fences.table] = (("SELECT", "INSERT", "UPDATE"), "fenced_at")
        return wanted

    def _own_tables(self) -> dict[Table, str]:
        tables = {self.markers.table: MARKER_TABLE_DDL}
        if self.fencing:
            tables[self.fences.table] = FENCE_TABLE_DDL
        return tables

    def _tombstone_table(self) -> dict[Table, str]:
        """``mode="keyed"``'s tombstone table and its DDL (nothing in another mode)."""
        if self.keyed_tables is None:
            return {}
        return {self.keyed_tables.tombstones: self.keyed_tables.ddl()}

    def _check_tombstones(self, conn: Connection, tables: KeyedTables,
                          written: Sequence[Column]) -> None:
        """Create the tombstone table once the target passed its checks (its DDL copies the
        key's and the version's types from the target: a wrong ``key=`` leaves no table of the
        wrong key behind), then check the user's privileges on it and its columns."""
        schema.create_missing(conn, self._tombstone_table())
        schema.check_privileges(conn, {tables.tombstones: (TABLE_PRIVILEGES[KEYED],
                                                            tables.keyed.key[0])},
                                self.server.user)
        tables.check(conn, written, where=self.where)
        tables.check_changes_table(conn, [column.name for column in written], self.server.user)

    # -- executor: begin, write, pre-commit ----------------------------------------------------

    def begin_transaction(self, ctx: TransactionContext) -> MySQLBranch:
        xid = Xid.of(ctx.txn_id)
        loads = self.mode != "upsert" and self.bulk != "insert"
        conn = self.server.connect(local_infile=loads, idle_timeout_s=WRITER_IDLE_TIMEOUT_S)
        branch = MySQLBranch(ctx.txn_id, xid, ctx.column_names, conn, use_load_data=loads)
        with self._guard(branch, "starting"):
            if self.keyed_tables is not None:  # READ COMMITTED, before XA START
                branch.key_index = self.keyed_tables.begin(
                    conn, self.keyed_tables.keyed.written(ctx.column_names))
            xa(conn, "START", xid)
        return branch

    def write(self, txn: MySQLBranch, rows: Iterable[Sequence[Any]]) -> None:
        conn = self._open(txn)
        received = self._received(txn, (RowChunk(chunk, txn.columns)
                                        for chunk in chunks(rows, self.chunk_size)))
        with self._guard(txn, "writing"):
            if self.keyed_tables is None:
                for chunk in received:
                    self._insert_chunk(txn, conn, chunk)
                return
            keyed = self.keyed_tables.keyed
            flagged = keyed.flagged_columns(txn.columns)
            for newest in keyed.newest_in_chunks((chunk.rows() for chunk in received),
                                                 txn.columns, HELD_CHUNKS * self.chunk_size):
                self._apply_newest(txn, conn, RowChunk(newest, flagged))

    def write_arrow(self, txn: MySQLBranch, batches: Iterable[pa.RecordBatch]) -> None:
        """Record batches, encoded for LOAD DATA by Arrow kernels (see :mod:`sinks.mysql.arrow`;
        keyed: reduced in Arrow first); the INSERT path gets their rows."""
        import pyarrow as pa  # noqa: PLC0415 - the Arrow path has pyarrow

        from sinks.mysql.arrow import ArrowChunk, chunks_ahead  # noqa: PLC0415 - needs pyarrow

        conn = self._open(txn)
        ahead = chunks_ahead(batches, self.chunk_size,
                             encode=txn.use_load_data and self.keyed is None)
        received = self._received(txn, ahead)
        with self._guard(txn, "writing"), contextlib.closing(ahead):
            if self.keyed_tables is None:
                for chunk in received:
                    self._insert_chunk(txn, conn, chunk)
                return
            tables = (pa.Table.from_batches(chunk.batches) for chunk in received)
            held = HELD_CHUNKS * self.chunk_size
            for newest in self.keyed_tables.keyed.newest_in_tables(tables, held):
                self._apply_newest(txn, conn, ArrowChunk(newest.to_batches()))

    def pre_commit(self, txn: MySQLBranch) -> Handle:
        conn = self._open(txn)
        with self._guard(txn, "preparing (the branch may be prepared: then cleanup aborts it)"):
            self.markers.insert(conn, txn.txn_id, target=self.target, rows=txn.rows,
                                where=self.where)
            xa(conn, "END", txn.xid)
            xa(conn, "PREPARE", txn.xid)
        self._close(txn)  # never reuse a connection after PREPARE; closing detaches the branch
        log.debug("prepared %s: %d rows, xid %s", txn.txn_id, txn.rows, txn.xid)
        return self.handle(txn.txn_id, rows=txn.rows, gtrid=txn.xid.gtrid, bqual=txn.xid.bqual)

    def discard(self, txn: MySQLBranch) -> None:
        """Roll back an unprepared branch and close its connection; never raises."""
        if txn.conn is None:
            return
        for verb in ("END", "ROLLBACK"):
            with contextlib.suppress(Exception):
                xa(txn.conn, verb, txn.xid)
        self._close(txn)

    def _received(self, txn: MySQLBranch, received: Iterable[ChunkT]) -> Iterator[ChunkT]:
        """The chunks a task receives, each checked for its width and counted."""
        for chunk in received:
            if (misfit := chunk.misfit(len(txn.columns))) is not None:
                raise wrong_width(txn.txn_id, misfit, txn.columns)
            txn.rows += len(chunk)
            yield chunk

    def _insert_chunk(self, txn: MySQLBranch, conn: Connection, chunk: Chunk) -> None:
        """Insert and upsert modes: a chunk into the table."""
        with self._sendable(txn):
            self._insert(txn, conn, chunk, self.target, txn.columns,
                         upsert=self.mode == "upsert")

    def _apply_newest(self, txn: MySQLBranch, conn: Connection, newest: Chunk) -> None:
        """``mode="keyed"``: the newest changes of one or more chunks into the branch's
        temporary table, then applied where newer (:mod:`sinks.mysql.keyed`)."""
        tables = cast(KeyedTables, self.keyed_tables)
        with self._sendable(txn):
            tables.clear(conn)
            self._insert(txn, conn, newest, tables.changes,
                         tables.keyed.flagged_columns(txn.columns), upsert=False)
        tables.apply(conn, tables.keyed.written(txn.columns), loaded=len(newest),
                     index=txn.key_index,
                     what=f"applying the changes of transaction {txn.txn_id} to {self.target}")

    @staticmethod
    @contextlib.contextmanager
    def _sendable(txn: MySQLBranch) -> Iterator[None]:
        """A value Python cannot send (TypeError, ValueError, OverflowError) named."""
        try:
            yield
        except (TypeError, ValueError, OverflowError) as exc:
            raise unsendable(txn.txn_id, exc) from exc

    def _insert(self, txn: MySQLBranch, conn: Connection, chunk: Chunk, into: Table,
                columns: Sequence[str], *, upsert: bool) -> None:
        """The chunk into ``into``: by LOAD DATA where the branch loads, else (or once the
        server refused a local load) by multi-row INSERT."""
        if not (txn.use_load_data and self._loaded(txn, conn, chunk, into, columns)):
            insert_rows(conn, into, columns, chunk.rows(), upsert=upsert,
                        what=f"inserting transaction {txn.txn_id} into {into}")

    def _loaded(self, txn: MySQLBranch, conn: Connection, chunk: Chunk, into: Table,
                columns: Sequence[str]) -> bool:
        """LOAD DATA the chunk; False if the server refuses local loads and bulk='auto'."""
        try:
            load_tsv(conn, into, columns, chunk.tsv(), rows=len(chunk),
                     what=f"loading transaction {txn.txn_id} into {into}")
        except pymysql.err.MySQLError as exc:
            if self.bulk != "auto" or error_code(exc) not in LOCAL_INFILE_REFUSED:
                raise
            log.warning("%s refuses LOAD DATA LOCAL (%s); writing with INSERT instead",
                        self.server.address, error_text(exc))
            txn.use_load_data = False
            return False
        return True

    @staticmethod
    def _open(txn: MySQLBranch) -> Connection:
        if txn.conn is None:
            raise FatalError(f"transaction {txn.txn_id} is already prepared or discarded.",
                             fix="begin a new transaction for every partition attempt")
        return txn.conn

    @staticmethod
    def _close(txn: MySQLBranch) -> None:
        close_quietly(txn.conn)
        txn.conn = None

    def _guard(self, txn: MySQLBranch, step: str) -> contextlib.AbstractContextManager[None]:
        """Any failure discards the branch (it is never committed) and is classified."""
        return classified(classify_unprepared,
                          self.server.on(f"{step} transaction {txn.txn_id} into {self.target}"),
                          pymysql.err.MySQLError, on_error=lambda: self.discard(txn))

    # -- driver: everything in the committer -------------------------------------------------

    #: Deprecated on the sink (``fence`` since 0.3.0; removed in 0.6.0): call them on
    #: ``sink.committer()``, which keeps the fence claim for its commits.
    moved_to_committer = frozenset({"fence", "list_in_doubt", "purge_commit_records"})

    def committer(self) -> MySQLCommitter:
        """Commits, aborts, fences, lists in doubt and purges through pooled connections;
        holds the fence claim."""
        return MySQLCommitter(self)


def _validated_bulk(bulk: str, mode: Mode) -> Bulk:
    if bulk not in BULK_METHODS:
        raise ConfigurationError(f"{SYSTEM}: unknown bulk={bulk!r}.",
                                 fix=f"use one of {BULK_METHODS}")
    if mode == "upsert" and bulk == "load_data":
        raise ConfigurationError(f"{SYSTEM}: bulk='load_data' with mode='upsert' (LOAD DATA "
                                 "cannot update).", fix="use bulk='auto' or 'insert', or "
                                 "mode='keyed' (which loads its changes into a table of its own)")
    return next(method for method in BULK_METHODS if method == bulk)


def _validated_connect_args(connect_args: Mapping[str, Any]) -> dict[str, Any]:
    if reserved := sorted(RESERVED_CONNECT_ARGS & set(connect_args)):
        raise ConfigurationError(f"{SYSTEM}: connect_args {reserved} are set by the sink itself.",
                                 fix="leave them out of connect_args")
    return dict(connect_args)
