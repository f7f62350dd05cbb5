"""Where a table's files live: a local directory or an S3 prefix, behind one small interface.

The Delta log is read and written by deltalake, through its own object store and the sink's
``storage_options``; everything else the sink stores (the data files, the intents of
:mod:`~sinks.delta.intents`) goes through a :class:`Storage`, relative to the table's root:

==========================  ============================  ===================================
call                        a local directory             an S3 prefix (twophase's S3 client)
==========================  ============================  ===================================
``create`` / ``seal``       ``open(path, "xb")``, then    a buffer, then one ``PutObject``
                            flush, fsync, close           with ``If-None-Match: *``
``put`` (replace)           a temporary file, fsync,      ``PutObject``
                            ``os.replace``
``get`` / ``stat``          read / ``stat``               ``GetObject`` / ``HeadObject``
``names``                   ``os.scandir``                ``ListObjectsV2`` under the prefix
``delete``                  ``unlink``                    ``DeleteObjects`` (1,000 a request)
==========================  ============================  ===================================

A file is created exclusively: a second ``create`` of one name fails with
:class:`FileExistsError` (locally at ``create``, on S3 at ``seal``: the conditional put).

On S3 the sink's settings come from the same ``storage_options`` deltalake takes (its key
names, case-insensitive, with or without ``aws_``): ``access_key_id``, ``secret_access_key``,
``session_token``, ``region``, ``endpoint_url`` (or ``endpoint``), ``virtual_hosted_style_request``
(path style by default, as deltalake's); any other key is deltalake's alone.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import unquote, urlparse

from sinks.delta.errors import S3_ERRORS, SYSTEM
from twophase import ConfigurationError
from twophase.kit import S3Errors, S3Settings, boto_errors, split_s3_location

MS_PER_S = 1000
#: The most keys one ``DeleteObjects`` request takes.
DELETE_BATCH = 1000
#: deltalake's option names (after the optional ``aws_`` prefix, lower case) that the sink's own
#: S3 client takes too, and the :class:`~twophase.kit.S3Settings` field each becomes.
S3_SETTINGS_OF_OPTIONS: Mapping[str, str] = {
    "access_key_id": "access_key_id", "secret_access_key": "secret_access_key",
    "session_token": "session_token", "token": "session_token", "region": "region",
    "default_region": "region", "endpoint_url": "endpoint_url", "endpoint": "endpoint_url"}
VIRTUAL_HOSTED = "virtual_hosted_style_request"


@dataclass(frozen=True)
class FileStat:
    size: int
    #: Milliseconds since the epoch (an ``AddAction``'s ``modificationTime``).
    modification_time: int


class Output(ABC):
    """A file being written: a binary stream, then :meth:`seal` (durable) or :meth:`abandon`."""

    stream: IO[bytes]

    @abstractmethod
    def seal(self) -> FileStat:
        """The file, whole and durable (a name taken already: :class:`FileExistsError`)."""

    def abandon(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stream.close()


class Storage(ABC):
    """A table's files, by path relative to its root (``/``-separated)."""

    #: Every error a call may raise (the sink's classifier turns them into twophase errors).
    errors: tuple[type[BaseException], ...] = (OSError,)

    @abstractmethod
    def create(self, relative: str) -> Output:
        """A new file at ``relative``, never over an existing one."""

    @abstractmethod
    def put(self, relative: str, body: bytes) -> None:
        """``body`` at ``relative``, replacing what was there, whole or not at all."""

    @abstractmethod
    def get(self, relative: str) -> bytes | None:
        """The file's bytes (None: no such file)."""

    @abstractmethod
    def stat(self, relative: str) -> FileStat | None:
        """The file's size and modification time (None: no such file)."""

    @abstractmethod
    def names(self, directory: str) -> list[str]:
        """The names of the files directly in ``directory`` (none if it does not exist)."""

    @abstractmethod
    def delete(self, relatives: Iterable[str]) -> int:
        """Delete the files that exist; how many were deleted (may count absent ones on S3,
        which does not tell)."""


def storage_for(table_uri: str, storage_options: Mapping[str, Any]) -> Storage:
    """The storage of a table at ``table_uri``: a local path, ``file://`` or ``s3://``."""
    scheme = urlparse(table_uri).scheme
    if scheme in ("s3", "s3a"):
        bucket, prefix = split_s3_location(
            f"s3://{table_uri.split('://', 1)[1]}", named=f"{SYSTEM} table_uri",
            fix="give the table as s3://bucket/path")
        return S3Storage(s3_settings(bucket, storage_options), prefix.strip("/"))
    if scheme in ("", "file"):
        return LocalStorage(Path(unquote(urlparse(table_uri).path) if scheme else table_uri))
    raise ConfigurationError(
        f"{SYSTEM}: table_uri {table_uri!r}: the scheme {scheme!r} is not supported.",
        fix="give a local path, file:///path or s3://bucket/path")


def s3_settings(bucket: str, storage_options: Mapping[str, Any]) -> S3Settings:
    """The sink's S3 client settings from deltalake's ``storage_options`` (module docstring)."""
    settings: dict[str, Any] = {}
    path_style = True
    for key, value in storage_options.items():
        name = key.lower().removeprefix("aws_")
        if name in S3_SETTINGS_OF_OPTIONS:
            settings[S3_SETTINGS_OF_OPTIONS[name]] = value
        elif name == VIRTUAL_HOSTED:
            path_style = str(value).lower() not in ("true", "1")
    return S3Settings(bucket, path_style=path_style, **settings)


class _LocalOutput(Output):
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.stream = open(path, "xb")  # noqa: SIM115 - closed by seal() or abandon()

    def seal(self) -> FileStat:
        self.stream.flush()
        os.fsync(self.stream.fileno())
        self.stream.close()
        stat = self.path.stat()
        return FileStat(stat.st_size, int(stat.st_mtime * MS_PER_S))


class LocalStorage(Storage):
    """A table in a local directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, relative: str) -> Path:
        return self.root / relative

    def create(self, relative: str) -> Output:
        return _LocalOutput(self.path(relative))

    def put(self, relative: str, body: bytes) -> None:
        path = self.path(relative)
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
        try:
            with os.fdopen(descriptor, "wb") as stream:
                stream.write(body)
                stream.flush()
                os.fsync(stream.fileno())
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise

    def get(self, relative: str) -> bytes | None:
        try:
            return self.path(relative).read_bytes()
        except FileNotFoundError:
            return None

    def stat(self, relative: str) -> FileStat | None:
        try:
            stat = self.path(relative).stat()
        except FileNotFoundError:
            return None
        return FileStat(stat.st_size, int(stat.st_mtime * MS_PER_S))

    def names(self, directory: str) -> list[str]:
        try:
            with os.scandir(self.path(directory)) as entries:
                return [entry.name for entry in entries if entry.is_file()]
        except FileNotFoundError:
            return []

    def delete(self, relatives: Iterable[str]) -> int:
        deleted = 0
        for relative in relatives:
            with contextlib.suppress(FileNotFoundError):
                self.path(relative).unlink()
                deleted += 1
        return deleted


class _S3Output(Output):
    def __init__(self, storage: S3Storage, key: str) -> None:
        self.storage, self.key = storage, key
        self.buffer = io.BytesIO()
        self.stream = self.buffer

    def seal(self) -> FileStat:
        body = self.buffer.getvalue()
        #: Before the put: a deadline counted from it is never later than VACUUM's clock.
        written = int(time.time() * MS_PER_S)
        try:
            self.storage.client().put_object(Bucket=self.storage.settings.bucket, Key=self.key,
                                             Body=body, IfNoneMatch="*")
        except self.storage.errors as exc:
            if S3_ERRORS.code(exc) in (S3Errors.PRECONDITION_FAILED,
                                       S3Errors.CONDITIONAL_CONFLICT):
                raise FileExistsError(f"s3://{self.storage.settings.bucket}/{self.key}") from exc
            raise
        self.stream.close()
        return FileStat(len(body), written)


class S3Storage(Storage):
    """A table under an S3 prefix, reached by twophase's S3 client."""

    def __init__(self, settings: S3Settings, prefix: str) -> None:
        self.settings, self.prefix = settings, prefix
        self.errors = boto_errors()

    def client(self) -> Any:
        return self.settings.client()

    def key(self, relative: str) -> str:
        return f"{self.prefix}/{relative}" if self.prefix else relative

    def create(self, relative: str) -> Output:
        return _S3Output(self, self.key(relative))

    def put(self, relative: str, body: bytes) -> None:
        self.client().put_object(Bucket=self.settings.bucket, Key=self.key(relative), Body=body)

    def get(self, relative: str) -> bytes | None:
        response = self._found("get_object", relative)
        return None if response is None else bytes(response["Body"].read())

    def stat(self, relative: str) -> FileStat | None:
        head = self._found("head_object", relative)
        return None if head is None else FileStat(
            int(head["ContentLength"]), int(head["LastModified"].timestamp() * MS_PER_S))

    def _found(self, operation: str, relative: str) -> dict[str, Any] | None:
        """The reply of ``operation`` on the object at ``relative`` (None: no such object)."""
        try:
            reply: dict[str, Any] = getattr(self.client(), operation)(
                Bucket=self.settings.bucket, Key=self.key(relative))
        except self.errors as exc:
            if S3_ERRORS.code(exc) in S3Errors.NOT_FOUND:
                return None
            raise
        return reply

    def names(self, directory: str) -> list[str]:
        prefix = self.key(directory).rstrip("/") + "/"
        pages = self.client().get_paginator("list_objects_v2").paginate(
            Bucket=self.settings.bucket, Prefix=prefix, Delimiter="/")
        return [item["Key"][len(prefix):] for page in pages for item in page.get("Contents", ())]

    def delete(self, relatives: Iterable[str]) -> int:
        keys = [self.key(relative) for relative in relatives]
        for start in range(0, len(keys), DELETE_BATCH):
            response = self.client().delete_objects(Bucket=self.settings.bucket, Delete={
                "Objects": [{"Key": key} for key in keys[start:start + DELETE_BATCH]],
                "Quiet": True})
            if errors := response.get("Errors"):
                first = errors[0]
                where = f"s3://{self.settings.bucket}/{first.get('Key')}"
                raise S3_ERRORS.error(str(first.get("Code")), f"DeleteObjects of {where}",
                                      str(first.get("Message", "")), operation="DeleteObjects")
        return len(keys)
