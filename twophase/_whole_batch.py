"""A committer that makes a decided batch visible in ONE commit of its target (a lake table's
snapshot), while the driver still commits the batch's handles one by one.

The driver commits a decision's handles one by one (``commit(handle)``, from several
threads), then calls ``finish_batch`` once. This committer learns the decision's handles
first: ``commit_stages(handles)`` (called by the coordinator, and for a group member by the
group's committer, before any commit of the batch) announces them. The first ``commit`` of any
handle of an announced batch then settles *every* handle of the batch through
:meth:`WholeBatchCommitter.settle` (under the batch's lock; the other threads wait and find
their handle settled): a reader sees the batch whole or not at all, and in a group the target
becomes visible at its place in the commit order, not after the last member.
``finish_batch`` announces the batch again and settles whatever of it is not settled yet
(nothing, on the driver's path; everything for a caller that never announced it), then calls
:meth:`WholeBatchCommitter.forget_settled`. A handle committed on its own (``sink.commit``,
no announcement) is a batch of one.

``settle`` must be idempotent (a proof of commit first): recovery settles a batch again.
"""

from __future__ import annotations

import contextlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Any

from twophase._handle import Handle, TxnId
from twophase.sink import AbortOutcome, CommitOutcome, CommitStage, Committer


class WholeBatchCommitter(Committer, ABC):
    """One commit of the target per batch (module docstring)."""

    def __init__(self, sink: Any) -> None:
        super().__init__(sink)
        self._lock = threading.Lock()
        self._batches: dict[Hashable, tuple[Handle, ...]] = {}
        self._batch_locks: dict[Hashable, threading.Lock] = {}
        self._settled: dict[TxnId, CommitOutcome] = {}

    @abstractmethod
    def batch_key(self, txn_id: TxnId) -> Hashable:
        """What names the transaction's batch in the target (the query and the batch id)."""

    @abstractmethod
    def settle(self, handles: tuple[Handle, ...]) -> Mapping[TxnId, CommitOutcome]:
        """Prove or commit ``handles`` (one batch's) in one commit: each one's outcome."""

    @abstractmethod
    def abort(self, handle: Handle) -> AbortOutcome:
        """Roll the transaction back (its files deleted), unless a commit holds it."""

    def forget_settled(self, batch: int, handles: Sequence[Handle]) -> None:
        """After ``finish_batch`` settled the batch: forget what kept it in doubt."""

    def commit_stages(self, handles: Sequence[Handle]) -> list[CommitStage]:
        """The decision's handles, announced: the first commit of a batch commits it whole."""
        self._announce(handles)
        return super().commit_stages(handles)

    def commit(self, handle: Handle) -> CommitOutcome:
        key = self.batch_key(handle.txn_id)
        with self._holding(key):
            if handle.txn_id not in self._settled:
                batch = self._batches.get(key, ())
                announced = any(other.txn_id == handle.txn_id for other in batch)
                self._settled.update(self.settle(batch if announced else (handle,)))
            return self._settled[handle.txn_id]

    def finish_batch(self, namespace: str, batch: int, handles: Sequence[Handle]) -> None:
        """Settle what of the batch is not settled yet (nothing after its commits), then
        :meth:`forget_settled`."""
        self._announce(handles)
        for key in {self.batch_key(handle.txn_id) for handle in handles}:
            with self._holding(key):
                if rest := [handle for handle in self._batches[key]
                            if handle.txn_id not in self._settled]:
                    self._settled.update(self.settle(tuple(rest)))
        self.forget_settled(batch, handles)

    def _announce(self, handles: Sequence[Handle]) -> None:
        by_key: dict[Hashable, list[Handle]] = {}
        for handle in handles:
            by_key.setdefault(self.batch_key(handle.txn_id), []).append(handle)
        with self._lock:
            self._batches.update({key: tuple(found) for key, found in by_key.items()})

    @contextlib.contextmanager
    def _holding(self, key: Hashable) -> Iterator[None]:
        with self._lock:
            lock = self._batch_locks.setdefault(key, threading.Lock())
        with lock:
            yield
