"""What every lake-table sink shares (Delta, Iceberg): where its files live, the intents that
say which of them are in doubt, and a transaction's rolling data files.

**Storage.** A table's data files and intents are read and written through a
:class:`LakeStorage`, by path relative to a root (the table's location); the table format's
own metadata (the Delta log, Iceberg's catalog and metadata files) goes through its library:

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
:class:`FileExistsError` (locally at ``create``, on S3 at ``seal``: the conditional put), so a
transaction id used twice never overwrites the first use's (maybe committed) file.

**Intents.** Before a transaction creates a data file it records its intent,
``_twophase/<namespace>/<txn id>.json`` under the root (a ``_`` folder: neither Delta's nor
Iceberg's readers list folders, and it never holds data), listing every file it created:

===========================================  =================================================
who                                          what
===========================================  =================================================
the executor, before it creates a data file  writes the intent again, listing the new file
abort (the executor's discard, the sweep)    deletes the files, then the intent
the committer, once a batch's commit is      deletes the intents of the batch's transactions
proven (``finish_batch``)
``list_in_doubt``                            lists the intents of a namespace; one whose
                                             transaction is proven committed is deleted on
                                             sight (a crash between commit and deletion)
===========================================  =================================================

So a data file of ours that no commit references always has an intent, and listing what is in
doubt costs one listing of ``_twophase/<namespace>/`` plus one read per intent: it grows with
the transactions not yet settled, never with the table's age.

**Files.** :class:`LakeFiles` writes a transaction's rows: one open file per partition value,
rolled once it reaches ``max_file_bytes``, each named by the intent before it is created; the
format's writer (statistics, field ids) is the sink's :class:`LakeFileWriter`.

**The lake deadline.** A data file no commit references is an orphan to the table's own
cleanup (Delta's VACUUM, Iceberg's ``remove_orphan_files``) once it is older than a retention:
:func:`lake_deadline` is the oldest file's creation plus that retention, the instant past which
a decided batch could no longer be committed whole.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Generic, Protocol, TypeVar
from urllib.parse import unquote, urlparse

from twophase._handle import TxnId
from twophase._s3 import S3Errors, S3Settings, boto_errors, split_s3_location
from twophase.errors import ConfigurationError, SchemaMismatchError, TwoPhaseError

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

MS_PER_S = 1000
#: The most keys one ``DeleteObjects`` request takes.
DELETE_BATCH = 1000
INTENTS_DIRECTORY = "_twophase"
INTENT_SUFFIX = ".json"
#: The default size at which a transaction's data file is closed and the next one begun.
DEFAULT_MAX_FILE_BYTES = 128 * 1024 * 1024
#: What a lake sink's credentials need on a table on S3: the bucket's listing, and the objects
#: under the table's prefix (data files, intents, the format's own log or metadata).
LAKE_BUCKET_PERMISSIONS = ("s3:ListBucket",)
LAKE_OBJECT_PERMISSIONS = ("s3:GetObject", "s3:PutObject", "s3:DeleteObject")
LAKE_S3_PERMISSIONS = LAKE_BUCKET_PERMISSIONS + LAKE_OBJECT_PERMISSIONS
POLICY_VERSION = "2012-10-17"


def lake_iam_policy(bucket: str, prefix: str) -> dict[str, Any]:
    """The least-privilege IAM policy of a lake sink appending to a table at
    ``s3://bucket/prefix`` (:data:`LAKE_S3_PERMISSIONS`)."""
    return {"Version": POLICY_VERSION, "Statement": [
        {"Sid": "TableBucket", "Effect": "Allow", "Action": list(LAKE_BUCKET_PERMISSIONS),
         "Resource": f"arn:aws:s3:::{bucket}"},
        {"Sid": "TableObjects", "Effect": "Allow", "Action": list(LAKE_OBJECT_PERMISSIONS),
         "Resource": f"arn:aws:s3:::{bucket}/{prefix.strip('/')}/*"}]}


@dataclass(frozen=True)
class LakeFileStat:
    size: int
    #: Milliseconds since the epoch.
    modification_time: int


class LakeOutput(ABC):
    """A file being written: a binary stream, then :meth:`seal` (durable) or :meth:`abandon`."""

    stream: IO[bytes]

    @abstractmethod
    def seal(self) -> LakeFileStat:
        """The file, whole and durable (a name taken already: :class:`FileExistsError`)."""

    def abandon(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stream.close()


class LakeStorage(ABC):
    """A table's files, by path relative to its root (``/``-separated)."""

    #: Every error a call may raise (the sink's classifier turns them into twophase errors).
    errors: tuple[type[BaseException], ...] = (OSError,)
    #: The root as the table's format names it (``file:///...``, ``s3://bucket/...``, a path).
    location: str = ""

    def uri(self, relative: str) -> str:
        """The file's location as the table's metadata names it: the root's, then the path
        as it is (never percent-escaped again: readers open it as written)."""
        return f"{self.location.rstrip('/')}/{relative}"

    @abstractmethod
    def create(self, relative: str) -> LakeOutput:
        """A new file at ``relative``, never over an existing one."""

    @abstractmethod
    def put(self, relative: str, body: bytes) -> None:
        """``body`` at ``relative``, replacing what was there, whole or not at all."""

    @abstractmethod
    def get(self, relative: str) -> bytes | None:
        """The file's bytes (None: no such file)."""

    @abstractmethod
    def stat(self, relative: str) -> LakeFileStat | None:
        """The file's size and modification time (None: no such file)."""

    @abstractmethod
    def names(self, directory: str) -> list[str]:
        """The names of the files directly in ``directory`` (none if it does not exist)."""

    @abstractmethod
    def delete(self, relatives: Iterable[str]) -> int:
        """Delete the files that exist; how many were deleted (may count absent ones on S3,
        which does not tell)."""


def lake_storage(location: str, *, system: str, s3_errors: S3Errors,
                 s3_settings: Callable[[str], S3Settings],
                 percent_decoded: bool = True) -> LakeStorage:
    """The storage rooted at ``location`` (a local path, ``file://`` or ``s3://``);
    ``s3_settings(bucket)`` gives the S3 client's settings from the sink's options.

    ``percent_decoded``: whether the table format's own library reads a ``file://``
    location's path with its percent-escapes decoded (deltalake's object store does;
    pyiceberg's file IO does not: ``file:///lake/a%2Bb`` is the directory ``a%2Bb`` to it).
    The data files must land where the format's metadata says they are."""
    scheme = urlparse(location).scheme
    if scheme in ("s3", "s3a"):
        bucket, prefix = split_s3_location(
            f"s3://{location.split('://', 1)[1]}", named=f"{system} location",
            fix="give the table as s3://bucket/path")
        storage: LakeStorage = S3LakeStorage(s3_settings(bucket), prefix.strip("/"), s3_errors)
    elif scheme in ("", "file"):
        path = urlparse(location).path if scheme else location
        storage = LocalLakeStorage(Path(unquote(path) if percent_decoded else path))
    else:
        raise ConfigurationError(
            f"{system}: location {location!r}: the scheme {scheme!r} is not supported.",
            fix="give a local path, file:///path or s3://bucket/path")
    storage.location = location
    return storage


class _LocalOutput(LakeOutput):
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.stream = open(path, "xb")  # noqa: SIM115 - closed by seal() or abandon()

    def seal(self) -> LakeFileStat:
        self.stream.flush()
        os.fsync(self.stream.fileno())
        self.stream.close()
        stat = self.path.stat()
        return LakeFileStat(stat.st_size, int(stat.st_mtime * MS_PER_S))


class LocalLakeStorage(LakeStorage):
    """A table in a local directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, relative: str) -> Path:
        return self.root / relative

    def create(self, relative: str) -> LakeOutput:
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

    def stat(self, relative: str) -> LakeFileStat | None:
        try:
            stat = self.path(relative).stat()
        except FileNotFoundError:
            return None
        return LakeFileStat(stat.st_size, int(stat.st_mtime * MS_PER_S))

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


class _S3Output(LakeOutput):
    def __init__(self, storage: S3LakeStorage, key: str) -> None:
        self.storage, self.key = storage, key
        self.buffer = io.BytesIO()
        self.stream = self.buffer

    def seal(self) -> LakeFileStat:
        body = self.buffer.getvalue()
        #: Before the put: a deadline counted from it is never later than the cleanup's clock.
        written = int(time.time() * MS_PER_S)
        try:
            self.storage.client().put_object(Bucket=self.storage.settings.bucket, Key=self.key,
                                             Body=body, IfNoneMatch="*")
        except self.storage.errors as exc:
            if self.storage.s3_errors.code(exc) in (S3Errors.PRECONDITION_FAILED,
                                                    S3Errors.CONDITIONAL_CONFLICT):
                raise FileExistsError(f"s3://{self.storage.settings.bucket}/{self.key}") from exc
            raise
        self.stream.close()
        return LakeFileStat(len(body), written)


class S3LakeStorage(LakeStorage):
    """A table under an S3 prefix, reached by twophase's S3 client."""

    def __init__(self, settings: S3Settings, prefix: str, s3_errors: S3Errors) -> None:
        self.settings, self.prefix, self.s3_errors = settings, prefix, s3_errors
        self.errors = boto_errors()

    def client(self) -> Any:
        return self.settings.client()

    def key(self, relative: str) -> str:
        return f"{self.prefix}/{relative}" if self.prefix else relative

    def create(self, relative: str) -> LakeOutput:
        return _S3Output(self, self.key(relative))

    def put(self, relative: str, body: bytes) -> None:
        self.client().put_object(Bucket=self.settings.bucket, Key=self.key(relative), Body=body)

    def get(self, relative: str) -> bytes | None:
        response = self._found("get_object", relative)
        return None if response is None else bytes(response["Body"].read())

    def stat(self, relative: str) -> LakeFileStat | None:
        head = self._found("head_object", relative)
        return None if head is None else LakeFileStat(
            int(head["ContentLength"]), int(head["LastModified"].timestamp() * MS_PER_S))

    def _found(self, operation: str, relative: str) -> dict[str, Any] | None:
        """The reply of ``operation`` on the object at ``relative`` (None: no such object)."""
        try:
            reply: dict[str, Any] = getattr(self.client(), operation)(
                Bucket=self.settings.bucket, Key=self.key(relative))
        except self.errors as exc:
            if self.s3_errors.code(exc) in S3Errors.NOT_FOUND:
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
                raise self.s3_errors.error(str(first.get("Code")), f"DeleteObjects of {where}",
                                           str(first.get("Message", "")),
                                           operation="DeleteObjects")
        return len(keys)


# -- intents ---------------------------------------------------------------------------------


class LakeIntents:
    """The intents of the transactions writing into one storage (module docstring)."""

    def __init__(self, storage: LakeStorage) -> None:
        self.storage = storage

    @staticmethod
    def directory_of(namespace: str) -> str:
        return f"{INTENTS_DIRECTORY}/{namespace}"

    def path_of(self, txn_id: TxnId) -> str:
        return f"{self.directory_of(txn_id.namespace)}/{txn_id}{INTENT_SUFFIX}"

    def record(self, txn_id: TxnId, files: Sequence[str]) -> None:
        """The intent of ``txn_id``, listing ``files`` (written again for each new file)."""
        self.storage.put(self.path_of(txn_id), json.dumps({"files": list(files)}).encode())

    def files_named(self, txn_id: TxnId) -> list[str]:
        """The files the intent of ``txn_id`` lists (none: no intent)."""
        body = self.storage.get(self.path_of(txn_id))
        return [] if body is None else _intent_files(body)

    def forget(self, txn_ids: Iterable[TxnId]) -> None:
        """Delete the intents of ``txn_ids`` (settled transactions)."""
        if paths := [self.path_of(txn_id) for txn_id in txn_ids]:
            self.storage.delete(paths)

    def pending(self, namespace: str) -> dict[TxnId, list[str]]:
        """Every intent of ``namespace``: its transaction and the files it lists."""
        found: dict[TxnId, list[str]] = {}
        directory = self.directory_of(namespace)
        for name in self.storage.names(directory):
            txn_id = _intent_txn(name)
            if txn_id is None or txn_id.namespace != namespace:
                continue
            body = self.storage.get(f"{directory}/{name}")
            if body is not None:  # settled while we listed
                found[txn_id] = _intent_files(body)
        return found


def _intent_txn(name: str) -> TxnId | None:
    if not name.endswith(INTENT_SUFFIX):
        return None
    try:
        return TxnId.parse(name.removesuffix(INTENT_SUFFIX))
    except ValueError:
        return None


def _intent_files(body: bytes) -> list[str]:
    files: list[str] = json.loads(body)["files"]
    return files


# -- a transaction's files -------------------------------------------------------------------

Sealed = TypeVar("Sealed")
Sealed_co = TypeVar("Sealed_co", covariant=True)
Key = TypeVar("Key")


class LakeFileWriter(Protocol[Sealed_co]):
    """One open data file of a format: rows in, then closed into what its commit needs."""

    def write(self, table: pa.Table) -> None: ...

    @property
    def path(self) -> str:
        """Relative to the storage's root."""

    @property
    def size(self) -> int:
        """Bytes written so far."""

    def close(self) -> Sealed_co:
        """Close and seal the file (its :class:`LakeOutput`): durable."""

    def abandon(self) -> None:
        """Drop the open file (its bytes may be partly written)."""


@dataclass
class LakeFiles(Generic[Key, Sealed]):
    """The files of one transaction: one open file per partition key, rolled at
    ``max_file_bytes``, each named by the transaction's intent before it is created; closed
    by :meth:`close`, deleted with the intent by :meth:`delete`.

    ``partitions(table)`` splits rows by partition key; ``path_of(key, number)`` names the
    transaction's ``number``-th file; ``open_file(output, path, key)`` begins its writer."""

    storage: LakeStorage
    txn_id: TxnId
    max_file_bytes: int
    partitions: Callable[[pa.Table], Iterator[tuple[Key, pa.Table]]]
    path_of: Callable[[Key, int], str]
    open_file: Callable[[LakeOutput, str, Key], LakeFileWriter[Sealed]]
    rows: int = 0
    closed: list[Sealed] = field(default_factory=list)
    _open: dict[Key, LakeFileWriter[Sealed]] = field(default_factory=dict)
    _created: list[str] = field(default_factory=list)

    @property
    def intents(self) -> LakeIntents:
        return LakeIntents(self.storage)

    def write(self, table: pa.Table) -> None:
        """Rows of the table's columns (partition columns included)."""
        for key, part in self.partitions(table):
            writer = self._file_of(key)
            writer.write(part)
            if writer.size >= self.max_file_bytes:
                self._seal(self._open.pop(key))
        self.rows += table.num_rows

    def close(self) -> list[Sealed]:
        """Close every open file: the transaction's files, durable."""
        while self._open:
            self._seal(self._open.pop(next(iter(self._open))))
        return self.closed

    def _seal(self, writer: LakeFileWriter[Sealed]) -> None:
        try:
            self.closed.append(writer.close())
        except FileExistsError:
            self._created.remove(writer.path)  # another's file (on S3, found at the put)
            raise

    def delete(self) -> None:
        """Delete every file this transaction created, then its intent (a discarded
        transaction); never raises: what is left is the sweep's."""
        for writer in self._open.values():
            writer.abandon()
        self._open.clear()
        if not self._created:
            return
        caught: tuple[type[BaseException], ...] = (*self.storage.errors, TwoPhaseError)
        try:
            self.storage.delete(self._created)
            self.intents.forget([self.txn_id])
        except caught as exc:
            log.warning("discarding %s: %s (the sweep deletes what is left)", self.txn_id, exc)

    def _file_of(self, key: Key) -> LakeFileWriter[Sealed]:
        if key not in self._open:
            relative = self.path_of(key, len(self._created))
            self.intents.record(self.txn_id, [*self._created, relative])
            output = self.storage.create(relative)
            self._created.append(relative)
            self._open[key] = self.open_file(output, relative, key)
        return self._open[key]


def lake_deadline(created_ms: Iterable[int], retention_s: float) -> float | None:
    """When the table's cleanup may delete the oldest of the files created at ``created_ms``
    (milliseconds since the epoch) that no commit references: None for no file."""
    created = [milliseconds / MS_PER_S for milliseconds in created_ms]
    return min(created) + retention_s if created else None


def conform_table(table: pa.Table, schema: pa.Schema, where: str) -> pa.Table:
    """``table`` with ``schema``'s columns in its order and types (a column the rows lack:
    nulls); a NULL in a NOT NULL column is refused."""
    import pyarrow as pa  # noqa: PLC0415 - the framework itself never needs pyarrow

    columns = []
    for column_field in schema:
        if column_field.name in table.column_names:
            column = table.column(column_field.name).cast(column_field.type)
        else:
            column = pa.nulls(table.num_rows, column_field.type)
        if not column_field.nullable and column.null_count:
            raise SchemaMismatchError(
                f"{where}: column {column_field.name!r} is NOT NULL, but {column.null_count} "
                "row(s) hold NULL there.", fix="filter or fill the NULLs in the query")
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema)
