"""The driver side: :class:`HttpCommitter` sends one batch's staged requests, proven; it also
asks the receiver before a decision (``check_committable``), lists what is staged and not
committed (``list_in_doubt``) and purges old commit records.

One pooled ``requests`` session per process (:func:`~sinks.http.connection.session`), shared
by the batch's commit threads. Commit of a handle:

1. No requests (an empty partition): ALREADY_COMMITTED; there is nothing to send.
2. A commit record (``<txn>.committed``, written only after the receiver answered every
   request): ALREADY_COMMITTED.
3. Nothing staged and no record: lost (aborted, or the staging directory was cleaned).
4. Staged longer ago than the receiver keeps keys (``key_expiry_s``, less a margin): lost,
   and nothing is sent: the receiver may have forgotten a key it executed, and would execute
   the request a second time.
5. Send every request with its key, signed afresh (:meth:`HttpCommitter.send`). A 2xx is the
   receiver's answer, a replayed one (``Idempotent-Replayed: true``) its proof that the
   request was executed before. 409, 429, 5xx and connection errors are retried here a few
   times with backoff and jitter (``Retry-After`` honoured), then raised as retryable to
   twophase; everything else is raised at once (:mod:`~sinks.http.errors`).
6. Record the commit, remove the staging. COMMITTED, or ALREADY_COMMITTED when every answer
   was a replay.

Abort removes what is staged (ABORTED), or finds nothing (NOT_FOUND); it never removes a
commit record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

import requests

from sinks.http.connection import session
from sinks.http.encoding import headers_for
from sinks.http.errors import ANY_5XX, classify, classify_response, retry_after_s
from sinks.http.protocol import (
    IDEMPOTENCY_KEY,
    POLICY_TIMEOUT_S,
    REPLAYED,
    REQUEST,
    TRANSACTION,
    WELL_KNOWN,
    fingerprint,
    key_header,
)
from sinks.http.staging import COMMITTED, STAGED, Manifest, StagedRequest
from twophase import (
    AbortOutcome,
    CommitOutcome,
    Committer,
    Handle,
    RetryableError,
    RetryPolicy,
    TransactionLostError,
    TwoPhaseError,
    TxnId,
)
from twophase.kit import as_utc, transaction_lost

if TYPE_CHECKING:
    from sinks.http.sink import HttpSink

log = logging.getLogger(__name__)

#: The longest pause a receiver's ``Retry-After`` may impose on one attempt.
MAX_RETRY_AFTER_S = 30.0
#: Expiry safety: a handle is lost this long before the receiver's window ends (at most).
EXPIRY_MARGIN_S = 60.0
EXPIRY_MARGIN_FRACTION = 0.1


class HttpCommitter(Committer):
    """The driver side of :class:`~sinks.http.HttpSink` in one process: asks the receiver,
    sends, aborts, lists in doubt, purges."""

    sink: HttpSink

    def __init__(self, sink: HttpSink) -> None:
        super().__init__(sink)
        self.session = session()
        self.retry = RetryPolicy(max_attempts=sink.max_attempts,
                                 initial_backoff_s=sink.initial_backoff_s,
                                 max_backoff_s=sink.max_backoff_s)

    def check_committable(self, handles: Sequence[Handle]) -> None:
        """The receiver answers (its well-known URL, any answer but a 5xx): pre-commit staged
        the requests without it, so in a sink group a batch decided while it is down would
        be visible in the other members and not here until it is back."""
        if not any(handle.data.get("requests") for handle in handles):
            return
        settings = self.sink.settings
        what = f"GET {settings.where_of(WELL_KNOWN)}"
        try:
            with self.session.get(self.sink.policy_url, timeout=POLICY_TIMEOUT_S,
                                  **settings.tls_options) as reply:
                if reply.status_code >= ANY_5XX:
                    raise classify_response(reply, what, fingerprint="-")
        except requests.RequestException as exc:
            raise classify(exc, what) from None

    def list_in_doubt(self, namespace: str) -> list[Handle]:
        """Every transaction of ``namespace`` with bodies in the staging that no
        commit record names (staged, or written by a task that never pre-committed)."""
        sink, staging = self.sink, self.sink.staging
        found: dict[TxnId, Handle] = {}
        entries = list(staging.entries(namespace))
        committed = {txn_id for txn_id, state in entries if state == COMMITTED}
        for txn_id, state in entries:
            if state == COMMITTED or txn_id in committed:
                continue
            manifest = staging.manifest(txn_id) if state == STAGED else None
            found[txn_id] = (sink.handle_of(manifest, staging.staged_location(txn_id))
                             if manifest else
                             sink.handle(txn_id, 0, staged=None, keys=[], requests=0))
        return sorted(found.values(), key=lambda handle: str(handle.txn_id))

    def purge_commit_records(self, namespace: str, older_than: datetime) -> int:
        """Drop the commit records of ``namespace`` written before ``older_than`` (each is
        written once every request of its transaction was answered: its commit time)."""
        return self.sink.staging.purge(namespace, as_utc(older_than).timestamp())

    def commit(self, handle: Handle) -> CommitOutcome:
        staging, txn_id = self.sink.staging, handle.txn_id
        if not handle.data.get("requests"):
            return CommitOutcome.ALREADY_COMMITTED
        if staging.is_committed(txn_id):
            staging.remove(txn_id)  # left by a crash between the record and the removal
            return CommitOutcome.ALREADY_COMMITTED
        manifest = staging.manifest(txn_id)
        if manifest is None:
            raise self._lost(handle, f"nothing is staged for it in {staging.location} (aborted, "
                             "or removed by hand) and no commit record names it")
        self._check_age(handle, manifest)
        try:
            replayed = [self.send(txn_id, manifest, request) for request in manifest.requests]
        except FileNotFoundError:  # a concurrent commit of the same handle finished first
            if staging.is_committed(txn_id):
                return CommitOutcome.ALREADY_COMMITTED
            raise
        staging.record_commit(txn_id, len(replayed), sum(replayed))
        staging.remove(txn_id)
        return CommitOutcome.ALREADY_COMMITTED if all(replayed) else CommitOutcome.COMMITTED

    def send(self, txn_id: TxnId, manifest: Manifest, request: StagedRequest) -> bool:
        """Deliver one staged request; True if the receiver replayed a stored answer."""
        settings = self.sink.settings
        body = self.sink.staging.body(txn_id, request.index)
        count = len(manifest.requests)
        what = (f"{settings.method} {settings.where} (transaction {txn_id}, request "
                f"{request.index + 1}/{count}, Idempotency-Key {request.key})")
        content = {**headers_for(manifest.encoding, manifest.compression),
                   IDEMPOTENCY_KEY: key_header(request.key), TRANSACTION: str(txn_id),
                   REQUEST: f"{request.index + 1}/{count}"}
        ours = fingerprint(settings.method, settings.path, request.digest)
        for attempt in range(1, self.retry.max_attempts + 1):
            outcome = self._attempt(body, content, what, ours)
            if isinstance(outcome, bool):
                return outcome
            error, hint = outcome
            if not isinstance(error, RetryableError) or attempt == self.retry.max_attempts:
                raise error
            pause = max(self.retry.backoff_s(attempt), min(hint or 0.0, MAX_RETRY_AFTER_S))
            log.info("%s (attempt %d/%d), retrying in %.2fs", error.cause, attempt,
                     self.retry.max_attempts, pause)
            time.sleep(pause)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _attempt(self, body: bytes, content: dict[str, str], what: str,
                 ours: str) -> bool | tuple[TwoPhaseError, float | None]:
        """One request, signed now: replayed or not (a 2xx), else the error and the receiver's
        ``Retry-After``. Redirects are not followed: they would turn a POST into a GET."""
        settings = self.sink.settings
        try:
            response = self.session.request(
                settings.method, settings.url, data=body, timeout=settings.timeout,
                **settings.tls_options, allow_redirects=False,
                headers=settings.request_headers(body, content))
        except requests.RequestException as exc:
            return classify(exc, what), None
        with response:
            if 200 <= response.status_code < 300:
                return response.headers.get(REPLAYED, "").lower() == "true"
            return (classify_response(response, what, fingerprint=ours),
                    retry_after_s(response))

    def abort(self, handle: Handle) -> AbortOutcome:
        staging = self.sink.staging
        if staging.remove(handle.txn_id):
            return AbortOutcome.ABORTED
        if staging.is_committed(handle.txn_id):
            log.warning("abort of %s: it is committed already, nothing to abort",
                        handle.txn_id)
        return AbortOutcome.NOT_FOUND

    def _check_age(self, handle: Handle, manifest: Manifest) -> None:
        expiry = self.sink.key_expiry_s
        age = time.time() - manifest.staged_at
        if age > expiry - min(EXPIRY_MARGIN_S, expiry * EXPIRY_MARGIN_FRACTION):
            raise self._lost(
                handle, f"it was staged {age:.0f}s ago, and the receiver keeps idempotency "
                f"keys for {expiry:.0f}s (key_expiry_s): a request of it sent before may be "
                "forgotten there, and sending it again could execute it twice")

    def _lost(self, handle: Handle, why: str) -> TransactionLostError:
        return transaction_lost(handle, where=self.sink.where, why=why)
