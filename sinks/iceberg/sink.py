"""Apache Iceberg tables: Parquet files pre-committed in the data area, one snapshot per batch.

Every partition's slice of a micro-batch is written by pyarrow as Parquet files carrying the
table's field ids into the table's data area (:mod:`~sinks.iceberg.files`: named by the
transaction id, in the partition spec's directories, a new file every ``max_file_bytes``),
with the statistics Iceberg keeps, on a local path or S3
(:class:`~twophase.kit.lake.LakeStorage`), each named by the transaction's intent before it is
created (:class:`~twophase.kit.lake.LakeIntents`).
A file no snapshot adds is invisible to every reader. The handle lists the files as their
``DataFile`` needs them; the driver's committer (:mod:`~sinks.iceberg.committer`) adds every
file of the batch in ONE fast-append snapshot through the catalog (:mod:`~sinks.iceberg.snapshots`).

What a crash leaves behind, phase by phase (a file is durable once written and fsynced):

===========  ====================  ====================  =====================  ===================
phase        calls                 a crash here leaves   resolved by            raises
===========  ====================  ====================  =====================  ===================
begin        the table's metadata  nothing               (nothing to resolve)   ConfigurationError
             (read on the driver                                                (no table, a
             by ``check_schema``)                                               setting refused)
write        the intent, then      partial or whole      listed by              SchemaMismatchError
             Parquet files         files named by the    ``list_in_doubt``      (a value the
             created exclusively   transaction and its   (its intent, no        column cannot
             (``data/.../<txn>``   intent, which no      snapshot proven),      hold, a NULL in
             ``-<n>.parquet``)     snapshot adds         deleted by the         a required
                                   (invisible)           driver's sweep or      column),
                                                         cleanup                FatalError (the
                                                                                id was used)
pre-commit   close + fsync every   the files, whole:     as write; once the     as write
             file; the handle      durable, invisible    handle is decided,
             lists them with                             the driver commits it
             their statistics
commit       the batch's first     before the catalog    recovery commits       TransactionLost-
(driver)     ``commit``: load the  swap: the files,      again: the property    Error (a file gone
             table, prove or add   unreferenced. After:  ``twophase.batch.      or older than
             every handle's files  the batch, visible    <app>`` >= batch and   ``orphan_age_s``;
             in ONE snapshot, one  whole, its snapshot   the app's snapshots    nothing added),
             conditional catalog   marked with the app   of the batch add the   RetryableError (a
             attempt               and the batch         files: ALREADY_        racing commit:
                                                         COMMITTED              the swap failed)
finish       commits what of the   as commit; the        as commit; an intent   as commit
batch        batch is unsettled,   intents maybe left    of a committed
             deletes its intents                         transaction is
                                                         deleted on sight
abort        delete the files,     some files deleted,   repeat it: no file is  RetryableError
             then the intent,      the intent left       NOT_FOUND
             unless the proof
             holds
===========  ====================  ====================  =====================  ===================

**Keyed** (``mode="keyed"``, :mod:`~sinks.iceberg.keyed`): the phases are the same, but a
transaction's files are its reduced changes, staged under ``<location>/_twophase/staged/``
(no snapshot adds them), and the commit deletes the applied keys' rows, appends the upserts and
raises each transaction's proof property in one catalog commit, after the tombstones' own.

``commit_deadline``: the oldest file's creation + ``orphan_age_s`` (Iceberg's
``remove_orphan_files`` deletes unreferenced files older than its ``older_than``, 3 days by
default: give the sink the age your cleanup uses). Snapshot expiry: the proof walks snapshots
made since the batch's predecessor; when expiry removed them first, the table property
decides (:mod:`~sinks.iceberg.snapshots`). The proof is the table's own metadata: there is
nothing to purge (``purge_commit_records`` is 0).

Refused at the start (``check_schema``, see :mod:`~sinks.iceberg.schema`): a column the table
lacks or holds in a type the rows' cannot be promoted to, a required column the rows lack,
nested columns, format version 3, a file format other than Parquet, data files placed away
from ``<location>/data``, a sort order. twophase must be the only appender of these batches;
other writers (compaction, expiry, other jobs) may commit alongside.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa

from sinks.iceberg.errors import ERRORS_CAUGHT, S3_ERRORS, SYSTEM, catalog_errors, classify
from sinks.iceberg.files import IcebergFile, transaction_files
from sinks.iceberg.layout import Layout, PartitionKey
from twophase import (
    Column,
    ConfigurationError,
    TransactionContext,
    TwoPhaseError,
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
    lake_storage,
    validate_lake_mode,
    validate_max_file_bytes,
)
from twophase.kit.s3 import S3Settings

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

    from sinks.iceberg.keyed import IcebergTombstones
    from twophase import Committer

log = logging.getLogger(__name__)

#: Iceberg's ``remove_orphan_files`` default ``older_than``: 3 days.
DEFAULT_ORPHAN_AGE_S = 3 * 24 * 3600.0
DEFAULT_CATALOG_NAME = "default"
#: pyiceberg's S3 properties the sink's own S3 client takes too, and the
#: :class:`~twophase.kit.s3.S3Settings` field each becomes.
S3_SETTINGS_OF_PROPERTIES: Mapping[str, str] = {
    "s3.access-key-id": "access_key_id", "s3.secret-access-key": "secret_access_key",
    "s3.session-token": "session_token", "s3.region": "region", "s3.endpoint": "endpoint_url"}
VIRTUAL_ADDRESSING = "s3.force-virtual-addressing"

class IcebergSink(NamespaceOfTarget, LakeSink[IcebergFile]):
    """Exactly-once appends to the Iceberg table ``table`` (``"db.orders"``) of a catalog.

    ``catalog``: pyiceberg's catalog properties (``{"type": "sql", "uri":
    "postgresql+psycopg://...", "warehouse": "s3://bucket/wh"}``, ``{"type": "rest", "uri":
    ...}``); ``catalog_name``: the catalog's name, ``"default"`` unless given. A SQL catalog
    keeps each name's tables apart (its ``catalog_name`` column) and sees only its own: give
    the name your readers load the catalog by (``load_catalog("lake", ...)``, Spark's
    ``spark.sql.catalog.lake``), or a table the sink creates is invisible to them (a table
    the database holds under another name is refused, naming it). A REST catalog's name is
    only a label. On S3 the sink's own client takes its credentials, region and endpoint from
    the same properties (``s3.endpoint``, ``s3.access-key-id``, ...). ``create=True``: create
    the table (and its namespace) from the query's columns when it does not exist,
    partitioned by the identity of ``partition_by``, with ``properties``, under the
    catalog's ``warehouse`` (a SQL catalog needs that property, unless the namespace has a
    ``location``; a REST catalog's server has its own). ``chunk_size``: rows per Parquet row
    group on the rows path; ``max_file_bytes``: a file is closed, and the next begun, at this
    size. ``orphan_age_s``: seconds after which your orphan-file cleanup deletes
    unreferenced files (its ``older_than``): the deadline of a decided batch (``orphan_age=``,
    0.4.0's name, is deprecated: it works with a warning until 0.6.0). ``mode``:
    ``"append"`` (rows added) or ``"keyed"`` (the latest state of each key, by ``version``,
    deletes marked by ``deleted`` kept as tombstones for ``tombstone_retention_s``; ``key``:
    the columns that name a row): changes staged by the executors, applied by the driver in
    one catalog commit per batch (:mod:`~sinks.iceberg.keyed`).
    """

    kind: ClassVar[str] = "iceberg"
    file_record = IcebergFile

    def __init__(
        self,
        table: str,
        *,
        catalog: Mapping[str, str],
        catalog_name: str = DEFAULT_CATALOG_NAME,
        create: bool = False,
        partition_by: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        orphan_age_s: float = DEFAULT_ORPHAN_AGE_S,
        orphan_age: float | None = None,
        mode: str = APPEND,
        key: Sequence[str] = (),
        version: str | None = None,
        deleted: str | None = None,
        tombstone_retention_s: float = DEFAULT_TOMBSTONE_RETENTION_S,
    ) -> None:
        if not isinstance(table, str) or "." not in table.strip("."):
            raise ConfigurationError(f"{SYSTEM}: table={table!r} must name a namespace and a "
                                     "table.", fix='name it as "namespace.table"')
        if not isinstance(catalog, Mapping) or ("type" not in catalog and "uri" not in catalog):
            raise ConfigurationError(
                f"{SYSTEM}: catalog= must be pyiceberg's catalog properties.",
                fix='pass catalog={"type": "sql", "uri": ..., "warehouse": ...} or '
                    '{"type": "rest", "uri": ...}')
        self.table = table
        self.catalog_properties = {str(key): str(value) for key, value in catalog.items()}
        self.catalog_name = catalog_name
        self.create = create
        self.partition_by = tuple(partition_by)
        self.properties = dict(properties or {})
        self.chunk_size = validate_chunk_size(SYSTEM, chunk_size)
        self.max_file_bytes = validate_max_file_bytes(SYSTEM, max_file_bytes,
                                                      DEFAULT_MAX_FILE_BYTES)
        if orphan_age is not None:
            warnings.warn("IcebergSink(orphan_age=) is deprecated and is removed in 0.6.0: "
                          "pass orphan_age_s= (the same seconds)", DeprecationWarning,
                          stacklevel=2)
            orphan_age_s = orphan_age
        if not isinstance(orphan_age_s, int | float) or orphan_age_s <= 0:
            raise ConfigurationError(
                f"{SYSTEM}: orphan_age_s={orphan_age_s!r} must be a positive number of "
                "seconds.",
                fix=f"leave it at {DEFAULT_ORPHAN_AGE_S:.0f} (3 days, Iceberg's default) or "
                    "give your orphan-file cleanup's older_than in seconds")
        self.orphan_age_s = float(orphan_age_s)
        self.mode = mode
        self.keyed = validate_lake_mode(SYSTEM, mode, key, version, deleted,
                                        tombstone_retention_s=tombstone_retention_s)
        #: The table's metadata, read by ``check_schema`` on the driver and pickled with the
        #: sink to the executors (a writer without it reads it itself).
        self.layout: Layout | None = None

    def __repr__(self) -> str:
        return (f"IcebergSink({self.table!r}, catalog_name={self.catalog_name!r}, "
                f"mode={self.mode!r})")

    @property
    def tombstone_table(self) -> IcebergTombstones:
        """Keyed: the table of the deleted keys (:mod:`~sinks.iceberg.keyed`)."""
        from sinks.iceberg.keyed import IcebergTombstones  # noqa: PLC0415 - the driver's only

        assert self.keyed is not None
        return IcebergTombstones(self.catalog(), self.table, self.keyed)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("storage", None)  # a cached property: made again where it is used
        return state

    @property
    def where(self) -> str:
        return f"Iceberg table {self.catalog_name}.{self.table}"

    def target_name_and_place(self) -> tuple[str, ...]:
        """The table's name, its catalog's and its catalog namespace."""
        namespace, _, name = self.table.rpartition(".")
        return (name, self.catalog_name, namespace)

    @property
    def errors_caught(self) -> tuple[type[BaseException], ...]:
        """What the sink catches around pyiceberg, catalog, pyarrow and storage calls."""
        return (*ERRORS_CAUGHT, *catalog_errors(), *self.storage.errors)

    def catalog(self) -> Catalog:
        """The catalog client (one per process: :func:`~sinks.iceberg.catalog.open_catalog`)."""
        from sinks.iceberg.catalog import open_catalog  # noqa: PLC0415 - the driver's only

        return open_catalog(self.catalog_name, self.catalog_properties)

    def load_table(self) -> Table:
        """The table as the catalog has it now (errors: the caller classifies them)."""
        return self.catalog().load_table(self.table)

    @cached_property
    def storage(self) -> LakeStorage:
        """The table's files under its location (read from the catalog once)."""
        return lake_storage(self._layout().location, system=SYSTEM, s3_errors=S3_ERRORS,
                            s3_settings=self._s3_settings, percent_decoded=False)

    def _s3_settings(self, bucket: str) -> S3Settings:
        settings: dict[str, Any] = {
            field: self.catalog_properties[name]
            for name, field in S3_SETTINGS_OF_PROPERTIES.items() if name in self.catalog_properties}
        virtual = self.catalog_properties.get(VIRTUAL_ADDRESSING, "false").lower() == "true"
        return S3Settings(bucket, path_style=not virtual, **settings)

    def _layout(self) -> Layout:
        if self.layout is None:  # an executor given a sink check_schema never saw
            from sinks.iceberg.schema import layout_of  # noqa: PLC0415 - the driver's only

            with classified(classify, f"reading the metadata of {self.where}",
                            (*ERRORS_CAUGHT, *catalog_errors())):
                self.layout = layout_of(self.load_table())
        return self.layout

    # -- driver: before the start --------------------------------------------------------------

    def check_schema(self, columns: Sequence[Column]) -> None:
        """The table (created if asked), its settings, its columns; then its layout."""
        from sinks.iceberg import catalog, schema  # noqa: PLC0415 - the driver's only

        if self.keyed is not None:
            self.keyed.check_columns(self.where, columns)
            columns = [column for column in columns if column.name != self.keyed.deleted]
        with classified(classify, f"checking {self.where}", (*ERRORS_CAUGHT, *catalog_errors())):
            table = catalog.table_for(self.catalog(), self.table, columns, create=self.create,
                                      partition_by=self.partition_by,
                                      properties=self.properties, where=self.where)
            schema.check_settings(table.metadata, self.where)
            schema.check_columns(table.schema(), columns, self.where)
            schema.check_partition_by(table, self.partition_by, self.where)
            self.layout = schema.layout_of(table)
            if self.keyed is not None:
                self.tombstone_table.create_missing(table)

    # -- executor: begin (the rest is the kit's LakeSink) ----------------------------------------

    def open_files(self, ctx: TransactionContext
                   ) -> tuple[pa.Schema, LakeFiles[PartitionKey, IcebergFile]]:
        layout = self._layout()
        return layout.arrow_schema, transaction_files(self.storage, layout, ctx.txn_id,
                                                      self.max_file_bytes)

    def classify(self, exc: BaseException, what: str) -> TwoPhaseError:
        return classify(exc, what)

    # -- driver ---------------------------------------------------------------------------------

    def committer(self) -> Committer:
        from sinks.iceberg.committer import IcebergCommitter  # noqa: PLC0415 - driver only

        return IcebergCommitter(self)
