"""The driver's side of :class:`~sinks.nats.JetStreamSink`: one ordered chain per batch, proven.

**A batch, one chain** (:class:`~twophase.kit.WholeBatchCommitter`): the subject's chain
cannot grow from two places at once, so the driver settles a batch's handles in ONE call, on
one connection, in one order (by partition, then attempt); a handle committed on its own is a
settle of one, and settles of one committer never overlap (a lock: the driver's threads, the
contract's concurrent commits). Two processes settling at once (a driver and a cleanup) are
kept apart by the compare-and-set itself: the one whose publish is refused retries.

**Settle**, for the handles in that order:

1. A handle with no message (an empty partition): ALREADY_COMMITTED, nothing to publish.
2. A proof of commit (``twophase.done.<stream>.<txn>``): ALREADY_COMMITTED.
3. Read the subject's tip (:mod:`~sinks.nats.chain`). A transaction of the batch at the tip
   and incomplete (a crash in its chain) goes first, whatever its place.
4. Before the first publish, every handle still to publish must have exactly its count of
   staged messages (a resumed one too): else :class:`~twophase.TransactionLostError`
   (aborted, purged, or a lost pre-commit), and nothing of the batch is published. A lost
   pre-commit never commits as "nothing".
5. Each handle's chain: at the tip and complete: its proof is written, ALREADY_COMMITTED. At
   the tip and incomplete: resumed after the tip. Else, when the tip is an incomplete chain of
   another transaction, :class:`~twophase.RetryableError` naming it (its own commit must finish
   it: never two chains interleaved); when the tip is a complete chain of another transaction
   without a proof, its proof is written first (so a transaction the subject moved past always
   has one); then the chain starts after the tip. COMMITTED.
6. After each chain, its proof, then the purge of its staged messages.

Why a proof per transaction and not the tip alone (or a high-water mark of the driver's
order): handles of a batch may be committed one by one in any order (a committer's threads,
the contract suite), so "the tip is a later transaction" proves nothing about an earlier one.
The rule of step 5 keeps the invariant that makes the proof exact: at any time, a transaction
is committed if and only if it has a proof or is the tip's and complete; it is partly
committed only if it is the tip's. The proof's message time is the commit time:
``purge_commit_records`` drops proofs committed before its cutoff; a commit of a transaction
whose proof was purged and that the subject has moved past is lost (its staged messages are
gone), never published again.

**Abort** purges the transaction's staged messages (NOT_FOUND when there are none, or when it
is proven committed: then only a left-over staging is dropped). **In doubt**: the namespace's
staging subjects without a proof (a proven one's left-over staging, a crash between proof and
purge, is purged on sight).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from sinks.nats import staging
from sinks.nats.chain import Chain, PipelinedChain, SequentialChain, Tip
from sinks.nats.connection import Connection
from twophase import AbortOutcome, CommitOutcome, Handle, RetryableError, TxnId
from twophase.kit import WholeBatchCommitter, transaction_lost

if TYPE_CHECKING:
    from sinks.nats.sink import JetStreamSink

log = logging.getLogger(__name__)


def messages_of(handle: Handle) -> int:
    """How many messages the handle's transaction publishes (its rows; a pre-committed
    handle's, not a listed one's: those are only aborted)."""
    return int(handle.data["messages"])


def chunks_of(handle: Handle) -> int:
    """How many staged messages hold them (a chunk of rows each)."""
    return int(handle.data.get("chunks", 0))


def order_of(handle: Handle) -> tuple[int, int, int, str]:
    """A batch's chain order: by batch, partition, attempt (the id last, for a total order)."""
    txn = handle.txn_id
    return txn.batch, txn.partition, txn.attempt, str(txn)


class JetStreamCommitter(WholeBatchCommitter):
    """Commits, proves and aborts :class:`~sinks.nats.JetStreamSink` transactions (see the
    module docstring)."""

    sink: JetStreamSink

    def __init__(self, sink: JetStreamSink) -> None:
        super().__init__(sink)
        self._settling = threading.Lock()

    # -- a batch, one chain ----------------------------------------------------------------------

    def settle(self, handles: tuple[Handle, ...]) -> Mapping[TxnId, CommitOutcome]:
        """Prove or commit ``handles`` in one ordered chain (module docstring)."""
        with self._settling:
            return self.sink.settings.run(
                f"commit of {len(handles)} transaction(s) into {self.sink.where}",
                lambda connection: self._settle(connection, handles))

    async def _settle(self, connection: Connection, handles: tuple[Handle, ...]
                      ) -> dict[TxnId, CommitOutcome]:
        outcomes: dict[TxnId, CommitOutcome] = {}
        pending: list[Handle] = []
        for handle in sorted(handles, key=order_of):
            if messages_of(handle) == 0 or await self._proven(connection, handle.txn_id):
                outcomes[handle.txn_id] = CommitOutcome.ALREADY_COMMITTED
            else:
                pending.append(handle)
        if not pending:
            return outcomes
        target = self.sink.target
        tip = await target.tip(connection)
        pending.sort(key=lambda handle: not tip.is_of(handle.txn_id))  # a resumed one first
        await self._check_staged(connection, pending, tip)
        for handle in pending:
            tip, outcomes[handle.txn_id] = await self._chain(connection, handle, tip)
        return outcomes

    async def _proven(self, connection: Connection, txn_id: TxnId) -> bool:
        return await staging.proof_time(connection, self.sink.layout, txn_id) is not None

    async def _check_staged(self, connection: Connection, pending: Sequence[Handle],
                            tip: Tip) -> None:
        """Every handle still to publish has its count staged (step 4)."""
        for handle in pending:
            if tip.is_of(handle.txn_id) and tip.complete:
                continue
            staged = await staging.count(connection, self.sink.layout, handle.txn_id)
            if staged != chunks_of(handle):
                raise transaction_lost(
                    handle, where=self.sink.where,
                    why=f"{staged} of its {chunks_of(handle)} chunks of rows are staged in "
                        f"{self.sink.layout.staging_stream} (aborted, purged, or its "
                        "pre-commit was lost), it has no proof of commit, and "
                        f"{'no message of it' if not tip.is_of(handle.txn_id) else 'a part'} "
                        f"is in {self.sink.subject}")

    async def _chain(self, connection: Connection, handle: Handle, tip: Tip
                     ) -> tuple[Tip, CommitOutcome]:
        """One handle's chain after ``tip`` (step 5); the new tip and the outcome."""
        txn_id, count = handle.txn_id, messages_of(handle)
        if tip.is_of(txn_id) and tip.complete:
            await self._finish(connection, txn_id, count, tip.seq)
            return tip, CommitOutcome.ALREADY_COMMITTED
        if tip.is_of(txn_id):
            start = tip.index + 1
            log.info("resuming the chain of %s into %s at message %d of %d", txn_id,
                     self.sink.subject, start, count)
        else:
            await self._close_previous(connection, tip)
            start = 0
        chain = await self._chain_for(connection, txn_id, count)
        # closed here, on its connection, even when the chain fails or is cancelled (a
        # refused permission): never left to the loop's finalizer after the connection's close
        first_seq = int(handle.data.get("first_seq", 0))
        async with contextlib.aclosing(staging.read(
                connection, self.sink.layout, txn_id, first_seq=first_seq, start=start,
                chunks=chunks_of(handle))) as payloads:
            last = await chain.publish(payloads, start, tip.seq)
        await self._finish(connection, txn_id, count, last)
        return Tip(last, str(txn_id), count - 1, count), CommitOutcome.COMMITTED

    async def _close_previous(self, connection: Connection, tip: Tip) -> None:
        """Before a chain starts after ``tip``: refuse an incomplete one, prove a complete one."""
        if tip.txn is None:
            return
        if not tip.complete:
            raise RetryableError(
                f"{self.sink.where}: the subject's last message is message {tip.index} of "
                f"{tip.count} of transaction {tip.txn}, whose commit has not finished: no "
                "other chain starts before it ends.",
                fix=f"retried automatically; the query that decided {tip.txn} commits it "
                    "again when it recovers (or run `python -m twophase.cleanup` over its "
                    "state); if no query owns it any more, something else writes the subject")
        previous = TxnId.parse(tip.txn)
        if not await self._proven(connection, previous):
            await staging.write_proof(connection, self.sink.layout, previous, tip.count, tip.seq)

    async def _chain_for(self, connection: Connection, txn_id: TxnId, count: int) -> Chain:
        owned, stream_last = await self.sink.target.owned(connection)
        if owned:
            return PipelinedChain(connection, self.sink.target, txn_id, count,
                                  stream_last=stream_last)
        return SequentialChain(connection, self.sink.target, txn_id, count)

    async def _finish(self, connection: Connection, txn_id: TxnId, count: int,
                      last_seq: int) -> None:
        """The proof of a complete chain, then its staged messages dropped (step 6)."""
        await staging.write_proof(connection, self.sink.layout, txn_id, count, last_seq)
        await staging.purge(connection, self.sink.layout, txn_id)

    # -- abort, in doubt, purge ------------------------------------------------------------------

    def abort(self, handle: Handle) -> AbortOutcome:
        return self.sink.settings.run(f"abort of {handle.txn_id} in {self.sink.where}",
                                      lambda connection: self._abort(connection, handle.txn_id))

    async def _abort(self, connection: Connection, txn_id: TxnId) -> AbortOutcome:
        layout = self.sink.layout
        staged = await staging.count(connection, layout, txn_id)
        if staged:
            await staging.purge(connection, layout, txn_id)
        if not staged or await self._proven(connection, txn_id):
            return AbortOutcome.NOT_FOUND
        return AbortOutcome.ABORTED

    def list_in_doubt(self, namespace: str) -> list[Handle]:
        """The namespace's staged transactions without a proof (module docstring)."""
        return self.sink.settings.run(f"listing of transactions in doubt in {self.sink.where}",
                                      lambda connection: self._in_doubt(connection, namespace))

    async def _in_doubt(self, connection: Connection, namespace: str) -> list[Handle]:
        layout = self.sink.layout
        staged = await staging.subjects(connection, layout, layout.stage_filter)
        found: list[Handle] = []
        for subject, messages in sorted(staged.items()):
            txn_id = layout.txn_of(subject)
            if txn_id is None or txn_id.namespace != namespace or not messages:
                continue
            if await self._proven(connection, txn_id):  # a crash between proof and purge
                await staging.purge(connection, layout, txn_id)
                continue
            found.append(self.sink.handle(txn_id, 0, chunks=messages))
        return found

    def purge_commit_records(self, namespace: str, older_than: datetime) -> int:
        """Drop the proofs of the namespace's transactions committed before ``older_than``."""
        return self.sink.settings.run(
            f"purge of proofs of commit in {self.sink.layout.staging_stream} at "
            f"{self.sink.settings.where}",
            lambda connection: self._purge(connection, namespace, older_than))

    async def _purge(self, connection: Connection, namespace: str, older_than: datetime) -> int:
        layout = self.sink.layout
        proofs = await staging.subjects(connection, layout, layout.proof_filter)
        purged = 0
        for subject in proofs:
            txn_id = layout.txn_of(subject)
            if txn_id is None or txn_id.namespace != namespace:
                continue
            committed = await staging.proof_time(connection, layout, txn_id)
            if committed is not None and committed < older_than:
                await staging.purge_proof(connection, layout, txn_id)
                purged += 1
        return purged

