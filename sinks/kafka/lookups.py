"""What the brokers know of transactional ids: executors, the driver and cleanup all ask.

An executor asks before it takes a pooled id (:meth:`~sinks.kafka.sink.KafkaSink.begin_transaction`:
which ids exist, what each one's coordinator describes, the producer id and epoch it was just
given); the driver and cleanup ask to find what is in doubt
(:meth:`~sinks.kafka.committer.KafkaCommitter.list_in_doubt`) and to prove a commit
(:mod:`~sinks.kafka.committer`). Both lookups go through the caller's admin client
(:meth:`~sinks.kafka.connection.KafkaSettings.admin`) and end nothing: deciding a transaction
is the committer's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from kafka import KafkaAdminClient
from kafka.admin import TransactionDescription, TransactionState
from kafka.errors import (
    CoordinatorNotAvailableError,
    NodeNotReadyError,
    NotCoordinatorError,
    TransactionalIdNotFoundError,
)

from sinks.kafka.adapter import forget_coordinator

log = logging.getLogger(__name__)

#: What a describe raises while an id's coordinator is being found (or has moved).
_COORDINATOR_LOOKUP_ERRORS = (NodeNotReadyError, CoordinatorNotAvailableError,
                              NotCoordinatorError)
#: Quick in-place attempts at describing an id while its coordinator is looked up.
LOOKUP_ATTEMPTS = 5
LOOKUP_BACKOFF_S = 0.05


def describe(admin: KafkaAdminClient, tids: Iterable[str]) -> dict[str, TransactionDescription]:
    """The coordinators' view of ``tids``; ids unknown to them are left out.

    One request per coordinator; if it fails (one unknown id fails it all, or a coordinator
    moved), each id is described on its own."""
    tids = list(tids)
    if len(tids) > 1:
        try:
            described: dict[str, TransactionDescription] = admin.describe_transactions(tids)
            return described
        except (TransactionalIdNotFoundError, *_COORDINATOR_LOOKUP_ERRORS):
            log.debug("describing %s one by one", tids, exc_info=True)
    found: dict[str, TransactionDescription] = {}
    for tid in tids:
        found.update(_describe_one(admin, tid))
    return found


def _describe_one(admin: KafkaAdminClient, tid: str) -> dict[str, TransactionDescription]:
    """Describe ``tid``, riding out a coordinator lookup that fails for a moment (a busy
    FindCoordinator answers without a node); what persists goes to twophase's retries."""
    for attempt in range(LOOKUP_ATTEMPTS):
        try:
            described: dict[str, TransactionDescription] = admin.describe_transactions([tid])
            return described
        except TransactionalIdNotFoundError:
            return {}
        except _COORDINATOR_LOOKUP_ERRORS:
            forget_coordinator(admin, tid)
            if attempt == LOOKUP_ATTEMPTS - 1:
                raise
            time.sleep(LOOKUP_BACKOFF_S * 2**attempt)
    return {}


def list_ids(admin: KafkaAdminClient, pattern: str,
             states: Iterable[TransactionState] = ()) -> list[str]:
    """Transactional ids matching ``pattern`` that the brokers know (in ``states``)."""
    listed = admin.list_transactions(state_filters=[state.value for state in states] or None,
                                     transactional_id_pattern=pattern)
    return sorted({listing.transactional_id for listings in listed.values()
                   for listing in listings})
