"""Aborting undecided transactions through a sink's committer, in any process.

The driver's sweep, a failed batch, cleanup, a retried task and a task whose batch was given
up all abort the same way: through the sink's :class:`~twophase.Committer` (never a
coordinator and its state), retried on :class:`~twophase.RetryableError`. Which transactions
each of them may abort is decided in :mod:`twophase._eligibility`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from twophase._handle import Handle
from twophase._retry import RetryPolicy
from twophase.errors import RetryableError, TwoPhaseError
from twophase.sink import AbortOutcome, Committer

log = logging.getLogger(__name__)


def abort_through(committer: Committer, handle: Handle, retry: RetryPolicy,
                  on_retry: Callable[[RetryableError], None] | None = None) -> AbortOutcome:
    """Abort ``handle`` through ``committer``, retried; a handle of another sink is refused."""
    committer.sink.require_own(handle)
    return retry.call(lambda: committer.abort(handle), what=f"abort of transaction {handle.txn_id}",
                      on_retry=on_retry)


def abort_quietly(committer: Committer, handle: Handle, retry: RetryPolicy,
                  on_retry: Callable[[RetryableError], None] | None = None
                  ) -> AbortOutcome | None:
    """Abort an undecided transaction; a failure is logged, not raised (None).

    Nothing depends on an abort succeeding now: the transaction stays in doubt, invisible,
    and the next batch's sweep or the cleanup task aborts it. Failing the batch instead
    would stop a query whose data is fine.
    """
    try:
        return abort_through(committer, handle, retry, on_retry)
    except TwoPhaseError as exc:
        log.warning("transaction %s stays in doubt (a later sweep or cleanup aborts it): %s",
                    handle.txn_id, exc)
        return None
