"""Spark's file sink log under the prefix: readers see exactly the committed batches.

With ``batch_log=True`` the driver publishes every batch once all its objects are committed
(``Committer.finish_batch``): ``{prefix}/_spark_metadata/{batch}`` in the format of Spark's own
file sink log (``FileStreamSinkLog``: a ``v1`` line, then one JSON ``SinkFileStatus`` per
object), and at every tenth batch ``{batch}.compact`` with every object so far, as Spark's
file sink does. Then ``spark.read.parquet("s3a://bucket/prefix")`` reads the objects the log
lists and nothing else: never part of a batch, never an object of an aborted one. Each log file
is also the manifest of its batch for readers that want a batch at once.

==============================  ===========================================================
a crash ...                     leaves, and what happens next
==============================  ===========================================================
before the batch's log file     the objects committed, no log file: Spark's reader does
                                not see the batch yet; recovery publishes it again
after it                        the file, the batch not marked done: recovery publishes
                                again, finds the file (``If-None-Match``) listing the same
                                objects, and goes on
==============================  ===========================================================

Batch ids are contiguous in Spark's log: a query whose first published batch is not 0 (the
log was enabled later) gets empty log files for the batches before it. A log file of this
batch that lists other objects means another query writes into the prefix (a new checkpoint,
same prefix): refused, with the fix. Spark's own ``_spark_metadata`` retention is not applied:
the log grows by one small file per batch.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sinks.s3.errors import ERRORS, classify
from sinks.s3.upload import head
from twophase import FatalError, Handle
from twophase.kit import classified
from twophase.kit.s3 import S3Settings, boto_errors

log = logging.getLogger(__name__)

LOG_DIRECTORY = "_spark_metadata"
LOG_VERSION = "v1"
#: Spark's ``spark.sql.streaming.fileSink.log.compactInterval`` default; its reader derives the
#: interval from the ``.compact`` files it finds.
COMPACT_INTERVAL = 10
COMPACT_SUFFIX = ".compact"
#: The block size S3A reports for objects (``fs.s3a.block.size``); Spark only plans splits by it.
BLOCK_SIZE = 32 * 1024 * 1024
#: The scheme Spark's Hadoop S3 connector reads the objects with.
DEFAULT_SCHEME = "s3a"


def is_compaction(batch: int) -> bool:
    return (batch + 1) % COMPACT_INTERVAL == 0


def batches_to_read(batch: int) -> range:
    """The log files a reader needs for everything up to ``batch``: the latest compaction and
    the batches after it (Spark's ``CompactibleFileStreamLog.getAllValidBatches``)."""
    start = max(0, (batch + 1) // COMPACT_INTERVAL * COMPACT_INTERVAL - 1)
    return range(start, batch + 1)


@dataclass(frozen=True)
class BatchLog:
    """The log of one prefix: ``root`` is what reader paths start with (``s3a://bucket``)."""

    client: Any
    settings: S3Settings
    prefix: str
    root: str

    @property
    def directory(self) -> str:
        return f"{self.prefix}/{LOG_DIRECTORY}" if self.prefix else LOG_DIRECTORY

    def key(self, batch: int) -> str:
        return f"{self.directory}/{batch}{COMPACT_SUFFIX if is_compaction(batch) else ''}"

    def publish(self, batch: int, handles: Sequence[Handle]) -> None:
        """Write ``batch``'s log file (and any missing one before it); idempotent."""
        latest = self._latest_before(batch)
        for missing in range(latest + 1, batch):
            log.warning("publishing an empty Spark log file for batch %d of %s (the log "
                        "starts at batch %d)", missing, self.settings.where, batch)
            self._write(missing, [])
        self._write(batch, [self._entry(handle) for handle in handles
                            if handle.data.get("upload_id")])

    def entries(self, batch: int) -> list[dict[str, Any]]:
        """The entries of ``batch``'s log file (every object so far for a compaction)."""
        body = self._get(self.key(batch))
        if body is None:
            raise FatalError(f"S3Sink: the Spark log file s3://{self.settings.bucket}/"
                             f"{self.key(batch)} is missing.",
                             fix="restore it, or delete the prefix's _spark_metadata to let "
                             "readers list the prefix again")
        lines = body.decode().splitlines()
        return [json.loads(line) for line in lines[1:] if line.strip()]

    def _write(self, batch: int, entries: list[dict[str, Any]]) -> None:
        own = entries
        if is_compaction(batch):
            entries = [entry for earlier in batches_to_read(batch - 1)
                       for entry in self.entries(earlier)] + entries
        body = "\n".join([LOG_VERSION, *(json.dumps(e, separators=(",", ":"))
                                         for e in entries)])
        if not self._put_new(self.key(batch), body.encode()):
            self._require_same(batch, own)

    def _require_same(self, batch: int, entries: list[dict[str, Any]]) -> None:
        """An existing log file must list this batch's objects (a recovery publishes again)."""
        ours = {entry["path"] for entry in entries}
        found = {entry["path"] for entry in self.entries(batch)}
        if ours <= found and (is_compaction(batch) or ours == found):
            return
        raise FatalError(
            f"S3Sink: s3://{self.settings.bucket}/{self.key(batch)} already lists other objects "
            f"for batch {batch}: another query (a new checkpoint?) writes into prefix "
            f"{self.prefix!r} with batch_log=True.",
            fix="give each query its own prefix (Spark's file sink allows one query per path), "
            "or delete the old query's objects and _spark_metadata")

    def _entry(self, handle: Handle) -> dict[str, Any]:
        return {"path": f"{self.root}/{handle.data['key']}", "size": int(handle.data["size"]),
                "isDir": False, "modificationTime": int(time.time() * 1000),
                "blockReplication": 1, "blockSize": BLOCK_SIZE, "action": "add"}

    def _latest_before(self, batch: int) -> int:
        """The latest batch with a log file, if the one just before ``batch`` has none."""
        if batch == 0 or self._exists(self.key(batch - 1)):
            return batch - 1
        found = [int(name.removesuffix(COMPACT_SUFFIX)) for name in self._names()
                 if name.removesuffix(COMPACT_SUFFIX).isdigit()]
        return max((b for b in found if b < batch), default=-1)

    def _names(self) -> list[str]:
        names: list[str] = []
        args = {"Bucket": self.settings.bucket, "Prefix": self.directory + "/"}
        with classified(classify, f"ListObjectsV2 of {self._where(self.directory)}", boto_errors()):
            while True:
                reply = self.client.list_objects_v2(**args)
                names.extend(item["Key"].rsplit("/", 1)[-1] for item in reply.get("Contents", ()))
                if not reply.get("IsTruncated"):
                    return names
                args["ContinuationToken"] = reply["NextContinuationToken"]

    def _exists(self, key: str) -> bool:
        return head(self.client, self.settings, key) is not None

    def _get(self, key: str) -> bytes | None:
        with classified(classify, f"GetObject of {self._where(key)}", boto_errors()):
            try:
                body: bytes = self.client.get_object(Bucket=self.settings.bucket,
                                                     Key=key)["Body"].read()
            except boto_errors() as exc:
                if ERRORS.code(exc) in ERRORS.NOT_FOUND:
                    return None
                raise
        return body

    def _put_new(self, key: str, body: bytes) -> bool:
        """PutObject unless the key exists; False if it does."""
        with classified(classify, f"PutObject of {self._where(key)}", boto_errors()):
            try:
                self.client.put_object(Bucket=self.settings.bucket, Key=key, Body=body,
                                       IfNoneMatch="*")
            except boto_errors() as exc:
                if ERRORS.code(exc) == ERRORS.PRECONDITION_FAILED:
                    return False
                raise
        return True

    def _where(self, key: str) -> str:
        return f"s3://{self.settings.bucket}/{key} ({self.settings.where})"
