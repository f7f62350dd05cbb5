"""Transactional ids from a bounded pool, and which one a task may take.

A transaction of batch ``b``, partition ``p``, task attempt ``a`` uses one of::

    <prefix><namespace>.<p>.<b mod 2>.<slot>        slot in 0 .. attempt_slots - 1

so a query never makes the broker keep more than ``2 * attempt_slots`` ids per Spark partition
(:func:`pool_bound`), however long it runs (Flink's POOLING strategy, FLINK-34554), instead of
one id per checkpoint kept for ``transactional.id.expiration.ms`` (7 days).

Why this cannot lose a decided transaction: initialising a transactional id aborts its open
transaction. The ids of batch ``b`` are never touched by batch ``b + 1`` (the other parity),
and batch ``b + 2`` starts only after batch ``b`` is committed (the driver commits a batch, or
recovery commits every decided one, before the next batch's tasks run). Within a batch, an
attempt starts at slot ``attempt mod attempt_slots`` and skips every slot whose open
transaction belongs to the same batch (the registry names the owner of each producer id and
epoch; :mod:`~sinks.kafka.registry`) or has no registered owner yet, so a retried or
speculative attempt never re-initialises an id whose transaction the driver may decide. An
open transaction of an older batch or epoch there is an orphan (no decision can name it any
more): taking the id over aborts it, which is what it needs anyway. When every slot is held,
``begin_transaction`` raises :class:`RetryableError` (retried with backoff).

A task that finds, on any of its ids, a transaction registered by a newer run (a higher
epoch) of its own query belongs to a zombie run and is fenced (:class:`FencedError`): re-using
the id would erase the coordinator's record of the newer run's transaction, which may be
committed but not yet proven by the driver (the driver's proof of a commit is that record).

The look and the init are not one atomic step: two attempts of one partition whose attempt
numbers are equal modulo ``attempt_slots`` and that start within the few milliseconds between
one's look and its init could still meet on one id. The later init then fences the earlier
attempt; the driver sees that as a lost transaction (loudly, the batch kept pending), never
as a silent success. Spark runs a second attempt only after a failure or, with speculation,
after a delay, so this needs a retry racing its own predecessor.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from kafka.admin import TransactionDescription, TransactionState

from sinks.kafka.registry import Entry
from twophase import FencedError, RetryableError, TxnId
from twophase.kit import transaction_id_reused

#: Default slots per partition and batch parity: attempts of one task that may overlap.
DEFAULT_ATTEMPT_SLOTS = 4
PARITIES = 2
#: The coordinator has logged how the transaction ends and is writing its markers.
ENDING = frozenset({TransactionState.PREPARE_COMMIT, TransactionState.PREPARE_ABORT,
                    TransactionState.PREPARE_EPOCH_FENCE})
#: States in which a transaction still holds its id (and pins the topic's last stable offset).
OPEN_STATES = ENDING | {TransactionState.ONGOING}
#: The coordinator has logged the commit of the transaction (PrepareCommit: it is writing the
#: markers; the log makes it finish them after any crash): it is committed.
COMMIT_LOGGED = frozenset({TransactionState.PREPARE_COMMIT, TransactionState.COMPLETE_COMMIT})


def pool_bound(partitions: int, attempt_slots: int = DEFAULT_ATTEMPT_SLOTS) -> int:
    """The most transactional ids a query with ``partitions`` Spark partitions ever uses."""
    return partitions * PARITIES * attempt_slots


def candidates(prefix: str, txn: TxnId, attempt_slots: int) -> list[str]:
    """The ids ``txn`` may use, in the order it tries them."""
    base = f"{prefix}{txn.namespace}.{txn.partition}.{txn.batch % PARITIES}"
    first = txn.attempt % attempt_slots
    return [f"{base}.{(first + step) % attempt_slots}" for step in range(attempt_slots)]


def partition_pattern(prefix: str, txn: TxnId) -> str:
    """A ListTransactions pattern matching every candidate of ``txn``."""
    base = f"{prefix}{txn.namespace}.{txn.partition}.{txn.batch % PARITIES}."
    return f"^{re.escape(base)}[0-9]+$"


def namespace_pattern(prefix: str, namespace: str) -> str:
    """A ListTransactions pattern matching every id of ``namespace`` (and no other)."""
    return f"^{re.escape(f'{prefix}{namespace}.')}[0-9]+\\.[0-9]+\\.[0-9]+$"


def owner(description: TransactionDescription | None, entry: Entry | None) -> TxnId | None:
    """The transaction id registered for the transaction the coordinator describes."""
    if description is None or entry is None:
        return None
    if (entry.producer_id, entry.epoch) != (description.producer_id,
                                            description.producer_epoch):
        return None
    return entry.txn


def choose(txn: TxnId, ids: Sequence[str],
           descriptions: Mapping[str, TransactionDescription],
           registry: Mapping[str, Entry]) -> str:
    """The first of ``ids`` that ``txn`` may initialise (see the module docstring).

    Raises the reuse error if ``txn`` was committed before under one of them (a state file
    restored from a backup), :class:`FencedError` if a newer run of the query registered one
    of them, :class:`RetryableError` if every one is held.
    """
    for tid in ids:
        description = descriptions.get(tid)
        holder = owner(description, registry.get(tid))
        if holder is None or description is None:
            continue
        if holder == txn and description.state in COMMIT_LOGGED:
            raise transaction_id_reused(txn, where=f"Kafka (transactional id {tid})")
        if holder.query == txn.query and holder.epoch > txn.epoch:
            raise FencedError(
                f"KafkaSink: transaction {txn} belongs to run epoch {txn.epoch}, but a newer run "
                f"(epoch {holder.epoch}) of the query has written through transactional id "
                f"{tid}: this task is a zombie's.",
                fix="keep one run per query (the newer one delivers the batches); if no other "
                    "run is alive, the state file was replaced by an older copy: put the newest "
                    "one back")
    for tid in ids:
        if not _held(txn, descriptions.get(tid), registry.get(tid)):
            return tid
    raise RetryableError(
        f"KafkaSink: all {len(ids)} transactional ids of partition {txn.partition} for batch "
        f"{txn.batch} hold open transactions of other attempts of this batch.",
        fix="retried automatically; if it persists, raise attempt_slots= (speculative "
            "execution and task retries each need one)")


def _held(txn: TxnId, description: TransactionDescription | None,
          entry: Entry | None) -> bool:
    if description is None or description.state not in OPEN_STATES:
        return False
    holder = owner(description, entry)
    if holder is None:
        return True  # opened, not registered yet: possibly a live attempt
    if holder == txn:
        return False  # this very transaction, begun before: never pre-committed
    orphan = holder.query == txn.query and (holder.epoch, holder.batch) < (txn.epoch, txn.batch)
    return not orphan
