"""Deciding pre-committed transactions: EndTxn commit and abort, from any process; and the
rest of the driver side: the commit deadline, the open transactions in doubt.

The driver commits through it; the driver, an executor (a failed attempt's or a late
handle's transaction) or cleanup aborts through it. Reading what the brokers know of an id
(list, describe) is :mod:`~sinks.kafka.lookups`, which an executor also uses before it takes one.

A pre-committed transaction is an open Kafka transaction whose producer is gone; its handle
carries the transactional id, producer id and epoch. Whoever holds the handle decides it with
EndTxn, sent to the id's transaction coordinator through this process's one admin client
(:meth:`~sinks.kafka.connection.KafkaSettings.admin`). The broker's answers (measured on
Apache Kafka 4.1, transaction version 1 as kafka-python speaks it): a commit of a committed
transaction is NONE again, an abort of it INVALID_TXN_STATE, a wrong epoch PRODUCER_FENCED.
As NONE cannot tell "committed now" from "committed before", the coordinator's description of
the id (state, producer id, epoch) is read first: ``PrepareCommit`` or ``CompleteCommit`` at
the handle's producer id and epoch proves ALREADY_COMMITTED (each pooled id carries one
transaction per epoch; PrepareCommit is the coordinator's logged decision, whose markers it
finishes writing after any crash).
Anything else that is not the handle's open transaction (aborted, a newer epoch: the id was
taken over or the broker timed the transaction out, the id expired) is a lost transaction,
reported with its deadline, never success.

EndTxn answers once the coordinator has logged the decision; it writes the markers into the
topic's partitions afterwards, and only then do ``read_committed`` readers see a commit (and
the partitions' last stable offsets stop waiting on an abort). A commit or abort therefore
returns only once the coordinator reports the transaction complete (:func:`await_markers`),
so a batch is visible when the driver marks it done, before the next batch commits.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kafka import KafkaAdminClient
from kafka.admin import TransactionDescription, TransactionState

from sinks.kafka import registry
from sinks.kafka.adapter import ProducerIdentity, end_transaction, forget_coordinator
from sinks.kafka.errors import (
    CONCURRENT_TRANSACTIONS,
    GONE,
    KAFKA_ERRORS,
    NONE,
    classify,
    classify_code,
    code_name,
)
from sinks.kafka.lookups import describe, list_ids
from sinks.kafka.pool import COMMIT_LOGGED, ENDING, namespace_pattern, owner
from twophase import AbortOutcome, CommitOutcome, Committer, Handle, RetryableError
from twophase.errors import TransactionLostError
from twophase.kit import classified, transaction_lost

if TYPE_CHECKING:
    from sinks.kafka.sink import KafkaSink

log = logging.getLogger(__name__)

_RETRY_CODES = frozenset({CONCURRENT_TRANSACTIONS, "COORDINATOR_LOAD_IN_PROGRESS",
                          "COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR"})
#: Commits and aborts at once through this process's admin client: one request each at a time,
#: below kafka-python's ``max_in_flight_requests_per_connection`` (5), which refuses more.
ADMIN_MAX_IN_FLIGHT = 4
_ADMIN_SLOTS = threading.BoundedSemaphore(ADMIN_MAX_IN_FLIGHT)
#: How long a commit or abort waits for the coordinator to finish writing its markers (then it
#: is retried: the decision is logged, so the retry finds it and waits again).
MARKERS_TIMEOUT_S = 30.0
MARKERS_FIRST_BACKOFF_S = 0.001
MARKERS_MAX_BACKOFF_S = 0.2


def identity_of(handle: Handle) -> ProducerIdentity:
    data: Mapping[str, Any] = handle.data
    return ProducerIdentity(str(data["transactional_id"]), int(data["producer_id"]),
                            int(data["epoch"]))


def deadline_of(handle: Handle) -> str:
    deadline = datetime.fromtimestamp(int(handle.data["deadline_ms"]) / 1000, UTC)
    return deadline.isoformat(timespec="seconds")


def _is_handles(description: TransactionDescription | None, identity: ProducerIdentity) -> bool:
    return description is not None and (description.producer_id, description.producer_epoch) \
        == (identity.producer_id, identity.epoch)


def _state(description: TransactionDescription | None) -> str:
    if description is None:
        return "does not know the transactional id (never used, or expired)"
    return (f"reports state {description.state.value} for producer id "
            f"{description.producer_id} epoch {description.producer_epoch}")


def commit(admin: KafkaAdminClient, handle: Handle, *, where: str) -> CommitOutcome:
    """EndTxn(commit) for ``handle``; ALREADY_COMMITTED only where the coordinator proves it."""
    identity = identity_of(handle)
    what = f"commit of transaction {handle.txn_id} ({identity.transactional_id})"
    with classified(classify, what, KAFKA_ERRORS):
        description = describe(admin, [identity.transactional_id]).get(
            identity.transactional_id)
        if _is_handles(description, identity):
            assert description is not None
            if description.state in COMMIT_LOGGED:
                if description.state in ENDING:
                    await_markers(admin, identity, what)
                return CommitOutcome.ALREADY_COMMITTED
            if description.state == TransactionState.ONGOING:
                code = end_transaction(admin, identity, commit=True)
                if code == NONE:
                    await_markers(admin, identity, what)
                    return CommitOutcome.COMMITTED
                raise _refused(admin, handle, code, what, where=where)
        raise _lost(handle, where=where, why=f"its coordinator {_state(description)}")


def abort(admin: KafkaAdminClient, handle: Handle) -> AbortOutcome:
    """EndTxn(abort) for ``handle`` while it is the id's open transaction; else NOT_FOUND."""
    if "transactional_id" not in handle.data:
        return AbortOutcome.NOT_FOUND
    identity = identity_of(handle)
    what = f"abort of transaction {handle.txn_id} ({identity.transactional_id})"
    with classified(classify, what, KAFKA_ERRORS):
        description = describe(admin, [identity.transactional_id]).get(
            identity.transactional_id)
        if not _is_handles(description, identity):
            return AbortOutcome.NOT_FOUND
        assert description is not None
        if description.state != TransactionState.ONGOING:  # ending or ended already
            if description.state in ENDING:
                await_markers(admin, identity, what)
            return AbortOutcome.NOT_FOUND
        code = end_transaction(admin, identity, commit=False)
        if code == NONE:
            await_markers(admin, identity, what)
            return AbortOutcome.ABORTED
        if code_name(code) in GONE:
            return AbortOutcome.NOT_FOUND
        raise _refused(admin, handle, code, what, where="")


def await_markers(admin: KafkaAdminClient, identity: ProducerIdentity, what: str) -> None:
    """Return once the coordinator has written the markers of the transaction it ended (it no
    longer reports the producer's transaction in a Prepare* state); retryable after
    :data:`MARKERS_TIMEOUT_S`."""
    deadline = time.monotonic() + MARKERS_TIMEOUT_S
    backoff = MARKERS_FIRST_BACKOFF_S
    while _is_ending(describe(admin, [identity.transactional_id]).get(
            identity.transactional_id), identity):
        if time.monotonic() >= deadline:
            raise RetryableError(
                f"KafkaSink: {what}: the coordinator has logged the outcome but not finished "
                f"writing its markers within {MARKERS_TIMEOUT_S:.0f}s.",
                fix="retried automatically; if it persists, check the brokers that lead the "
                    "topic's partitions")
        time.sleep(backoff)
        backoff = min(backoff * 2, MARKERS_MAX_BACKOFF_S)


def _is_ending(description: TransactionDescription | None, identity: ProducerIdentity) -> bool:
    return description is not None and description.producer_id == identity.producer_id \
        and description.state in ENDING


def _refused(admin: KafkaAdminClient, handle: Handle, code: int, what: str, *,
             where: str) -> Exception:
    name = code_name(code)
    if name in _RETRY_CODES:
        forget_coordinator(admin, str(handle.data["transactional_id"]))
        return RetryableError(f"KafkaSink: {what} answered {name}.",
                              fix="retried automatically (the coordinator is busy or moved)")
    if name in GONE and where:
        return _lost(handle, where=where, why=f"the coordinator answered {name}")
    return classify_code(code, what)


def _lost(handle: Handle, *, where: str, why: str) -> TransactionLostError:
    return transaction_lost(
        handle, where=where,
        why=f"{why}; the transaction had to be committed before its deadline "
            f"{deadline_of(handle)} (transaction_timeout_ms={handle.data.get('timeout_ms')}), "
            "after which the broker aborts it")


class KafkaCommitter(Committer):
    """The driver side of :class:`~sinks.kafka.KafkaSink`: commits, aborts and lists in doubt
    through this process's admin client (one coordinator connection), made again should the
    brokers refuse a rotated password
    (:meth:`~sinks.kafka.connection.KafkaSettings.with_admin`)."""

    sink: KafkaSink

    def commit_deadline(self, handle: Handle) -> float | None:
        """The broker aborts the transaction ``transaction_timeout_ms`` after it began."""
        deadline_ms = handle.data.get("deadline_ms")
        return None if deadline_ms is None else int(deadline_ms) / 1000

    def list_in_doubt(self, namespace: str) -> list[Handle]:
        """Open transactions of ``namespace``'s pooled ids, named by the registry."""
        what = f"listing open transactions of {namespace}"
        descriptions, entries = self.sink.settings.with_admin(
            lambda admin: self._open_transactions(admin, namespace, what), what)
        handles = []
        for tid, description in sorted(descriptions.items()):
            entry = entries.get(tid)
            holder = owner(description, entry)
            if holder is None or entry is None or holder.namespace != namespace:
                log.warning("open transaction %s (producer id %d, epoch %d) has no registered "
                            "owner; the broker aborts it at its timeout", tid,
                            description.producer_id, description.producer_epoch)
                continue
            handles.append(self.sink.handle(
                holder, 0, transactional_id=tid, producer_id=entry.producer_id,
                epoch=entry.epoch, deadline_ms=entry.deadline_ms,
                timeout_ms=description.transaction_timeout_ms))
        return sorted(handles, key=lambda handle: handle.txn_id)

    def _open_transactions(self, admin: KafkaAdminClient, namespace: str, what: str
                           ) -> tuple[dict[str, TransactionDescription], dict[str, registry.Entry]]:
        """The coordinators' descriptions of ``namespace``'s open transactions, and the
        registry's entries (not read while none is open)."""
        sink = self.sink
        with classified(classify, what, KAFKA_ERRORS):
            tids = list_ids(admin, namespace_pattern(sink.transactional_id_prefix, namespace),
                            [TransactionState.ONGOING])
            if not tids:
                return {}, {}
            return describe(admin, tids), registry.read(sink.settings, sink.registry_topic)

    def commit(self, handle: Handle) -> CommitOutcome:
        with _ADMIN_SLOTS:
            return self.sink.settings.with_admin(
                lambda admin: commit(admin, handle, where=self.sink.where),
                f"commit of transaction {handle.txn_id}")

    def abort(self, handle: Handle) -> AbortOutcome:
        with _ADMIN_SLOTS:
            return self.sink.settings.with_admin(lambda admin: abort(admin, handle),
                                                 f"abort of transaction {handle.txn_id}")
