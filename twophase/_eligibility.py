"""May this transaction be aborted now? Every rule that answers it, side by side.

A transaction that a decision references is never aborted, by any of them. The rest differ in
what they know and whom they ask about:

===========================  ====================  ===============================================
rule                         asked by              answers
===========================  ====================  ===============================================
:func:`is_orphan`            the driver's sweep,   can the run holding ``epoch`` never decide it?
                             cleanup               (an earlier run's, or this run's for a batch
                                                   already done or given up); never another
                                                   query's or a newer run's
:func:`is_failed_attempt`    a retried task        is it an earlier attempt of this very task
                             (executor)            (same query, run, batch, partition)? Its
                                                   result never reached the driver
:func:`can_never_be_decided` a task after its      did the driver give up this batch, or a newer
                             pre-commit            run take over, while the task wrote?
:func:`undecided_handles`    ``status``            which of them belong to the query with no
                                                   decision naming them? Live transactions of a
                                                   running batch too: shown, never aborted by
                                                   this rule
===========================  ====================  ===============================================

Cleanup adds an age limit for transactions of queries it has no state of (see
:mod:`twophase.cleanup`); that is policy over what these rules cannot see, not a rule of its own.
"""

from __future__ import annotations

from collections.abc import Iterable

from twophase._handle import Handle, TxnId, query_key
from twophase._state import State


def is_orphan(txn: TxnId, *, query_id: str, epoch: int, up_to_batch: int) -> bool:
    """Can ``txn`` (referenced by no decision) never be decided by the run holding ``epoch``?

    True for transactions of the query from an earlier run (an earlier run never decides
    again: it is fenced) and from this run for batches up to ``up_to_batch`` (decided, being
    decided without it, or given up). Never for another query's or a newer run's transactions.
    """
    if txn.query != query_key(query_id) or txn.epoch > epoch:
        return False
    return txn.epoch < epoch or txn.batch <= up_to_batch


def is_failed_attempt(txn: TxnId, *, retry: TxnId) -> bool:
    """Is ``txn`` an earlier attempt of the task that ``retry`` is a new attempt of?

    Speculation, which would run attempts side by side, is refused at the start: an earlier
    attempt failed, and its handle never reached the driver, so no decision can name it.
    """
    return (txn != retry and (txn.namespace, txn.query, txn.epoch, txn.batch, txn.partition)
            == (retry.namespace, retry.query, retry.epoch, retry.batch, retry.partition))


def can_never_be_decided(state: State | None, *, epoch: int, batch: int) -> bool:
    """After a task's pre-commit: did the driver give up ``batch``, or a newer run take over?

    The driver records that it gave up *before* it sweeps the batch's transactions, and this
    check runs *after* pre-commit: a transaction pre-committed too late for the sweep to see
    it sees the record here, so none stays prepared after a batch failed.
    """
    if state is None or state.is_decided(batch):
        return False
    return state.epoch > epoch or (state.epoch == epoch and batch <= state.aborted_batch)


def undecided_handles(handles: Iterable[Handle], state: State) -> list[Handle]:
    """The ``handles`` that belong to the state's query with no decision naming them.

    What ``status`` shows as "undecided": an orphan of a crashed or failed run, or a live
    transaction of the batch being written. Not a licence to abort (see :func:`is_orphan`).
    """
    query_id = state.query_id
    if query_id is None:
        return []
    decided = state.decided_txns()
    return [handle for handle in handles
            if handle.txn_id.belongs_to(state.namespace, query_id)
            and handle.txn_id not in decided]
