"""The sink and the committer every lake-table sink shares (Delta, Iceberg): what differs is
the table format's files and its proof of commit, never the phases around them.

:class:`LakeSink` is the executor's side: rows (or Spark's Arrow batches) conformed to the
table's Arrow schema, written by the transaction's :class:`~twophase.kit.lake.LakeFiles`, closed
and listed in the handle by pre-commit; any failure discards the files, and a file that exists
already is a transaction id used twice. A sink gives :meth:`LakeSink.open_files` (the table's
schema and the transaction's files), its error classifier and its committer, which is
everything the driver does.

:class:`LakeCommitter` is the driver's: one commit of the table per batch
(:class:`~twophase._whole_batch.WholeBatchCommitter`), and the abort and the listing in doubt
by the transactions' intents (:class:`~twophase.kit.lake.LakeIntents`): a committer gives
:meth:`LakeCommitter.committed_among` (which transactions, with the files each created, a
commit of the table holds: the format's proof) and its ``settle``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from abc import abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, Self, TypeVar

from twophase._classify import classified, transaction_id_reused, transaction_lost
from twophase._handle import Handle, TxnId
from twophase._keyed import HELD_CHUNKS, Keyed
from twophase._rows import chunks
from twophase._whole_batch import WholeBatchCommitter
from twophase.errors import ConfigurationError, FatalError, SchemaMismatchError, TwoPhaseError
from twophase.kit import as_utc
from twophase.kit.lake._files import (
    MS_PER_S,
    LakeFiles,
    LakeIntents,
    LakeStorage,
    conform_table,
)
from twophase.kit.lake._keyed import (
    StagedFile,
    check_upserts,
    read_staged,
    staged_files,
    staged_schema,
)
from twophase.sink import AbortOutcome, TransactionContext, TwoPhaseCommitSink

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)


def _marker_types() -> dict[str, Any]:
    import pyarrow as pa  # noqa: PLC0415 - the framework itself never needs pyarrow

    return {"boolean": pa.bool_(), "string": pa.string()}


class LakeTombstones(Protocol):
    """A keyed lake table's tombstone table, as cleanup and status use it."""

    def count(self) -> tuple[int, datetime | None]:
        """How many tombstones, and the oldest one's ``deleted_at``."""

    def purge(self, older_than: datetime) -> int:
        """Delete the tombstones of deletes applied before ``older_than``: how many."""


class LakeFileRecord(Protocol):
    """A data file as a handle lists it (the format's own description of it)."""

    @property
    def path(self) -> str:
        """Relative to the table's storage root."""

    def to_json(self) -> dict[str, Any]: ...

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self: ...

    @classmethod
    def unsealed(cls, path: str) -> Self:
        """A file an intent names, as an abort needs it: its path alone."""


Record = TypeVar("Record", bound=LakeFileRecord)


@dataclass
class LakeTransaction:
    """One partition's files (live on the executor between begin and pre-commit)."""

    ctx: TransactionContext
    #: The table's columns as Arrow: what every chunk is conformed to (keyed: the staged
    #: changes' columns).
    schema: pa.Schema
    files: LakeFiles[Any, Any]
    #: Keyed: the table's own columns (NOT NULL checked on upserts).
    table_schema: pa.Schema | None = None


def validate_max_file_bytes(sink: str, max_file_bytes: int, default: int) -> int:
    if not isinstance(max_file_bytes, int) or max_file_bytes < 1:
        raise ConfigurationError(
            f"{sink}: max_file_bytes={max_file_bytes!r} must be a positive integer.",
            fix=f"leave it at {default} or pass a positive int")
    return max_file_bytes


class LakeSink(TwoPhaseCommitSink[LakeTransaction], Generic[Record]):
    """The executor's side of a lake sink (module docstring)."""

    #: The format's file record (its ``to_json`` goes into the handle).
    file_record: ClassVar[type[LakeFileRecord]]
    chunk_size: int
    max_file_bytes: int
    #: The keyed mode (:mod:`~twophase.kit.lake._keyed`): changes staged, applied by the
    #: driver; None: rows appended.
    keyed: Keyed | None = None

    @property
    def record_type(self) -> type[LakeFileRecord]:
        """What a handle lists: the format's data files, or (keyed) staged files."""
        return StagedFile if self.keyed is not None else self.file_record

    @property
    @abstractmethod
    def storage(self) -> LakeStorage:
        """The table's files."""

    @property
    @abstractmethod
    def where(self) -> str:
        """The table, in errors and logs."""

    @property
    @abstractmethod
    def errors_caught(self) -> tuple[type[BaseException], ...]:
        """What the sink catches around its library and storage calls."""

    @abstractmethod
    def classify(self, exc: BaseException, what: str) -> TwoPhaseError:
        """The sink's one error table's verdict on ``exc``."""

    @abstractmethod
    def open_files(self, ctx: TransactionContext) -> tuple[pa.Schema, LakeFiles[Any, Any]]:
        """The table's Arrow schema and the transaction's files (nothing created yet)."""

    def files_in(self, handle: Handle) -> list[Record]:
        """The files a handle lists (keyed: its staged files)."""
        return [self.record_type.from_json(data)  # type: ignore[misc]
                for data in handle.data.get("files", ())]

    @property
    def tombstone_table(self) -> LakeTombstones:
        """Keyed: the table of the deleted keys (the format's; a sink without a keyed mode
        has none)."""
        raise ConfigurationError(f"{self.where}: this sink has no keyed mode.",
                                 fix="leave mode= out (rows appended)")

    def staged_in(self, handle: Handle) -> list[StagedFile]:
        """A keyed handle's staged files."""
        return [StagedFile.from_json(data) for data in handle.data.get("files", ())]

    def begin_transaction(self, ctx: TransactionContext) -> LakeTransaction:
        schema, files = self.open_files(ctx)
        if self.keyed is None:
            return LakeTransaction(ctx, schema, files)
        self.keyed.check_rows(self.where, ctx.column_names)
        staged = staged_schema(self.keyed, schema)
        return LakeTransaction(ctx, staged, staged_files(self.storage, ctx.txn_id, staged,
                                                         self.max_file_bytes),
                               table_schema=schema)

    def write(self, txn: LakeTransaction, rows: Iterable[Sequence[Any]]) -> None:
        self._write_tables(txn, self._tables_of_rows(txn, rows))

    def write_arrow(self, txn: LakeTransaction, batches: Iterable[pa.RecordBatch]) -> None:
        import pyarrow as pa  # noqa: PLC0415 - the framework itself never needs pyarrow

        self._write_tables(txn, (pa.Table.from_batches([batch]) for batch in batches))

    def _tables_of_rows(self, txn: LakeTransaction, rows: Iterable[Sequence[Any]]
                        ) -> Iterator[pa.Table]:
        """``rows`` as Arrow tables of a chunk each (a row of another width refused)."""
        import pyarrow as pa  # noqa: PLC0415 - the framework itself never needs pyarrow

        schema_of_rows = self._row_schema(txn)
        for chunk in chunks(rows, self.chunk_size):
            if misfit := next((len(row) for row in chunk
                               if len(row) != len(schema_of_rows)), None):
                raise SchemaMismatchError(
                    f"{self.where}: a row has {misfit} values for the {len(schema_of_rows)} "
                    f"columns {txn.ctx.column_names}.",
                    fix="write rows of the columns the transaction's context names")
            columns = [pa.array(values, type=field.type) for values, field in
                       zip(zip(*chunk, strict=True), schema_of_rows, strict=True)]
            yield pa.Table.from_arrays(columns, schema=schema_of_rows)

    def _write_tables(self, txn: LakeTransaction, tables: Iterable[pa.Table]) -> None:
        """Each table conformed and written (keyed: the task's changes reduced per key across
        them, :meth:`~twophase.kit.Keyed.newest_in_tables`, then staged), every step under
        :meth:`_writing`: a failure discards the transaction's files."""
        if self.keyed is not None:
            tables = self.keyed.newest_in_tables(tables, HELD_CHUNKS * self.chunk_size)
        pending = iter(tables)
        while True:
            with self._writing(txn, f"writing {txn.ctx.txn_id} into {self.where}"):
                table = next(pending, None)
                if table is None:
                    return
                if self.keyed is None:
                    txn.files.write(conform_table(table, txn.schema, self.where))
                else:
                    self._stage(txn, table)

    def pre_commit(self, txn: LakeTransaction) -> Handle:
        with self._writing(txn, f"closing the files of {txn.ctx.txn_id}"):
            files = txn.files.close()
        log.debug("pre-committed %s: %d rows in %d files", txn.ctx.txn_id, txn.files.rows,
                  len(files))
        return self.handle(txn.ctx.txn_id, rows=txn.files.rows,
                           files=[data_file.to_json() for data_file in files])

    def discard(self, txn: LakeTransaction) -> None:
        """Delete the files written so far. Never raises."""
        txn.files.delete()

    @contextlib.contextmanager
    def _writing(self, txn: LakeTransaction, what: str) -> Iterator[None]:
        """Any failure discards the transaction's files and is classified; a file that exists
        already is a transaction id used twice."""
        with classified(self.classify, what, self.errors_caught,
                        on_error=lambda: self.discard(txn)):
            try:
                yield
            except FileExistsError as exc:
                raise transaction_id_reused(txn.ctx.txn_id, where=self.where) from exc

    def _stage(self, txn: LakeTransaction, flagged: pa.Table) -> None:
        """Keyed: a task's reduced changes (flagged) into its staged files."""
        assert txn.table_schema is not None
        staged = conform_table(flagged, txn.schema, self.where)
        check_upserts(staged, txn.table_schema, self.where)
        txn.files.write(staged)

    def _row_schema(self, txn: LakeTransaction) -> pa.Schema:
        import pyarrow as pa  # noqa: PLC0415 - the framework itself never needs pyarrow

        marker = self.keyed.deleted if self.keyed is not None else None
        unknown = [name for name in txn.ctx.column_names
                   if name not in txn.schema.names and name != marker]
        if unknown:
            raise FatalError(f"{self.where} has no column {unknown}.",
                             fix="run check_schema (the driver does) before writing")
        return pa.schema([pa.field(name, _marker_types().get(column.type, pa.string()))
                          if name == marker else txn.schema.field(name).with_nullable(True)
                          for name, column in zip(txn.ctx.column_names, txn.ctx.columns,
                                                  strict=True)])

    #: Deprecated on the sink (removed in 0.6.0): :meth:`LakeCommitter.list_in_doubt`, on
    #: ``sink.committer()``.
    moved_to_committer = frozenset({"list_in_doubt"})


@dataclass(frozen=True)
class LakeCleanup:
    """What deletes a lake table's unreferenced files, for :meth:`LakeCommitter.check_addable`'s
    messages: its name (``"a VACUUM"``), the table's commit that holds a file (``"commit"``,
    ``"snapshot"``), the setting of its age and that age, and what adding an older file would
    risk (``""``, or ``", and adding it now could ..."``)."""

    name: str
    commit: str
    age_setting: str
    age_s: float
    risk: str = ""


class LakeCommitter(WholeBatchCommitter):
    """The driver's side of a lake sink (module docstring)."""

    sink: LakeSink[Any]

    def tombstones(self) -> tuple[int, datetime | None]:
        """Keyed: how many tombstones, and when the oldest one's delete was applied."""
        if self.sink.keyed is None:
            return 0, None
        with classified(self.sink.classify, f"counting the tombstones of {self.sink.where}",
                        self.sink.errors_caught):
            return self.sink.tombstone_table.count()

    def purge_tombstones(self, older_than: datetime) -> int:
        """Keyed: delete the tombstones of deletes applied before ``older_than``."""
        if self.sink.keyed is None:
            return 0
        with classified(self.sink.classify, f"purging the tombstones of {self.sink.where}",
                        self.sink.errors_caught):
            purged = self.sink.tombstone_table.purge(as_utc(older_than))
        log.info("purged %d tombstones of %s older than %s", purged, self.sink.where,
                 older_than)
        return purged

    @abstractmethod
    def committed_among(self, found: Mapping[TxnId, Sequence[str]]) -> set[TxnId]:
        """Those of ``found`` (transactions, with the files each created; none empty) whose
        files a commit of the table holds: the format's proof, on one read of the table."""

    def check_addable(self, handle: Handle, path: str, *, created_ms: int,
                      cleanup: LakeCleanup) -> None:
        """Raise :class:`~twophase.errors.TransactionLostError` (nothing of the batch added)
        unless ``handle``'s file at ``path``, created at ``created_ms`` (epoch milliseconds),
        is still there and younger than the age at which ``cleanup`` may delete it."""
        batch = handle.txn_id.batch
        if self.sink.storage.stat(path) is None:
            raise transaction_lost(handle, where=self.sink.where, why=(
                f"its file {path} is gone from the table's data area (deleted by "
                f"{cleanup.name} or by hand) and no {cleanup.commit} holds it; nothing of batch "
                f"{batch} was added"))
        if created_ms / MS_PER_S < time.time() - cleanup.age_s:
            raise transaction_lost(handle, where=self.sink.where, why=(
                f"its file {path} is older than {cleanup.age_setting}: {cleanup.name} may "
                f"delete it at any moment{cleanup.risk}; nothing of batch {batch} was added"))

    def staged_changes(self, handles: Sequence[Handle], table_schema: pa.Schema) -> pa.Table:
        """Keyed: the staged changes of ``handles``, reduced to the newest per key across them
        (a staged file gone: :class:`~twophase.errors.TransactionLostError`, nothing applied)."""
        keyed, storage = self.sink.keyed, self.sink.storage
        assert keyed is not None
        files = []
        for handle in handles:
            for staged in self.sink.staged_in(handle):
                if storage.stat(staged.path) is None:
                    raise transaction_lost(handle, where=self.sink.where, why=(
                        f"its staged changes {staged.path} are gone (deleted by hand, or by a "
                        f"cleanup of the table's _twophase folder); nothing of batch "
                        f"{handle.txn_id.batch} was applied"))
                files.append(staged)
        return keyed.reduce_arrow(read_staged(storage, files,
                                              staged_schema(keyed, table_schema)))

    def forget_settled(self, batch: int, handles: Sequence[Handle]) -> None:
        """Delete the intents of the batch's transactions (committed)."""
        with classified(self.sink.classify, f"deleting the intents of batch {batch} in "
                        f"{self.sink.where}", self.sink.errors_caught):
            files = {handle.txn_id: [data_file.path for data_file in self.sink.files_in(handle)]
                     for handle in handles}
            self._forget_committed({txn_id: paths for txn_id, paths in files.items() if paths})

    def _forget_committed(self, found: Mapping[TxnId, Sequence[str]]) -> None:
        """Forget committed transactions: their intents; keyed, first their staged files,
        which no commit references (a crash between the two: the intent is found again)."""
        if self.sink.keyed is not None:
            self.sink.storage.delete([path for paths in found.values() for path in paths
                                      if self.sink.storage.stat(path) is not None])
        LakeIntents(self.sink.storage).forget(found)

    def abort(self, handle: Handle) -> AbortOutcome:
        """Delete the transaction's files (those its handle lists and those its intent
        names), then its intent, unless a commit holds them (then NOT_FOUND, a warning)."""
        storage, intents = self.sink.storage, LakeIntents(self.sink.storage)
        with classified(self.sink.classify, f"abort of transaction {handle.txn_id} in "
                        f"{self.sink.where}", self.sink.errors_caught):
            paths = {data_file.path for data_file in self.sink.files_in(handle)}
            paths.update(intents.files_named(handle.txn_id))
            if paths and self.committed_among({handle.txn_id: sorted(paths)}):
                log.warning("abort of %s: it is committed already, nothing to delete",
                            handle.txn_id)
                self._forget_committed({handle.txn_id: sorted(paths)})
                return AbortOutcome.NOT_FOUND
            existing = [path for path in sorted(paths) if storage.stat(path) is not None]
            storage.delete(existing)
            intents.forget([handle.txn_id])
        return AbortOutcome.ABORTED if existing else AbortOutcome.NOT_FOUND

    def list_in_doubt(self, namespace: str) -> list[Handle]:
        """Transactions of ``namespace`` with an intent and no proven commit; the intent of
        one proven committed is deleted on sight (a crash between its commit and
        ``finish_batch``). Never a listing of the data area."""
        intents = LakeIntents(self.sink.storage)
        with classified(self.sink.classify, f"listing in-doubt transactions of namespace "
                        f"{namespace!r} in {self.sink.where}", self.sink.errors_caught):
            found = intents.pending(namespace)
            with_files = {txn_id: paths for txn_id, paths in found.items() if paths}
            committed = self.committed_among(with_files) if with_files else set()
            if committed:
                log.info("forgetting the intents of %d committed transactions",
                         len(committed))
                self._forget_committed({txn_id: found[txn_id] for txn_id in committed})
        return [self.sink.handle(txn_id, rows=0, files=[
                    self.sink.record_type.unsealed(path).to_json() for path in paths])
                for txn_id, paths in sorted(found.items()) if txn_id not in committed]
