"""The driver side of :class:`~sinks.redis.RedisStreamSink`: a batch committed by the commit
script (:mod:`~sinks.redis.scripts`), all its handles in one script while they fit its budget;
aborts, the listing in doubt and the purge of proofs.

A stage's handles are settled at once (:class:`twophase.kit.WholeBatchCommitter`): one script
checks every transaction's proof or staging before it writes, then moves them all, so readers
of the stream see the batch appear whole. A batch larger than ``max_rows_per_script`` takes
several scripts, each moving whole chunks in order and recording its progress; a crash between
two leaves a prefix of the batch visible until recovery runs the rest (the sink's docstring).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from sinks.redis.connection import Client, text
from sinks.redis.errors import (
    COMMIT_IN_PROGRESS,
    STAGING_INCOMPLETE,
    abort_refused,
    script_refusal,
)
from sinks.redis.keys import StreamKeys
from sinks.redis.scripts import ABORT, ABORTED, ALREADY, COMMIT, PENDING
from twophase import AbortOutcome, CommitOutcome, Handle, TxnId
from twophase.kit import WholeBatchCommitter, transaction_lost

if TYPE_CHECKING:
    from sinks.redis.sink import RedisStreamSink

log = logging.getLogger(__name__)

#: Proofs read per HSCAN call of the purge.
PURGE_SCAN_COUNT = 1000
MICROS = 1_000_000


def chunks_of(handle: Handle) -> int:
    """The staged chunks a pre-committed handle names (none for a listed one)."""
    return int(handle.data.get("chunks", 0))


class RedisStreamCommitter(WholeBatchCommitter):
    """Commits, aborts, lists and purges through the process's client (one per settings)."""

    sink: RedisStreamSink

    @property
    def keys(self) -> StreamKeys:
        return self.sink.keys

    def settle(self, handles: tuple[Handle, ...]) -> Mapping[TxnId, CommitOutcome]:
        """Commit scripts until every handle is committed or proven so (module docstring)."""
        outcomes: dict[TxnId, CommitOutcome] = {}
        left = list(handles)
        while left:
            answers = self.commit_step(left)
            for handle, answer in zip(left, answers, strict=True):
                if answer == ALREADY:  # before this settle: a step of it moved none
                    outcomes.setdefault(handle.txn_id, CommitOutcome.ALREADY_COMMITTED)
                else:  # committed now, or pending: the next steps move the rest
                    outcomes[handle.txn_id] = CommitOutcome.COMMITTED
            left = [handle for handle, answer in zip(left, answers, strict=True)
                    if answer == PENDING]
        return outcomes

    def commit_step(self, handles: Sequence[Handle]) -> list[bytes]:
        """One commit script over ``handles``: its answer for each (``already``,
        ``committed``, ``pending``)."""
        keys = [*self.keys.bookkeeping(), *(self.keys.stage(h.txn_id) for h in handles)]
        args: list[str | int] = [self.sink.max_rows_per_script]
        for handle in handles:
            args += [str(handle.txn_id), chunks_of(handle)]

        def step(client: Client) -> list[bytes]:
            try:
                answers: list[bytes] = client.register_script(COMMIT)(keys, args)
            except Exception as exc:
                if (detail := script_refusal(exc, STAGING_INCOMPLETE)) is not None:
                    raise self._lost(handles, detail) from exc
                raise
            return answers
        return self.sink.settings.run(step, f"commit of {len(handles)} transactions of batch "
                                      f"{handles[0].txn_id.batch} into {self.sink.where}")

    def _lost(self, handles: Sequence[Handle], detail: str) -> Exception:
        txn = detail.partition(":")[0]
        handle = next((h for h in handles if str(h.txn_id) == txn), handles[0])
        return transaction_lost(handle, where=self.sink.where,
                                why=f"its staged rows are gone ({detail}): the server lost "
                                "data (evicted, flushed, or restored from an older AOF)")

    def abort(self, handle: Handle) -> AbortOutcome:
        keys = [self.keys.proofs, self.keys.staged, self.keys.moved,
                self.keys.stage(handle.txn_id)]

        def step(client: Client) -> bytes:
            try:
                answer: bytes = client.register_script(ABORT)(keys, [str(handle.txn_id)])
            except Exception as exc:
                if (detail := script_refusal(exc, COMMIT_IN_PROGRESS)) is not None:
                    raise abort_refused(str(handle.txn_id), detail, self.sink.where) from exc
                raise
            return answer
        answer = self.sink.settings.run(step, f"abort of {handle.txn_id}")
        return AbortOutcome.ABORTED if answer == ABORTED else AbortOutcome.NOT_FOUND

    def list_in_doubt(self, namespace: str) -> list[Handle]:
        """The transactions of ``namespace`` begun and not resolved (the index)."""
        def step(client: Client) -> list[str]:
            return [text(name) for name in client.hkeys(self.keys.staged)]
        names = self.sink.settings.run(step, f"listing in doubt of {self.sink.where}")
        txns = sorted(TxnId.parse(name) for name in names)
        return [self.sink.handle(txn, 0) for txn in txns if txn.namespace == namespace]

    def purge_commit_records(self, namespace: str, older_than: datetime) -> int:
        """Drop ``namespace``'s proofs of commits that ran before ``older_than``."""
        cutoff = int(older_than.timestamp() * MICROS)

        def step(client: Client) -> int:
            old = [name for name, stamp in client.hscan_iter(self.keys.proofs,
                                                             count=PURGE_SCAN_COUNT)
                   if int(stamp) < cutoff
                   and TxnId.parse(text(name)).namespace == namespace]
            return int(client.hdel(self.keys.proofs, *old)) if old else 0
        return self.sink.settings.run(step, f"purge of proofs in {self.sink.where}")
