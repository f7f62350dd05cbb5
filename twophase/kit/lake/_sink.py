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
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, Self, TypeVar

from twophase._classify import classified, transaction_id_reused, transaction_lost
from twophase._handle import Handle, TxnId
from twophase._rows import chunks
from twophase._whole_batch import WholeBatchCommitter
from twophase.errors import ConfigurationError, FatalError, SchemaMismatchError, TwoPhaseError
from twophase.kit.lake._files import (
    MS_PER_S,
    LakeFiles,
    LakeIntents,
    LakeStorage,
    conform_table,
)
from twophase.sink import AbortOutcome, TransactionContext, TwoPhaseCommitSink

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)


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
    #: The table's columns as Arrow: what every chunk is conformed to.
    schema: pa.Schema
    files: LakeFiles[Any, Any]


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
        """The files a handle lists."""
        return [self.file_record.from_json(data)  # type: ignore[misc]
                for data in handle.data.get("files", ())]

    def begin_transaction(self, ctx: TransactionContext) -> LakeTransaction:
        return LakeTransaction(ctx, *self.open_files(ctx))

    def write(self, txn: LakeTransaction, rows: Iterable[Sequence[Any]]) -> None:
        import pyarrow as pa  # noqa: PLC0415 - the framework itself never needs pyarrow

        schema_of_rows = self._row_schema(txn)
        for chunk in chunks(rows, self.chunk_size):
            if misfit := next((len(row) for row in chunk
                               if len(row) != len(schema_of_rows)), None):
                self.discard(txn)
                raise SchemaMismatchError(
                    f"{self.where}: a row has {misfit} values for the {len(schema_of_rows)} "
                    f"columns {txn.ctx.column_names}.",
                    fix="write rows of the columns the transaction's context names")
            with self._writing(txn, f"writing {txn.ctx.txn_id} into {self.where}"):
                columns = [pa.array(values, type=field.type) for values, field in
                           zip(zip(*chunk, strict=True), schema_of_rows, strict=True)]
                self._append(txn, pa.Table.from_arrays(columns, schema=schema_of_rows))

    def write_arrow(self, txn: LakeTransaction, batches: Iterable[pa.RecordBatch]) -> None:
        import pyarrow as pa  # noqa: PLC0415 - the framework itself never needs pyarrow

        for batch in batches:
            with self._writing(txn, f"writing {txn.ctx.txn_id} into {self.where}"):
                self._append(txn, pa.Table.from_batches([batch]))

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

    def _append(self, txn: LakeTransaction, table: pa.Table) -> None:
        txn.files.write(conform_table(table, txn.schema, self.where))

    def _row_schema(self, txn: LakeTransaction) -> pa.Schema:
        import pyarrow as pa  # noqa: PLC0415 - the framework itself never needs pyarrow

        unknown = [name for name in txn.ctx.column_names if name not in txn.schema.names]
        if unknown:
            raise FatalError(f"{self.where} has no column {unknown}.",
                             fix="run check_schema (the driver does) before writing")
        return pa.schema([txn.schema.field(name).with_nullable(True)
                          for name in txn.ctx.column_names])

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

    def forget_settled(self, batch: int, handles: Sequence[Handle]) -> None:
        """Delete the intents of the batch's transactions (committed)."""
        with classified(self.sink.classify, f"deleting the intents of batch {batch} in "
                        f"{self.sink.where}", self.sink.errors_caught):
            LakeIntents(self.sink.storage).forget([handle.txn_id for handle in handles
                                                   if self.sink.files_in(handle)])

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
                intents.forget([handle.txn_id])
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
                intents.forget(committed)
        return [self.sink.handle(txn_id, rows=0, files=[
                    self.sink.file_record.unsealed(path).to_json() for path in paths])
                for txn_id, paths in sorted(found.items()) if txn_id not in committed]
