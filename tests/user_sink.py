"""A sink a user writes from the README alone: JSON-lines files in a directory.

It imports only the documented API (``twophase`` and ``twophase.kit``), and the shared contract
and crash suites prove it (tests/unit/test_user_sink.py): that is the claim that a user can.

==========  =================  ==================  =================  =========================
phase       what it does       a crash here        resolved by        raises
                               leaves
==========  =================  ==================  =================  =========================
begin       opens              a staging file      listed in doubt,   RetryableError,
            ``.staging/<txn>   (it outlives the    aborted by the     ConfigurationError (the
            .jsonl``           writer)             next sweep or      directory), FatalError
                                                   cleanup            (disk full)
write       appends one JSON   as above            as above           as begin; SchemaMismatch-
            line per row                                              Error (a value JSON
                                                                      cannot hold)
pre-commit  fsyncs it, renames a prepared file:    the driver's       FatalError (the id was
            it to ``.prepared  durable, invisible  decision           committed once), as begin
            /<txn>.jsonl``
commit      renames it to      nothing or          a repeated commit  TransactionLostError
            ``<txn>.jsonl``    everything          finds the visible  (neither file), as begin
            (visible: also                         file: ALREADY_
            the proof)                             COMMITTED
abort       deletes the        nothing left        NOT_FOUND when     FatalError (committed)
            staging or                             repeated
            prepared file
==========  =================  ==================  =================  =========================
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

from twophase import (
    AbortOutcome,
    CommitOutcome,
    ConfigurationError,
    FatalError,
    Handle,
    RetryableError,
    SchemaMismatchError,
    TransactionContext,
    TwoPhaseCommitSink,
    TwoPhaseError,
    TxnId,
)
from twophase.kit import (
    ErrorTable,
    as_utc,
    classified,
    namespace_from,
    transaction_id_reused,
    transaction_lost,
)

SUFFIX = ".jsonl"
#: The file system's errors by errno name; anything else is retried (a passing I/O hiccup).
ERRORS = ErrorTable("JsonLinesSink", default=(RetryableError, "retried; check the disk"), rules={
    "ENOSPC": (FatalError, "free disk space under the directory, then restart"),
    "EDQUOT": (FatalError, "raise the quota of the directory, then restart"),
    "EACCES": (ConfigurationError, "make the directory writable by the job"),
    "EROFS": (ConfigurationError, "point the sink at a writable file system"),
    "ENOTDIR": (ConfigurationError, "point the sink at a directory"),
})


def _classify(exc: BaseException, what: str) -> TwoPhaseError:
    if isinstance(exc, TypeError):  # json.dumps of a value it cannot hold
        return SchemaMismatchError(f"{what}: {exc}.", fix="cast the column to a plain type")
    code = errno.errorcode.get(getattr(exc, "errno", None) or 0, "")
    return ERRORS.error(code, what, str(exc))


@dataclass
class FileTransaction:
    ctx: TransactionContext
    file: IO[str]
    rows: int = 0


class JsonLinesSink(TwoPhaseCommitSink[FileTransaction]):
    """Rows as JSON lines, one visible file per committed transaction, in ``directory``."""

    kind = "jsonlines"

    def __init__(self, directory: str | Path) -> None:
        if not str(directory):
            raise ConfigurationError("JsonLinesSink needs a directory.", fix="pass directory=")
        self.directory = Path(directory)

    def default_namespace(self) -> str:
        return namespace_from(self.directory.name, self.kind)

    def _path(self, area: str, txn_id: TxnId) -> Path:
        return self.directory / area / f"{txn_id}{SUFFIX}"

    def _guard(self, what: str, txn_id: TxnId) -> AbstractContextManager[None]:
        return classified(_classify, f"{what} of {txn_id} in {self.directory}",
                          (OSError, TypeError))

    def begin_transaction(self, ctx: TransactionContext) -> FileTransaction:
        staging = self._path(".staging", ctx.txn_id)
        with self._guard("begin", ctx.txn_id):
            staging.parent.mkdir(parents=True, exist_ok=True)
            return FileTransaction(ctx, staging.open("w"))

    def write(self, txn: FileTransaction, rows: Iterable[Sequence[Any]]) -> None:
        names = txn.ctx.column_names
        with self._guard("write", txn.ctx.txn_id):
            for row in rows:
                txn.file.write(json.dumps(dict(zip(names, row, strict=True)), default=_plain)
                               + "\n")
                txn.rows += 1

    def pre_commit(self, txn: FileTransaction) -> Handle:
        txn_id = txn.ctx.txn_id
        if self._path(".", txn_id).exists():
            raise transaction_id_reused(txn_id, where=str(self.directory))
        with self._guard("pre-commit", txn_id):
            txn.file.flush()
            os.fsync(txn.file.fileno())
            txn.file.close()
            self._path(".prepared", txn_id).parent.mkdir(exist_ok=True)
            os.replace(self._path(".staging", txn_id), self._path(".prepared", txn_id))
        return self.handle(txn_id, txn.rows)

    def discard(self, txn: FileTransaction) -> None:
        txn.file.close()
        self._path(".staging", txn.ctx.txn_id).unlink(missing_ok=True)

    def commit(self, handle: Handle) -> CommitOutcome:
        visible = self._path(".", handle.txn_id)
        with self._guard("commit", handle.txn_id):
            try:
                os.replace(self._path(".prepared", handle.txn_id), visible)
            except FileNotFoundError:
                if visible.exists():
                    return CommitOutcome.ALREADY_COMMITTED
                raise transaction_lost(handle, where=str(self.directory),
                                       why="its prepared file is gone") from None
        return CommitOutcome.COMMITTED

    def abort(self, handle: Handle) -> AbortOutcome:
        if self._path(".", handle.txn_id).exists():
            raise FatalError(f"refusing to abort committed transaction {handle.txn_id}.",
                             fix="a committed transaction was decided: report a bug")
        held = [path for area in (".prepared", ".staging")
                if (path := self._path(area, handle.txn_id)).exists()]
        with self._guard("abort", handle.txn_id):
            for path in held:
                path.unlink(missing_ok=True)
        return AbortOutcome.ABORTED if held else AbortOutcome.NOT_FOUND

    def list_in_doubt(self, namespace: str) -> list[Handle]:
        found = {TxnId.parse(path.name.removesuffix(SUFFIX))
                 for area in (".staging", ".prepared")
                 for path in (self.directory / area).glob(f"{namespace}.*{SUFFIX}")}
        return [self.handle(txn_id, 0) for txn_id in sorted(found)
                if txn_id.namespace == namespace]

    def rows(self) -> list[dict[str, Any]]:
        """Every visible row (for tests and readers)."""
        return [json.loads(line) for path in sorted(self.directory.glob(f"*{SUFFIX}"))
                for line in path.read_text().splitlines()]


def _plain(value: Any) -> Any:
    """An instant as UTC with its offset, a wall clock or date as is, a decimal as digits."""
    if isinstance(value, datetime):
        return (as_utc(value) if value.tzinfo else value).isoformat()
    if isinstance(value, (date, Decimal)):
        return str(value) if isinstance(value, Decimal) else value.isoformat()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")
