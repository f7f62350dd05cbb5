"""Where a state file lives: a local directory or an S3 prefix, behind one small interface.

The state store (:mod:`twophase._state`) needs three things of a location: read the file with a
version, replace it only if it still has that version (compare-and-swap), and hold concurrent
writers apart. Each backend gets them from what its system guarantees:

==========  ====================================  ==============================================
location    atomic replace                        concurrent writers
==========  ====================================  ==============================================
local path  a temporary file (0600, fsynced),     ``flock`` on ``state.lock`` beside it: one
            renamed over the file, the directory  writer at a time; a reader sees the old file
            fsynced (0700)                        or the new one, never a torn one
``s3://``   ``PutObject`` with ``If-Match`` the   none needed: a write that lost a race is
``s3a://``  ETag read (``If-None-Match: *`` to    refused (412) and the store applies its change
            create): S3 swaps whole objects       again to what the winner wrote
==========  ====================================  ==============================================

An S3 location is ``s3://bucket/prefix`` (``s3a://`` is the same location, as Hadoop names
it); its options (:data:`~twophase._s3.S3_OPTIONS`: ``endpoint_url``, ``region``,
``path_style``, ``access_key_id``, ``secret_access_key``, ``session_token``, ``tls``,
``ca_bundle``...) default to boto3's chain (``AWS_*`` variables, the config files, an instance
role; ``AWS_ENDPOINT_URL_S3`` for a compatible store). ``secret_access_key`` and
``session_token`` may be :class:`~twophase.Secret` references; TLS is verified by default
(``ca_bundle=`` for a private CA, only ``tls="require"`` turns it off). The client and the
verdict on its errors are the framework's one S3 client (:mod:`twophase._s3`). Access to the
prefix is the bucket policy's business: grant the query's principal ``s3:GetObject`` and
``s3:PutObject`` on it and nobody else (the policy of docs/sinks/s3.md, statement ``State``).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from twophase._classify import classified
from twophase._s3 import S3Errors, S3Settings, boto_errors, split_s3_location
from twophase.errors import ConfigurationError

log = logging.getLogger(__name__)

S3_SCHEMES = ("s3://", "s3a://")
FILE_SCHEME = "file:"
LOCK_FILE_NAME = "state.lock"
#: Attempts of one S3 request inside boto3 (throttling, 5xx, connection resets).
STATE_S3_MAX_ATTEMPTS = 5
#: How the state store reaches S3 unless its options say otherwise: a state file is small (a
#: request silent for 20 s is retried), and every write carries a checksum.
STATE_S3_DEFAULTS = {"connect_timeout_s": 20.0, "read_timeout_s": 20.0,
                     "checksums": "when_supported"}
STATE_S3_ERRORS = S3Errors(permissions=("s3:GetObject", "s3:PutObject"))
#: Codes of a conditional write that lost a race (the file changed or went meanwhile).
_LOST_RACE = S3Errors.NOT_FOUND | {S3Errors.PRECONDITION_FAILED, S3Errors.CONDITIONAL_CONFLICT}

_DIR_MODE = 0o700
_FILE_MODE = 0o600


@dataclass(frozen=True)
class Versioned:
    """A file's bytes and the version a conditional replace must name."""

    data: bytes
    version: str


class Storage(Protocol):
    """One state file's location."""

    #: Does ``replace`` compare versions (True), or do ``exclusive`` sections keep writers
    #: apart (False: read under the lock before every write)?
    conditional: bool

    @property
    def location(self) -> str:
        """The file, as messages name it (a path or a URL)."""

    def read(self) -> Versioned | None:
        """The file and its version; None if there is none."""

    def replace(self, data: bytes, version: str | None) -> str | None:
        """Write ``data`` if the file still has ``version`` (None: if there is no file).

        The new version; None if another writer got there first (read and try again).
        """

    def exclusive(self) -> contextlib.AbstractContextManager[None]:
        """Hold other writers off while a change is read, made and written (if the store can)."""

    def tidy(self) -> None:
        """Remove what killed writers left (never valid, never read)."""

    def remove(self) -> None:
        """Delete the file (a preflight's probe file; never a state file): gone if absent."""


def is_s3(location: str) -> bool:
    return location.startswith(S3_SCHEMES)


def local_path(location: str | os.PathLike[str]) -> Path:
    """A local path from a path or ``file:`` URL; other schemes are refused with the fix."""
    text = os.fspath(location)
    if text.startswith(FILE_SCHEME):
        text = text[len(FILE_SCHEME):].removeprefix("//")
    if "://" in text:
        raise ConfigurationError(
            f"twophase keeps its state on a local file system or on S3, not at {text!r}.",
            fix="pass state_location='s3://bucket/prefix' or a local directory (one per query)",
        )
    return Path(text)


def join(location: str, name: str) -> str:
    """``location/name`` for a path or a URL."""
    return f"{location.rstrip('/')}/{name}"


def storage_at(location: str | os.PathLike[str], file_name: str,
               options: Mapping[str, Any] | None = None) -> Storage:
    """The storage of ``file_name`` in the directory or S3 prefix ``location``."""
    text = os.fspath(location)
    if is_s3(text):
        return S3Storage.at(text, file_name, options or {})
    if options:
        raise ConfigurationError(
            f"state options {sorted(options)} were given for the local location {text}.",
            fix="pass state options only with an s3:// state location")
    return LocalStorage(local_path(text), file_name)


# -- local ------------------------------------------------------------------------------------


class LocalStorage:
    """A file in a local directory: flock, temporary file, fsync, rename, fsync."""

    conditional = False

    def __init__(self, directory: Path, file_name: str) -> None:
        self.directory = directory
        self.path = directory / file_name
        self.location = str(self.path)

    def read(self) -> Versioned | None:
        try:
            data = self.path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise ConfigurationError(
                f"cannot read the state file {self.path}: {exc.strerror}.",
                fix="make it readable by the user running the query",
            ) from exc
        return Versioned(data, "")  # the lock, not a version, keeps writers apart here

    def replace(self, data: bytes, version: str | None) -> str | None:
        tmp = self.directory / f".{self.path.name}.{os.getpid()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, _FILE_MODE)
            with os.fdopen(fd, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            os.replace(tmp, self.path)
            dir_fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise self._unwritable(exc) from exc
        return ""

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        try:
            self.directory.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
            fd = os.open(self.directory / LOCK_FILE_NAME, os.O_RDWR | os.O_CREAT, _FILE_MODE)
        except OSError as exc:
            raise self._unwritable(exc) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def tidy(self) -> None:
        for stale in self.directory.glob(f".{self.path.name}.*.tmp"):
            with contextlib.suppress(OSError):
                stale.unlink()

    def remove(self) -> None:
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:
            raise self._unwritable(exc) from exc

    def _unwritable(self, exc: OSError) -> ConfigurationError:
        return ConfigurationError(
            f"cannot write the state location {self.directory}: {exc.strerror or exc}.",
            fix="give the query's user write access there, or pass another state location",
        )


# -- S3 ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class S3Storage:
    """An object in S3, replaced by conditional writes (S3 swaps whole objects atomically)."""

    settings: S3Settings
    key: str
    conditional = True

    @classmethod
    def at(cls, location: str, file_name: str, options: Mapping[str, Any]) -> S3Storage:
        bucket, prefix = split_s3_location(location, named="the state location",
                                           fix="pass state_location='s3://bucket/prefix'")
        settings = S3Settings.of(bucket, {**STATE_S3_DEFAULTS, **options}, named="state_options")
        return cls(settings, join(prefix, file_name).lstrip("/"))

    @property
    def location(self) -> str:
        return f"s3://{self.settings.bucket}/{self.key}"

    def read(self) -> Versioned | None:
        with self._classified("GetObject"):
            try:
                reply = self._client().get_object(Bucket=self.settings.bucket, Key=self.key)
            except boto_errors() as exc:
                if S3Errors.code(exc) in S3Errors.NOT_FOUND:
                    return None
                raise
            return Versioned(reply["Body"].read(), reply["ETag"])

    def replace(self, data: bytes, version: str | None) -> str | None:
        condition = {"IfMatch": version} if version else {"IfNoneMatch": "*"}
        with self._classified("PutObject"):
            try:
                reply = self._client().put_object(
                    Bucket=self.settings.bucket, Key=self.key, Body=data,
                    ContentType="application/json", **condition)
            except boto_errors() as exc:
                if S3Errors.code(exc) in _LOST_RACE:
                    log.info("state %s changed while it was being updated: applying the change "
                             "again", self.location)
                    return None
                raise
        etag: str = reply["ETag"]
        return etag

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        yield  # conditional writes keep writers apart

    def tidy(self) -> None:
        """Nothing: an S3 write is whole or absent."""

    def remove(self) -> None:
        with self._classified("DeleteObject"):
            self._client().delete_object(Bucket=self.settings.bucket, Key=self.key)

    def _client(self) -> Any:
        return self.settings.client(max_attempts=STATE_S3_MAX_ATTEMPTS)

    def _classified(self, request: str) -> contextlib.AbstractContextManager[None]:
        return classified(STATE_S3_ERRORS.classify, f"{request} of the state {self.location}",
                          boto_errors())
