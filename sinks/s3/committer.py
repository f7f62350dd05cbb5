"""The driver side: :class:`S3Committer` completes and aborts one batch's uploads, and lists
the namespace's open uploads in doubt.

The process's boto3 client of the sink's settings (made on first use, thread-safe, shared by
the batch's commit threads, never pickled; made again with the new keys should the store
refuse rotated ones: :meth:`twophase.kit.S3Settings.retried_if_rotated`). It makes one attempt
per request: twophase retries what :mod:`~sinks.s3.errors` calls retryable, after this
committer has looked at what the store says.

Commit, proven:

1. HEAD the key. An object whose metadata names this transaction: ALREADY_COMMITTED (S3
   answers a second ``CompleteMultipartUpload`` of one upload with 200, so the HEAD comes
   first). Another transaction's object: lost.
2. ``CompleteMultipartUpload`` with ``IfNoneMatch='*'`` (never overwrite another object).
3. On ``NoSuchUpload``, ``PreconditionFailed`` (412) or a 5xx: HEAD again. Ours: ALREADY_COMMITTED
   (a reply lost, a concurrent commit). Otherwise on a 5xx, ``ListParts`` tells whether the
   upload still exists (retry: RetryableError) or is gone (lost: moto answers a complete after
   an abort with 500, real S3 with ``NoSuchUpload``). Otherwise: lost.

An empty partition's handle names no upload: there is nothing to make visible, its (zero) rows
are visible already, and every commit of it answers ALREADY_COMMITTED.

Publishing a batch (``batch_log=True``): Spark's file sink log file of the batch, once all its
objects are committed (:mod:`~sinks.s3.batchlog`).

Abort: ``AbortMultipartUpload`` of the handle's upload and of any other open upload of the same
key (a ``CreateMultipartUpload`` whose reply was lost and was retried); ``NoSuchUpload`` for all
of them is NOT_FOUND. Abort never deletes an object.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from sinks.s3.batchlog import BatchLog
from sinks.s3.errors import ERRORS, classify
from sinks.s3.upload import abort_upload, head, txn_of, uploads_at
from twophase import AbortOutcome, CommitOutcome, Committer, Handle, TransactionLostError
from twophase.kit import classified, transaction_lost
from twophase.kit.s3 import boto_errors

if TYPE_CHECKING:
    from sinks.s3.sink import S3Sink

log = logging.getLogger(__name__)

#: One attempt per request in the driver; twophase's retry policy does the rest.
COMMITTER_MAX_ATTEMPTS = 1

T = TypeVar("T")


class S3Committer(Committer):
    """The driver side of :class:`~sinks.s3.S3Sink` in one process: completes, aborts and
    lists in doubt its uploads."""

    sink: S3Sink

    @property
    def client(self) -> Any:
        """This process's client of the sink's settings (made again after a rotation)."""
        return self.sink.settings.client(max_attempts=COMMITTER_MAX_ATTEMPTS)

    def commit(self, handle: Handle) -> CommitOutcome:
        return self._rotating(lambda: self._commit(handle), f"commit of {handle.txn_id}")

    def abort(self, handle: Handle) -> AbortOutcome:
        return self._rotating(lambda: self._abort(handle), f"abort of {handle.txn_id}")

    def list_in_doubt(self, namespace: str) -> list[Handle]:
        """Every open upload under the prefix whose key names a transaction of ``namespace``
        (listed with the sink's attempts per request: a listing is read-only)."""
        sink = self.sink
        bucket, found = sink.settings.bucket, {}
        client = sink.settings.client(max_attempts=sink.max_attempts)
        for key, upload_id in uploads_at(client, bucket, sink.keys.listing_prefix(namespace),
                                         sink.where):
            txn_id = sink.keys.parse(key)
            if txn_id is not None and txn_id.namespace == namespace and txn_id not in found:
                found[txn_id] = sink.handle(txn_id, 0, bucket=bucket, key=key,
                                            upload_id=upload_id, parts=[], size=0)
        return sorted(found.values(), key=lambda handle: str(handle.txn_id))

    def _rotating(self, step: Callable[[], T], what: str) -> T:
        """``step``, once more with a new client if the store refused rotated keys."""
        return self.sink.settings.retried_if_rotated(step, what,
                                                     max_attempts=COMMITTER_MAX_ATTEMPTS)

    def _commit(self, handle: Handle) -> CommitOutcome:
        data, settings = handle.data, self.sink.settings
        key, upload_id, txn = data["key"], data.get("upload_id"), str(handle.txn_id)
        if upload_id is None:  # an empty partition: nothing was, or will be, written
            return CommitOutcome.ALREADY_COMMITTED
        found = head(self.client, settings, key)
        if found is not None:
            if txn_of(found) == txn:
                return CommitOutcome.ALREADY_COMMITTED
            raise self._lost(handle, f"s3://{settings.bucket}/{key} holds another "
                             f"transaction's object ({txn_of(found)})")
        what = f"CompleteMultipartUpload of s3://{settings.bucket}/{key} ({settings.where})"
        parts = [{"PartNumber": int(n), "ETag": etag} for n, etag in data["parts"]]
        with classified(classify, what, boto_errors()):
            try:
                self.client.complete_multipart_upload(
                    Bucket=settings.bucket, Key=key, UploadId=upload_id,
                    MultipartUpload={"Parts": parts}, IfNoneMatch="*")
            except boto_errors() as exc:
                code = ERRORS.code(exc)
                if (code not in (ERRORS.NO_SUCH_UPLOAD, ERRORS.PRECONDITION_FAILED)
                        and ERRORS.status(exc) < 500):
                    raise
                return self._settle(handle, exc)
        return CommitOutcome.COMMITTED

    def _settle(self, handle: Handle, exc: BaseException) -> CommitOutcome:
        """After a refused or failed complete: the store's state decides."""
        settings, key = self.sink.settings, handle.data["key"]
        found = head(self.client, settings, key)
        if txn_of(found) == str(handle.txn_id):
            return CommitOutcome.ALREADY_COMMITTED
        if found is not None:
            raise self._lost(handle, f"s3://{settings.bucket}/{key} holds another "
                             f"transaction's object ({txn_of(found)})") from exc
        if ERRORS.code(exc) == ERRORS.PRECONDITION_FAILED:  # an object came and went meanwhile
            raise classify(exc, f"CompleteMultipartUpload of s3://{settings.bucket}/{key}")
        if ERRORS.code(exc) != ERRORS.NO_SUCH_UPLOAD and self._upload_exists(handle):
            raise classify(exc, f"CompleteMultipartUpload of s3://{settings.bucket}/{key} "
                           f"({settings.where})") from exc
        raise self._lost(handle, f"its upload {handle.data['upload_id']} is gone (aborted, by "
                         "a lifecycle rule or by hand) and no object names it") from exc

    def _upload_exists(self, handle: Handle) -> bool:
        settings, key = self.sink.settings, handle.data["key"]
        with classified(classify, f"ListParts of s3://{settings.bucket}/{key}", boto_errors()):
            try:
                self.client.list_parts(Bucket=settings.bucket, Key=key,
                                       UploadId=handle.data["upload_id"], MaxParts=1)
            except boto_errors() as exc:
                if ERRORS.code(exc) == ERRORS.NO_SUCH_UPLOAD:
                    return False
                raise
        return True

    def _abort(self, handle: Handle) -> AbortOutcome:
        settings, key = self.sink.settings, handle.data["key"]
        ids = {upload_id for at, upload_id in uploads_at(self.client, settings.bucket, key,
                                                         settings.where) if at == key}
        if handle.data.get("upload_id"):
            ids.add(handle.data["upload_id"])
        aborted = False
        for upload_id in sorted(ids):
            aborted |= abort_upload(self.client, settings.bucket, key, upload_id,
                                    settings.where)
        if not aborted and txn_of(head(self.client, settings, key)) == str(handle.txn_id):
            log.warning("abort of %s: it is committed already, nothing to abort",
                        handle.txn_id)
        return AbortOutcome.ABORTED if aborted else AbortOutcome.NOT_FOUND

    def finish_batch(self, namespace: str, batch: int, handles: Sequence[Handle]) -> None:
        sink = self.sink
        if sink.batch_log_root is not None:
            BatchLog(self.client, sink.settings, sink.prefix, sink.batch_log_root).publish(
                batch, handles)

    def _lost(self, handle: Handle, why: str) -> TransactionLostError:
        return transaction_lost(handle, where=self.sink.settings.where, why=why)
