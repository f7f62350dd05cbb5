"""The part buffer and the multipart calls: :class:`PartUploader`.

An encoder writes bytes into a :class:`PartUploader` as into a file. Whenever the buffer holds
``part_size`` bytes it becomes a part, uploaded by a background thread while the encoder goes
on; at most ``max_in_flight`` parts are uploading at once, and a writer that gets ahead waits
for the oldest. Memory per task is therefore about ``(max_in_flight + 1) * part_size`` plus
what the encoder holds (one record batch), whatever the partition's size.

The upload itself is created with the first part (the transaction id goes into its metadata):
a partition without rows creates none. :meth:`PartUploader.finish` uploads the last part (it
may be smaller than the others) on the calling thread while the earlier ones finish, and returns
the part numbers and ETags that ``CompleteMultipartUpload`` needs: a partition of one part
starts no thread at all.
"""

from __future__ import annotations

import collections
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sinks.s3.errors import ERRORS, classify
from twophase import FatalError
from twophase.kit import classified
from twophase.kit.s3 import S3Settings, boto_errors

log = logging.getLogger(__name__)

MAX_PARTS = 10_000
META_TXN = "twophase-txn"


@dataclass(frozen=True)
class Upload:
    """What pre-commit hands to the driver: the upload and its parts."""

    upload_id: str
    parts: list[tuple[int, str]]
    size: int


class PartUploader:
    """A write-only binary file whose bytes become the parts of one multipart upload."""

    def __init__(self, client: Any, bucket: str, key: str, txn: str, *, part_size: int,
                 max_in_flight: int, content_type: str, where: str) -> None:
        self.client, self.bucket, self.key, self.txn = client, bucket, key, txn
        self.part_size = part_size
        self.max_in_flight = max_in_flight
        self.content_type = content_type
        self.where = where
        self.upload_id: str | None = None
        self._buffer = bytearray()
        self._size = 0
        self._parts: list[tuple[int, str]] = []
        self._pending: collections.deque[Future[tuple[int, str]]] = collections.deque()
        self._pool: ThreadPoolExecutor | None = None
        self.closed = False

    # -- the file interface pyarrow and the encoders use --------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self._buffer += data
        self._size += len(data)
        if len(self._buffer) >= self.part_size:
            part, self._buffer = self._buffer, bytearray()  # handed over, not copied
            self._send(part)
        return len(data)

    def tell(self) -> int:
        return self._size

    def flush(self) -> None:
        """Nothing: parts are cut at ``part_size``, the last one by :meth:`finish`."""

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    def close(self) -> None:
        """pyarrow closes its sink after the footer; the upload goes on until finish()."""

    # -- multipart ----------------------------------------------------------------------------

    @property
    def size(self) -> int:
        return self._size

    def _what(self, step: str) -> str:
        return f"{step} of s3://{self.bucket}/{self.key} ({self.where})"

    def _create(self) -> str:
        with classified(classify, self._what("CreateMultipartUpload"), boto_errors()):
            reply = self.client.create_multipart_upload(
                Bucket=self.bucket, Key=self.key, Metadata={META_TXN: self.txn},
                ContentType=self.content_type)
        upload_id: str = reply["UploadId"]
        return upload_id

    def _send(self, body: bytearray, *, last: bool = False) -> None:
        """Upload ``body`` as the next part: in the background, or (``last``, or nothing may
        be in flight) on this thread, which has to wait for it anyway."""
        if self.upload_id is None:
            self.upload_id = self._create()
        number = len(self._parts) + len(self._pending) + 1
        if number > MAX_PARTS:
            raise FatalError(
                f"S3Sink: s3://{self.bucket}/{self.key} would need more than {MAX_PARTS} parts "
                f"of {self.part_size} bytes.", fix="raise part_size= (or repartition finer)")
        if last or self.max_in_flight <= 0:
            self._parts.append(self._upload_part(number, body))
            return
        while len(self._pending) >= self.max_in_flight:
            self._parts.append(self._pending.popleft().result())
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.max_in_flight,
                                            thread_name_prefix="s3-part")
        self._pending.append(self._pool.submit(self._upload_part, number, body))

    def _upload_part(self, number: int, body: bytearray) -> tuple[int, str]:
        with classified(classify, self._what(f"UploadPart {number}"), boto_errors()):
            reply = self.client.upload_part(Bucket=self.bucket, Key=self.key,
                                            UploadId=self.upload_id, PartNumber=number,
                                            Body=body)
        etag: str = reply["ETag"]
        return number, etag

    def finish(self) -> Upload | None:
        """Upload the last part, wait for every part; None if nothing was ever written."""
        if self._size == 0:
            return None
        try:
            if self._buffer:
                part, self._buffer = self._buffer, bytearray()
                self._send(part, last=True)
            while self._pending:
                self._parts.append(self._pending.popleft().result())
        finally:
            self._shutdown()
        assert self.upload_id is not None
        return Upload(self.upload_id, sorted(self._parts), self._size)

    def abort(self) -> bool:
        """Abort the upload (if one was created); True if there was one to abort."""
        self._buffer = bytearray()
        for future in self._pending:
            future.cancel()
        self._shutdown(wait=True)
        if self.upload_id is None:
            return False
        return abort_upload(self.client, self.bucket, self.key, self.upload_id, self.where)

    def _shutdown(self, *, wait: bool = True) -> None:
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=True)
            self._pool = None


def abort_upload(client: Any, bucket: str, key: str, upload_id: str, where: str) -> bool:
    """AbortMultipartUpload; False if S3 knows no such upload (aborted or completed)."""
    what = f"AbortMultipartUpload of s3://{bucket}/{key} ({where})"
    with classified(classify, what, boto_errors()):
        try:
            client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        except boto_errors() as exc:
            if ERRORS.code(exc) == ERRORS.NO_SUCH_UPLOAD:
                return False
            raise
    return True


def uploads_at(client: Any, bucket: str, prefix: str, where: str) -> list[tuple[str, str]]:
    """``(key, upload_id)`` of every open upload whose key starts with ``prefix``."""
    found: list[tuple[str, str]] = []
    args: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
    with classified(classify, f"ListMultipartUploads of s3://{bucket}/{prefix} ({where})",
                    boto_errors()):
        while True:
            reply = client.list_multipart_uploads(**args)
            found.extend((u["Key"], u["UploadId"]) for u in reply.get("Uploads", ()))
            if not reply.get("IsTruncated"):
                return found
            args["KeyMarker"] = reply["NextKeyMarker"]
            args["UploadIdMarker"] = reply["NextUploadIdMarker"]


def head(client: Any, settings: S3Settings, key: str) -> dict[str, Any] | None:
    """The object's HEAD reply, or None if there is no object at ``key``."""
    with classified(classify, f"HeadObject of s3://{settings.bucket}/{key} ({settings.where})",
                    boto_errors()):
        try:
            reply: dict[str, Any] = client.head_object(Bucket=settings.bucket, Key=key)
        except boto_errors() as exc:
            if ERRORS.code(exc) in ERRORS.NOT_FOUND:
                return None
            raise
    return reply


def txn_of(reply: dict[str, Any] | None) -> str | None:
    """The transaction id an object's metadata names (None: no object, or not ours)."""
    if reply is None:
        return None
    txn: str | None = reply.get("Metadata", {}).get(META_TXN)
    return txn
