"""A committer that makes a decided batch visible in ONE commit of its target (a lake table's
snapshot).

The coordinator commits a stage's handles through :meth:`Committer.commit_handles`; this
committer answers with ONE settle of them all (``StageCommits.at_once``): a reader sees the
batch whole or not at all, and in a sink group the target becomes visible at its place in the
commit order. A handle committed on its own (``committer.commit(handle)``) is a settle of one.
``finish_batch`` then forgets what kept the batch in doubt (:meth:`forget_settled`).

``settle`` must be idempotent (a proof of commit first): a retry, and recovery, settle again.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

from twophase._handle import Handle, TxnId
from twophase.sink import AbortOutcome, CommitOutcome, Committer, StageCommits


class WholeBatchCommitter(Committer, ABC):
    """One commit of the target per batch (module docstring)."""

    @abstractmethod
    def settle(self, handles: tuple[Handle, ...]) -> Mapping[TxnId, CommitOutcome]:
        """Prove or commit ``handles`` (one batch's) in one commit: each one's outcome."""

    @abstractmethod
    def abort(self, handle: Handle) -> AbortOutcome:
        """Roll the transaction back (its files deleted), unless a commit holds it."""

    def forget_settled(self, batch: int, handles: Sequence[Handle]) -> None:
        """After the batch's commit: forget what kept it in doubt (nothing by default)."""

    def commit_handles(self, handles: Sequence[Handle], commits: StageCommits
                       ) -> list[CommitOutcome]:
        """The stage in ONE settle."""
        return commits.at_once(lambda: self.settle(tuple(handles)), handles)

    def commit(self, handle: Handle) -> CommitOutcome:
        """A settle of one."""
        return self.settle((handle,))[handle.txn_id]

    def finish_batch(self, namespace: str, batch: int, handles: Sequence[Handle]) -> None:
        """The batch is committed: :meth:`forget_settled`."""
        self.forget_settled(batch, handles)
