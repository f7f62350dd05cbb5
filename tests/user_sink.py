"""A sink a user writes from the README alone: JSON-lines files in a directory.

It imports only the documented API (``twophase`` and ``twophase.kit``), and the shared contract
and crash suites prove it (tests/test_user_sink.py): that is the claim that a user can.

==========  =====================================  =========================================
phase       what it does                           a crash here leaves
==========  =====================================  =========================================
begin       opens ``.staging/<txn>.jsonl``         a staging file: in doubt, aborted by the
                                                   next sweep or cleanup
write       appends one JSON line per row          as above
pre-commit  fsyncs it, renames it to               a prepared file: durable, invisible
            ``.prepared/<txn>.jsonl``
commit      renames it to ``<txn>.jsonl`` (the     nothing or everything; the visible file is
            visible data, and the proof of commit) the proof that a second commit is a no-op
abort       deletes the staging or prepared file   nothing left
==========  =====================================  =========================================
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
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
    TransactionContext,
    TwoPhaseCommitSink,
    TxnId,
)
from twophase.kit import namespace_from, transaction_id_reused, transaction_lost

SUFFIX = ".jsonl"


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

    def _visible(self, txn_id: TxnId) -> Path:
        return self.directory / f"{txn_id}{SUFFIX}"

    def begin_transaction(self, ctx: TransactionContext) -> FileTransaction:
        staging = self._path(".staging", ctx.txn_id)
        try:
            staging.parent.mkdir(parents=True, exist_ok=True)
            return FileTransaction(ctx, staging.open("w"))
        except OSError as exc:
            raise RetryableError(f"cannot open {staging}: {exc}.", fix="check the disk") from exc

    def write(self, txn: FileTransaction, rows: Iterable[Sequence[Any]]) -> None:
        names = txn.ctx.column_names
        for row in rows:
            txn.file.write(json.dumps(dict(zip(names, row, strict=True)), default=_plain) + "\n")
            txn.rows += 1

    def pre_commit(self, txn: FileTransaction) -> Handle:
        txn_id = txn.ctx.txn_id
        if self._visible(txn_id).exists():
            raise transaction_id_reused(txn_id, where=str(self.directory))
        txn.file.flush()
        os.fsync(txn.file.fileno())
        txn.file.close()
        prepared = self._path(".prepared", txn_id)
        prepared.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self._path(".staging", txn_id), prepared)
        return self.handle(txn_id, txn.rows)

    def discard(self, txn: FileTransaction) -> None:
        txn.file.close()
        self._path(".staging", txn.ctx.txn_id).unlink(missing_ok=True)

    def commit(self, handle: Handle) -> CommitOutcome:
        visible = self._visible(handle.txn_id)
        try:
            os.replace(self._path(".prepared", handle.txn_id), visible)
        except FileNotFoundError:
            if visible.exists():
                return CommitOutcome.ALREADY_COMMITTED
            raise transaction_lost(handle, where=str(self.directory),
                                   why="its prepared file is gone") from None
        return CommitOutcome.COMMITTED

    def abort(self, handle: Handle) -> AbortOutcome:
        if self._visible(handle.txn_id).exists():
            raise FatalError(f"refusing to abort committed transaction {handle.txn_id}.",
                             fix="a committed transaction was decided: report a bug")
        removed = False
        for area in (".prepared", ".staging"):
            path = self._path(area, handle.txn_id)
            removed |= path.exists()
            path.unlink(missing_ok=True)
        return AbortOutcome.ABORTED if removed else AbortOutcome.NOT_FOUND

    def list_in_doubt(self, namespace: str) -> list[Handle]:
        found = {}
        for area in (".staging", ".prepared"):
            for path in (self.directory / area).glob(f"{namespace}.*{SUFFIX}"):
                txn_id = TxnId.parse(path.name.removesuffix(SUFFIX))
                if txn_id.namespace == namespace:
                    found[txn_id] = self.handle(txn_id, 0)
        return sorted(found.values(), key=lambda handle: handle.txn_id)

    def rows(self) -> list[dict[str, Any]]:
        """Every visible row (for tests and readers)."""
        return [json.loads(line) for path in sorted(self.directory.glob(f"*{SUFFIX}"))
                for line in path.read_text().splitlines()]


def _plain(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} as JSON")
