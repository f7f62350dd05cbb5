"""The staging on S3: :class:`S3Staging`, for executors and a driver that share no disk.

Layout under ``s3://bucket/prefix`` (see :mod:`~sinks.http.staging` for the states)::

    <txn id>.staged/000000.body ...    the bodies, each one PutObject (written first)
    <txn id>.staged/manifest.json      the seal of a pre-commit, written LAST
    <txn id>.committed                 the proof of commit

S3 has no rename, so a transaction whose bodies are there without a manifest is still
"writing" (or its writer was killed): listed in doubt, and removed by abort. Removal deletes
the manifest first (the transaction is unsealed at once), then the bodies in batches of
DeleteObjects, so a removal cut short leaves a "writing" transaction, never a staged one with
bodies missing. Listings are ListObjectsV2 under ``prefix/<namespace>.``, paginated.

S3 is reached through twophase's one S3 client: one boto3 client per process, endpoint and
credentials (:class:`twophase.kit.s3.S3Settings`, credentials out of ``repr``; boto3 retries
throttling and 5xx itself), and what is left is classified by :class:`twophase.kit.s3.S3Errors`,
the one table of S3 errors.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sinks.http.staging import (
    COMMITTED,
    MANIFEST,
    STAGED,
    WRITING,
    Manifest,
    body_name,
    commit_record,
)
from twophase import TxnId
from twophase.kit import classified
from twophase.kit.s3 import S3Errors, S3Settings, boto_errors, split_s3_location

log = logging.getLogger(__name__)

#: The most keys one DeleteObjects request may name.
DELETE_BATCH = 1000
#: What the staging's credentials need on the bucket and prefix.
PERMISSIONS = ("s3:PutObject", "s3:GetObject", "s3:ListBucket", "s3:DeleteObject")
ERRORS = S3Errors(PERMISSIONS)
BODY_TYPE, RECORD_TYPE = "application/octet-stream", "application/json"


@dataclass(frozen=True)
class S3Staging:
    """Staged transactions under one S3 prefix (see the module docstring)."""

    settings: S3Settings
    prefix: str  # "" or ending in "/"

    @classmethod
    def at(cls, location: str, options: Mapping[str, Any]) -> S3Staging:
        bucket, prefix = split_s3_location(location, named="HttpSink: staging",
                                           fix="pass staging='s3://bucket/prefix'")
        prefix = prefix.strip("/")
        settings = S3Settings.of(bucket, options, named="HttpSink: staging_options")
        return cls(settings, f"{prefix}/" if prefix else "")

    @property
    def bucket(self) -> str:
        return self.settings.bucket

    @property
    def location(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def _key(self, txn_id: TxnId | str, state: str, name: str = "") -> str:
        return f"{self.prefix}{txn_id}{state}{'/' + name if name else ''}"

    def staged_location(self, txn_id: TxnId) -> str:
        return f"s3://{self.bucket}/{self._key(txn_id, STAGED)}/"

    def ensure_root(self) -> None:
        """The bucket exists and the credentials may list the prefix."""
        self._call("ListObjectsV2 of", "list_objects_v2", Prefix=self.prefix, MaxKeys=1)

    # -- executor ------------------------------------------------------------------------------

    def open(self, txn_id: TxnId) -> None:
        self.remove(txn_id)

    def write_body(self, txn_id: TxnId, index: int, body: bytes) -> None:
        self._put(self._key(txn_id, STAGED, body_name(index)), body, BODY_TYPE)

    def seal(self, manifest: Manifest) -> str:
        self._put(self._key(manifest.txn, STAGED, MANIFEST), manifest.dumps(), RECORD_TYPE)
        return self.staged_location(TxnId.parse(manifest.txn))

    # -- driver --------------------------------------------------------------------------------

    def manifest(self, txn_id: TxnId) -> Manifest | None:
        data = self._get(self._key(txn_id, STAGED, MANIFEST))
        return None if data is None else Manifest.loads(data)

    def body(self, txn_id: TxnId, index: int) -> bytes:
        key = self._key(txn_id, STAGED, body_name(index))
        data = self._get(key)
        if data is None:
            raise FileNotFoundError(f"s3://{self.bucket}/{key}")
        return data

    def is_committed(self, txn_id: TxnId) -> bool:
        key = self._key(txn_id, COMMITTED)
        with classified(ERRORS.classify, f"HeadObject of s3://{self.bucket}/{key}",
                        boto_errors()):
            try:
                self.settings.client().head_object(Bucket=self.bucket, Key=key)
            except boto_errors() as exc:
                if ERRORS.code(exc) in ERRORS.NOT_FOUND:
                    return False
                raise
        return True

    def record_commit(self, txn_id: TxnId, requests: int, replayed: int) -> None:
        self._put(self._key(txn_id, COMMITTED), commit_record(txn_id, requests, replayed),
                  RECORD_TYPE)

    def remove(self, txn_id: TxnId) -> bool:
        keys = [key for key, _ in self._list(f"{self._key(txn_id, STAGED)}/")]
        manifest = self._key(txn_id, STAGED, MANIFEST)
        if manifest in keys:  # unseal first: a removal cut short leaves a "writing" one
            self._delete([manifest])
        self._delete([key for key in keys if key != manifest])
        return bool(keys)

    def entries(self, namespace: str) -> Iterator[tuple[TxnId, str]]:
        for txn_id, state, _ in self._entries(namespace):
            yield txn_id, state

    def purge(self, namespace: str, older_than: float) -> int:
        old = [self._key(txn_id, COMMITTED) for txn_id, state, modified
               in self._entries(namespace)
               if state == COMMITTED and modified.timestamp() < older_than]
        self._delete(old)
        return len(old)

    def _entries(self, namespace: str) -> Iterator[tuple[TxnId, str, datetime]]:
        """``(txn id, state, last modified)``: bodies without a manifest are WRITING."""
        sealed: dict[TxnId, tuple[bool, datetime]] = {}
        for key, modified in self._list(f"{self.prefix}{namespace}."):
            head, _, name = key[len(self.prefix):].partition("/")
            text, dot, state = head.rpartition(".")
            try:
                txn_id = TxnId.parse(text)
            except ValueError:
                continue
            if not dot or txn_id.namespace != namespace:
                continue
            if f".{state}" == COMMITTED and not name:
                yield txn_id, COMMITTED, modified
            elif f".{state}" == STAGED and name:
                before = sealed.get(txn_id, (False, modified))
                sealed[txn_id] = (before[0] or name == MANIFEST, max(before[1], modified))
        for txn_id, (is_sealed, modified) in sealed.items():
            yield txn_id, STAGED if is_sealed else WRITING, modified

    # -- S3 calls ------------------------------------------------------------------------------

    def _call(self, what: str, operation: str, **params: Any) -> Any:
        with classified(ERRORS.classify, f"{what} {self.location}", boto_errors()):
            return getattr(self.settings.client(), operation)(Bucket=self.bucket, **params)

    def _put(self, key: str, data: bytes, content_type: str) -> None:
        self._call(f"PutObject of {key} in", "put_object", Key=key, Body=data,
                   ContentType=content_type)

    def _get(self, key: str) -> bytes | None:
        with classified(ERRORS.classify, f"GetObject of s3://{self.bucket}/{key}",
                        boto_errors()):
            try:
                data: bytes = self.settings.client().get_object(Bucket=self.bucket,
                                                                Key=key)["Body"].read()
            except boto_errors() as exc:
                if ERRORS.code(exc) in ERRORS.NOT_FOUND:
                    return None
                raise
        return data

    def _list(self, prefix: str) -> Iterator[tuple[str, datetime]]:
        paginator = self.settings.client().get_paginator("list_objects_v2")
        with classified(ERRORS.classify, f"ListObjectsV2 of s3://{self.bucket}/{prefix}",
                        boto_errors()):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                for item in page.get("Contents", ()):
                    yield item["Key"], item["LastModified"]

    def _delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), DELETE_BATCH):
            batch = keys[start:start + DELETE_BATCH]
            reply = self._call("DeleteObjects from", "delete_objects",
                               Delete={"Objects": [{"Key": key} for key in batch],
                                       "Quiet": True})
            failed = reply.get("Errors") or []
            if failed:
                first = failed[0]
                raise ERRORS.error(str(first.get("Code")), f"DeleteObjects of {len(failed)} "
                                   f"objects from {self.location}", first.get("Message", ""))
