"""Delta Lake tables: Parquet files pre-committed in the data area, one Delta commit per batch.

Every partition's slice of a micro-batch is written by pyarrow as Parquet files into the
table's data area (:mod:`~sinks.delta.files`: named by the transaction id, in the partition
directories of a partitioned table, a new file every ``max_file_bytes``), each with its exact
statistics (:mod:`~sinks.delta.stats`), on a local path or S3 (:mod:`~sinks.delta.storage`),
each named by the transaction's intent before it is created
(:class:`~twophase.kit.lake.LakeIntents`). A file no commit references is invisible to every
reader. The handle lists the files as their
``AddAction`` needs them (path, size, partition values, modification time, statistics); the
driver's committer (:mod:`~sinks.delta.committer`) adds every file of the batch in one Delta
commit carrying ``Transaction(app_id, batch)`` (:mod:`~sinks.delta.snapshot`).

What a crash leaves behind, phase by phase (a file is durable once written and fsynced):

===========  ====================  ====================  =====================  ===================
phase        calls                 a crash here leaves   resolved by            raises
===========  ====================  ====================  =====================  ===================
begin        the table's layout    nothing               (nothing to resolve)   ConfigurationError
             (read on the driver                                                (no table, a
             by ``check_schema``)                                               feature refused)
write        the intent, then      partial or whole      listed by              SchemaMismatchError
             Parquet files         files named by the    ``list_in_doubt``      (a value the
             created exclusively   transaction and its   (its intents, no       column cannot
             (``part-<txn>-<n>``   intent, which no      commit proven),        hold, a NULL in
             ``.parquet``), a row  commit references     deleted by the         a NOT NULL
             group per chunk       (invisible)           driver's sweep or      column),
                                                         cleanup                FatalError (the
                                                                                id was used: its
                                                                                file exists)
pre-commit   close + fsync every   the files, whole:     as write; once the     as write
             file; the handle      durable, invisible    handle is decided,
             lists them                                  the driver commits it
commit       the batch's first     before the Delta      recovery commits       TransactionLost-
(driver)     ``commit``: load the  commit: the files,    again: the app id's    Error (a file gone
             table, prove or add   unreferenced. After:  transaction version    or past VACUUM's
             every handle's files  the batch, visible    >= batch and the       retention; nothing
             in ONE commit with    whole, the commit     files referenced on    added),
             Transaction(app id,   carrying its app id   the same snapshot:     RetryableError (a
             batch)                and batch             ALREADY_COMMITTED      racing commit:
                                                                                concurrent
                                                                                transaction)
finish       commits what of the   as commit; the        as commit; an intent   as commit
batch        batch is unsettled    intents maybe left    of a committed
             (nothing, normally),                        transaction is
             deletes its intents                         deleted on sight
abort        delete the files,     some files deleted,   repeat it: no file is  RetryableError
             then the intent,      the intent left       NOT_FOUND
             unless a commit
             references them
===========  ====================  ====================  =====================  ===================

**Keyed** (``mode="keyed"``, :mod:`~sinks.delta.keyed`): the phases are the same, but a
transaction's files are its reduced changes, staged under ``_twophase/staged/`` (never
referenced by the table), and the commit is one MERGE of the batch's changes carrying each
transaction's proof, after the tombstones' own commit.

The "already committed?" proof, and why the commit happens at a batch's first ``commit`` and
not in ``finish_batch``: :mod:`~sinks.delta.committer`. ``commit_deadline``: the oldest file's
creation + ``delta.deletedFileRetentionDuration`` (7 days by default), so the driver never
decides a batch VACUUM may take apart before its commit. An empty partition writes no file;
its handle lists none and every commit of it is ALREADY_COMMITTED (nothing to make visible).
The proof is the table's own log: there is nothing to purge (``purge_commit_records`` is 0).

Refused at the start (``check_schema``, see :mod:`~sinks.delta.schema`): a column the table
lacks or holds in another type, a NOT NULL column the rows lack, deletion vectors, row
tracking, column mapping, constraints, writer features the sink does not know, and
``delta.setTransactionRetentionDuration``. twophase must be the table's only appender of
these batches; other writers (OPTIMIZE, VACUUM, other jobs) may run alongside.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

import deltalake.exceptions
import pyarrow as pa
from deltalake import DeltaTable

from sinks.delta import schema
from sinks.delta.committer import DeltaCommitter
from sinks.delta.errors import ERRORS_CAUGHT, SYSTEM, classify
from sinks.delta.files import DataFile, PartitionKey, transaction_files
from sinks.delta.keyed import DeltaTombstones
from sinks.delta.schema import Layout
from sinks.delta.snapshot import Snapshot, app_id_of
from sinks.delta.storage import storage_for
from twophase import (
    Column,
    ConfigurationError,
    TransactionContext,
    TwoPhaseError,
    TxnId,
)
from twophase.kit import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_TOMBSTONE_RETENTION_S,
    NamespaceOfTarget,
    classified,
    validate_chunk_size,
)
from twophase.kit.lake import (
    APPEND,
    DEFAULT_MAX_FILE_BYTES,
    LakeFiles,
    LakeSink,
    LakeStorage,
    validate_lake_mode,
    validate_max_file_bytes,
)

if TYPE_CHECKING:
    from twophase import Committer

log = logging.getLogger(__name__)


class DeltaSink(NamespaceOfTarget, LakeSink[DataFile]):
    """Exactly-once appends to the Delta table at ``table_uri`` (a local path, ``file://`` or
    ``s3://bucket/path``).

    ``create=True``: create the table from the query's columns when it does not exist
    (partitioned by ``partition_by``, with the table properties ``configuration``); an
    existing table keeps its own partitioning (a different ``partition_by`` is refused).
    ``chunk_size``: rows per Parquet row group on the rows path; ``max_file_bytes``: a
    transaction's file is closed, and the next one begun, once it reaches this size.
    ``storage_options``: deltalake's (for the table's log); on S3 the sink's own client takes
    its credentials, region and endpoint from them too (:mod:`~sinks.delta.storage`).
    ``app_id``: the Delta app id the batches commit under (default: derived from the query, a
    new one per checkpoint; see :mod:`~sinks.delta.committer`).
    ``mode``: ``"append"`` (rows added) or ``"keyed"`` (the latest state of each key, by
    ``version``, deletes marked by ``deleted`` kept as tombstones for
    ``tombstone_retention_s``; ``key``: the columns that name a row): changes staged by the
    executors, applied by the driver in one MERGE per batch (:mod:`~sinks.delta.keyed`).
    """

    kind: ClassVar[str] = "delta"
    file_record = DataFile

    def __init__(
        self,
        table_uri: str,
        *,
        storage_options: Mapping[str, str] | None = None,
        partition_by: Sequence[str] = (),
        create: bool = False,
        configuration: Mapping[str, str] | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        app_id: str | None = None,
        mode: str = APPEND,
        key: Sequence[str] = (),
        version: str | None = None,
        deleted: str | None = None,
        tombstone_retention_s: float = DEFAULT_TOMBSTONE_RETENTION_S,
    ) -> None:
        self.table_uri = str(table_uri)
        self.storage_options = dict(storage_options or {})
        self._storage = storage_for(self.table_uri, self.storage_options)
        if app_id is not None and (not isinstance(app_id, str) or not app_id.strip()):
            raise ConfigurationError(f"{SYSTEM}: app_id={app_id!r} must be a non-empty string.",
                                     fix="drop app_id= (derived from the query) or name one")
        self.app_id = app_id
        self.mode = mode
        self.keyed = validate_lake_mode(SYSTEM, mode, key, version, deleted,
                                        tombstone_retention_s=tombstone_retention_s)
        if self.keyed is not None and app_id is not None:
            raise ConfigurationError(
                f"{SYSTEM}: app_id= is for mode='append'; mode='keyed' proves each "
                "transaction by app ids derived from the query (a new one per checkpoint).",
                fix="drop app_id=")
        self.partition_by = tuple(partition_by)
        self.create = create
        self.configuration = dict(configuration or {})
        self.chunk_size = validate_chunk_size(SYSTEM, chunk_size)
        self.max_file_bytes = validate_max_file_bytes(SYSTEM, max_file_bytes,
                                                      DEFAULT_MAX_FILE_BYTES)
        #: The table's layout, read by ``check_schema`` on the driver and pickled with the
        #: sink to the executors (a writer without it reads it itself).
        self.layout: Layout | None = None

    def __repr__(self) -> str:
        return (f"DeltaSink({self.table_uri!r}, partition_by={list(self.partition_by)!r}, "
                f"mode={self.mode!r})")

    @property
    def tombstone_table(self) -> DeltaTombstones:
        """Keyed: the table of the deleted keys (:mod:`~sinks.delta.keyed`)."""
        assert self.keyed is not None
        return DeltaTombstones(self.table_uri, self.storage_options, self.keyed)

    @property
    def storage(self) -> LakeStorage:
        return self._storage

    @property
    def where(self) -> str:
        return f"Delta table {self.table_uri}"

    def target_name_and_place(self) -> tuple[str, ...]:
        """The table directory's name and where it is (its parent URI)."""
        parent, _, name = self.table_uri.rstrip("/").rpartition("/")
        return (name, parent)

    @property
    def errors_caught(self) -> tuple[type[BaseException], ...]:
        """What the sink catches around deltalake, pyarrow and storage calls."""
        return (*ERRORS_CAUGHT, *self.storage.errors)

    def app_id_of(self, txn_id: TxnId) -> str:
        """The app id a transaction's batch commits under: ``app_id=`` or the query's own."""
        return self.app_id if self.app_id is not None else app_id_of(txn_id)

    def snapshot(self) -> Snapshot:
        """The table's latest version, loaded now (errors: the caller classifies them)."""
        return Snapshot.load(self.table_uri, self.storage_options)

    # -- driver: before the start --------------------------------------------------------------

    def check_schema(self, columns: Sequence[Column]) -> None:
        """The table (created if asked), its features, its columns; then its layout."""
        if self.keyed is not None:
            self.keyed.check_columns(self.where, columns)
            columns = [column for column in columns if column.name != self.keyed.deleted]
        with classified(classify, f"checking {self.where}", self.errors_caught):
            table = self._table_for(columns)
            schema.check_features(table, self.where)
            schema.check_partitioning(table, self.where)
            schema.check_columns(table, columns, self.where)
            self.layout = Layout.of(table)
            if self.keyed is not None:
                self.tombstone_table.create_missing(table)
        if self.partition_by and self.partition_by != self.layout.partition_by:
            raise ConfigurationError(
                f"{self.where} is partitioned by {list(self.layout.partition_by)}, not by "
                f"{list(self.partition_by)}.",
                fix="drop partition_by= (the table's own partitioning is used) or fix it")

    def _table_for(self, columns: Sequence[Column]) -> DeltaTable:
        try:
            return self.snapshot().table
        except deltalake.exceptions.TableNotFoundError:
            if not self.create:
                raise
        log.info("creating %s from the query's columns", self.where)
        return schema.create_table(self.table_uri, columns, partition_by=self.partition_by,
                                   storage_options=self.storage_options,
                                   configuration=self.configuration)

    # -- executor: begin (the rest is the kit's LakeSink) ----------------------------------------

    def open_files(self, ctx: TransactionContext
                   ) -> tuple[pa.Schema, LakeFiles[PartitionKey, DataFile]]:
        layout = self.layout
        if layout is None:
            with classified(classify, f"reading the layout of {self.where}",
                            self.errors_caught):
                layout = Layout.of(self.snapshot().table)
        return layout.table_schema, transaction_files(self.storage, layout, ctx.txn_id,
                                                      self.max_file_bytes)

    def classify(self, exc: BaseException, what: str) -> TwoPhaseError:
        return classify(exc, what)

    # -- driver ---------------------------------------------------------------------------------

    def committer(self) -> Committer:
        return DeltaCommitter(self)
