"""The staging: each pre-committed transaction's requests, durable until commit.

Two implementations of one small interface (:class:`Staging`), chosen by :func:`staging_at`
from the location: a local directory (:class:`LocalStaging`, below), or an ``s3://`` /
``s3a://`` prefix (:class:`~sinks.http.s3_staging.S3Staging`) for a cluster whose executors
and driver share no disk.

=========================  ===================================  ================================
state of a transaction     a local directory                    an S3 prefix
=========================  ===================================  ================================
writing (a task still      ``<txn>.writing/000000.body`` ...    ``<txn>.staged/000000.body``
writing, or killed)                                             ... and no manifest object
staged (pre-committed:     ``<txn>.staged/000000.body`` ...,    the bodies, then
bodies as sent, keys,      ``<txn>.staged/manifest.json``;      ``<txn>.staged/manifest.json``
counts, digests)           sealed by renaming ``.writing``      written LAST: its presence is
                                                                the seal (S3 has no rename)
committed (the receiver    ``<txn>.committed`` (a file)         ``<txn>.committed`` (an object)
answered every request)
=========================  ===================================  ================================

Commit writes the ``.committed`` record once the receiver has answered every request with a
2xx, then removes the staged bodies; abort removes what is written or staged. The transaction
id is the name, so a listing of the location names every transaction still in doubt.
Locally: directories 0700, files 0600, every file fsync'ed, every rename followed by an fsync
of its directory. On S3, access is the bucket policy's business: grant the query's principal
``s3:GetObject``, ``s3:PutObject``, ``s3:DeleteObject`` and ``s3:ListBucket`` on the prefix and
nobody else.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from twophase import ConfigurationError, TxnId

WRITING, STAGED, COMMITTED = ".writing", ".staged", ".committed"
MANIFEST = "manifest.json"
DIR_MODE, FILE_MODE = 0o700, 0o600
S3_SCHEMES = ("s3://", "s3a://")


def body_name(index: int) -> str:
    return f"{index:06d}.body"


@dataclass(frozen=True)
class StagedRequest:
    """One request of a staged transaction."""

    index: int
    key: str
    records: int
    digest: str  # SHA-256 of the decoded content (see protocol.fingerprint)
    size: int  # bytes as sent


@dataclass(frozen=True)
class Manifest:
    """What pre-commit staged for one transaction."""

    txn: str
    staged_at: float
    encoding: str
    compression: str | None
    rows: int
    requests: tuple[StagedRequest, ...]

    def dumps(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def loads(cls, text: bytes) -> Manifest:
        obj: dict[str, Any] = json.loads(text)
        return cls(**{**obj, "requests": tuple(StagedRequest(**r) for r in obj["requests"])})


def commit_record(txn_id: TxnId, requests: int, replayed: int) -> bytes:
    """The content of a ``.committed`` record."""
    return json.dumps({"txn": str(txn_id), "committed_at": time.time(), "requests": requests,
                       "replayed": replayed}).encode()


def _write_file(path: Path, data: bytes) -> None:
    """A new owner-only file, its bytes on disk before this returns."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Staging(Protocol):
    """Where one sink's transactions wait for their commit (see the module docstring)."""

    @property
    def location(self) -> str:
        """The staging root, as messages name it (a path or a URL; never a secret)."""

    def ensure_root(self) -> None:
        """Check (and create, if it can) the root before the start."""

    def open(self, txn_id: TxnId) -> None:
        """A fresh transaction to write into (a leftover of the same id is replaced)."""

    def write_body(self, txn_id: TxnId, index: int, body: bytes) -> None:
        """One request's body, durably."""

    def seal(self, manifest: Manifest) -> str:
        """Pre-commit: the manifest, durably; the staged location (for the handle)."""

    def staged_location(self, txn_id: TxnId) -> str:
        """Where a staged transaction's bodies are (for handles and messages)."""

    def manifest(self, txn_id: TxnId) -> Manifest | None:
        """The staged manifest, None if the transaction is not (or no longer) staged."""

    def body(self, txn_id: TxnId, index: int) -> bytes:
        """A staged body; FileNotFoundError once it is removed."""

    def is_committed(self, txn_id: TxnId) -> bool:
        """Does a commit record name the transaction?"""

    def record_commit(self, txn_id: TxnId, requests: int, replayed: int) -> None:
        """The proof of commit: written only after the receiver answered every request."""

    def remove(self, txn_id: TxnId) -> bool:
        """Remove what is written or staged for the transaction; True if anything was."""

    def entries(self, namespace: str) -> Iterator[tuple[TxnId, str]]:
        """``(txn id, state)`` of every transaction of ``namespace`` (states as above)."""

    def purge(self, namespace: str, older_than: float) -> int:
        """Drop the commit records of ``namespace`` written before ``older_than``."""


def staging_at(location: str | os.PathLike[str],
               options: Mapping[str, Any] | None = None) -> Staging:
    """The staging at ``location``: an ``s3://`` / ``s3a://`` URL (with ``options``), or a
    local directory."""
    text = os.fspath(location)
    if text.startswith(S3_SCHEMES):
        from sinks.http.s3_staging import S3Staging  # noqa: PLC0415 - only S3 needs boto3

        return S3Staging.at(text, options or {})
    if "://" in text:
        raise ConfigurationError(f"HttpSink: staging={text!r} is neither a local directory "
                                 "nor an S3 URL.",
                                 fix="pass staging='s3://bucket/prefix' or a local directory")
    if options:
        raise ConfigurationError(f"HttpSink: staging_options {sorted(options)} were given for "
                                 f"the local staging {text}.",
                                 fix="pass staging_options= only with an s3:// staging")
    return LocalStaging(text)


class LocalStaging:
    """A local directory (a shared file system on a cluster), see the module docstring."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"LocalStaging({str(self.root)!r})"

    @property
    def location(self) -> str:
        return str(self.root)

    def path(self, txn_id: TxnId | str, state: str) -> Path:
        return self.root / f"{txn_id}{state}"

    def staged_location(self, txn_id: TxnId) -> str:
        return str(self.path(txn_id, STAGED))

    def ensure_root(self) -> None:
        if not self.root.is_dir():
            self.root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)

    # -- executor ------------------------------------------------------------------------------

    def open(self, txn_id: TxnId) -> None:
        self.ensure_root()
        writing = self.path(txn_id, WRITING)
        shutil.rmtree(writing, ignore_errors=True)
        writing.mkdir(mode=DIR_MODE)

    def write_body(self, txn_id: TxnId, index: int, body: bytes) -> None:
        _write_file(self.path(txn_id, WRITING) / body_name(index), body)

    def seal(self, manifest: Manifest) -> str:
        """The manifest, then ``.writing`` -> ``.staged``, durably."""
        writing = self.path(manifest.txn, WRITING)
        _write_file(writing / MANIFEST, manifest.dumps())
        _fsync_dir(writing)
        staged = self.path(manifest.txn, STAGED)
        os.replace(writing, staged)
        _fsync_dir(self.root)
        return str(staged)

    # -- driver --------------------------------------------------------------------------------

    def manifest(self, txn_id: TxnId) -> Manifest | None:
        try:
            return Manifest.loads((self.path(txn_id, STAGED) / MANIFEST).read_bytes())
        except FileNotFoundError:
            return None

    def body(self, txn_id: TxnId, index: int) -> bytes:
        return (self.path(txn_id, STAGED) / body_name(index)).read_bytes()

    def is_committed(self, txn_id: TxnId) -> bool:
        return self.path(txn_id, COMMITTED).exists()

    def record_commit(self, txn_id: TxnId, requests: int, replayed: int) -> None:
        temporary = self.root / f".{txn_id}.{os.getpid()}.tmp"
        _write_file(temporary, commit_record(txn_id, requests, replayed))
        os.replace(temporary, self.path(txn_id, COMMITTED))
        _fsync_dir(self.root)

    def remove(self, txn_id: TxnId) -> bool:
        removed = False
        for state in (WRITING, STAGED):
            path = self.path(txn_id, state)
            if path.exists():
                shutil.rmtree(path, ignore_errors=True)
                removed = True
        return removed

    def entries(self, namespace: str) -> Iterator[tuple[TxnId, str]]:
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.root):
                name, dot, state = entry.name.rpartition(".")
                try:
                    txn_id = TxnId.parse(name)
                except ValueError:
                    continue
                if dot and txn_id.namespace == namespace:
                    yield txn_id, f".{state}"

    def purge(self, namespace: str, older_than: float) -> int:
        purged = 0
        for txn_id, state in self.entries(namespace):
            path = self.path(txn_id, state)
            if state == COMMITTED and path.stat().st_mtime < older_than:
                path.unlink(missing_ok=True)
                purged += 1
        return purged
