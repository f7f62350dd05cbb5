"""The sink kit: what every sink needs and only its system's parts differ.

A new sink writes its phases and one error table; the rest comes from here:

=============================  ================================================================
piece                          what it does
=============================  ================================================================
:func:`chunks`                 groups rows into lists of at most ``chunk_size`` (bounded memory)
:func:`validate_chunk_size`    the option check every chunking sink makes
:func:`validate_mode`          ``mode="insert"`` / ``"upsert"`` / ``"keyed"`` and the ``key``
                               they need
:class:`Keyed`                 the keyed mode's one meaning (newest version wins, deletes keep
                               tombstones): :func:`validate_keyed`, :meth:`Keyed.reduce` and
                               :func:`newer_than` for a writer under locks,
                               :func:`keyed_apply_statements` for a publisher in SQL,
                               :func:`tombstone_table_name` (see :mod:`twophase._keyed`)
:func:`namespace_from`         a default namespace from a target's name (table, topic, prefix)
:class:`ErrorTable`            system error code -> retryable / fatal / config / schema + fix;
                               by exact code, by condition (the message), by code class
:func:`classified`             a context manager that raises the table's verdict
:func:`transaction_lost`       the one wording of "a decided transaction is gone"
:func:`transaction_id_reused`  the one wording of "this id was already committed"
:func:`as_utc`                 an instant in UTC; a naive datetime is a wall clock, read as UTC
:class:`ConnectionPool`        connections a committer's threads share (up to
                               ``commit_parallelism`` of them), one thread at a time each
:class:`PooledCommitter`       a :class:`~twophase.Committer` whose threads borrow pooled
                               sessions, errors classified: a database sink's committer
:func:`check_columns`          the column checks of ``check_schema`` in one wording: missing
                               columns, NOT NULL without default, the upsert key, instants
:func:`validate_namespace`     a namespace usable in transaction ids, else ConfigurationError
:func:`query_key`              the part of a query id that goes into transaction ids
:func:`rows_of`                Arrow record batches as rows of the types ``write`` gets
:class:`S3Settings`            an S3 bucket and how to reach it (credentials out of ``repr``);
                               ``client()``: one boto3 client per process, endpoint,
                               credentials and attempt count, all of one boto3 session
:data:`S3_OPTIONS`             the options an S3 location takes (``S3Settings``' fields)
:class:`S3Errors`              every S3 error classified once (the fix names the caller's
                               permissions), and the codes a caller steers by
:func:`boto_errors`            the botocore errors to catch around boto3 calls
:func:`split_s3_location`      the bucket and the key or prefix of ``s3://bucket/...``
:class:`LakeStorage`           a lake table's files (data, intents) under a local directory or
                               an S3 prefix, created exclusively (:func:`lake_storage` picks
                               one by location; :class:`LakeOutput`, :class:`LakeFileStat`)
:class:`LakeIntents`           each transaction's record of its files, until it is settled:
                               what is in doubt, listed without walking the data area
                               (under :data:`INTENTS_DIRECTORY`)
:class:`LakeFiles`             a transaction's data files: one per partition key, rolled at
                               ``max_file_bytes`` (:data:`DEFAULT_MAX_FILE_BYTES`), each
                               named by its intent first; the format's :class:`LakeFileWriter`
:class:`WholeBatchCommitter`   a committer that makes a decided batch visible in ONE commit of
                               its target: it commits a stage with one settle (``commit_handles``)
:class:`LocalCommitMember`     a committer's capability (its ``local_commit()``) to publish a
                               batch inside a local transaction it shares with other members of
                               a sink group (the same database): one instant for all of them
:class:`LakeSink`              a lake sink's executor side: rows or Arrow batches conformed to the
                               table's schema, written by its :class:`LakeFiles`, listed in the
                               handle (:class:`LakeTransaction`, :class:`LakeFileRecord`,
                               :func:`validate_max_file_bytes`)
:class:`LakeCommitter`         a lake sink's driver side: one commit per batch, abort and the
                               listing in doubt by intents; the format gives its proof;
                               :class:`LakeCleanup` names what deletes unreferenced files
                               (``check_addable``)
:func:`conform_table`          Arrow rows in a table's column order and types, NOT NULL checked
:func:`lake_classifier`        a lake sink's classifier: S3 errors by the S3 table, the rest by
                               class (:data:`LAKE_FILE_RULES`, :data:`LAKE_FILE_CONDITIONS`:
                               the file system's and pyarrow's verdicts every lake sink shares)
:func:`lake_iam_policy`        the least-privilege S3 policy of a lake table's prefix
                               (:data:`LAKE_S3_PERMISSIONS`)
:func:`lake_deadline`          the oldest file's creation + the table cleanup's retention
:class:`Secret`                a secret option by reference (``env=`` / ``file=``): what is
                               pickled, logged and shown; :func:`reveal` reads it where used
:func:`scrubbed`               an error table whose errors never show a given secret
:func:`retried_if_rotated`     a step refused its credentials tried once more if their secret
                               was rotated since they were read (:class:`Credentials`; a kept
                               client per settings: :class:`ClientCache`)
=============================  ================================================================

``__all__`` is the kit's public API (the README's kit table lists exactly it; see "Versioning
and deprecations" there and ``CHANGELOG.md``). :class:`CommitsViaCommitter` is a deprecated
shim, kept out of ``__all__``, removed in 0.6.0.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import warnings
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, Literal, TypeVar

from twophase._classify import Classify, classified, transaction_id_reused, transaction_lost
from twophase._handle import (
    NAMESPACE_MAX_LENGTH,
    UNSAFE_IN_NAMESPACE,
    qualified_namespace,
    query_key,
    validate_namespace,
)
from twophase._keyed import (
    DEFAULT_TOMBSTONE_RETENTION_S,
    DELETED_FLAG,
    KEYED,
    TOMBSTONE_TIME_COLUMN,
    Change,
    Keyed,
    is_delete,
    keyed_apply_statements,
    newer_than,
    tombstone_table_name,
    validate_keyed,
)
from twophase._lake import (
    DEFAULT_MAX_FILE_BYTES,
    INTENTS_DIRECTORY,
    LAKE_S3_PERMISSIONS,
    LakeFiles,
    LakeFileStat,
    LakeFileWriter,
    LakeIntents,
    LakeOutput,
    LakeStorage,
    conform_table,
    lake_deadline,
    lake_iam_policy,
    lake_storage,
)
from twophase._lake_sink import (
    LakeCleanup,
    LakeCommitter,
    LakeFileRecord,
    LakeSink,
    LakeTransaction,
    validate_max_file_bytes,
)
from twophase._local_commit import LocalCommitMember
from twophase._rows import INSTANT_TYPE, chunks, rows_of
from twophase._s3 import (
    DEFAULT_S3_MAX_ATTEMPTS,
    S3_OPTIONS,
    S3Checksums,
    S3Errors,
    S3Settings,
    boto_errors,
    split_s3_location,
)
from twophase._secrets import (
    ClientCache,
    Credentials,
    Secret,
    SecretOption,
    retried_if_rotated,
    reveal,
    scrubbed,
)
from twophase._whole_batch import WholeBatchCommitter
from twophase.errors import (
    ConfigurationError,
    FatalError,
    RetryableError,
    SchemaMismatchError,
    TwoPhaseError,
)
from twophase.sink import (
    DEFAULT_COMMIT_PARALLELISM,
    Column,
    Committer,
)

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_COMMIT_PARALLELISM",
    "DEFAULT_MAX_FILE_BYTES",
    "DEFAULT_S3_MAX_ATTEMPTS",
    "DEFAULT_TOMBSTONE_RETENTION_S",
    "DELETED_FLAG",
    "FIX_LAKE_DISK",
    "FIX_LAKE_RETRY",
    "FIX_LAKE_VALUES",
    "INSTANT_TYPE",
    "INTENTS_DIRECTORY",
    "KEYED",
    "LAKE_FILE_CONDITIONS",
    "LAKE_FILE_RULES",
    "LAKE_S3_PERMISSIONS",
    "MODES",
    "S3_OPTIONS",
    "TOMBSTONE_TIME_COLUMN",
    "Change",
    "ClientCache",
    "Condition",
    "ConnectionPool",
    "Credentials",
    "ErrorTable",
    "Keyed",
    "LakeCleanup",
    "LakeCommitter",
    "LakeFileRecord",
    "LakeFileStat",
    "LakeFileWriter",
    "LakeFiles",
    "LakeIntents",
    "LakeOutput",
    "LakeSink",
    "LakeStorage",
    "LakeTransaction",
    "LocalCommitMember",
    "Mode",
    "PooledCommitter",
    "S3Checksums",
    "S3Errors",
    "S3Settings",
    "Secret",
    "SecretOption",
    "TableColumn",
    "WholeBatchCommitter",
    "as_utc",
    "boto_errors",
    "check_columns",
    "chunks",
    "classified",
    "conform_table",
    "is_delete",
    "keyed_apply_statements",
    "lake_classifier",
    "lake_deadline",
    "lake_iam_policy",
    "lake_storage",
    "namespace_from",
    "newer_than",
    "qualified_namespace",
    "query_key",
    "retried_if_rotated",
    "reveal",
    "rows_of",
    "scrubbed",
    "split_s3_location",
    "tombstone_table_name",
    "transaction_id_reused",
    "transaction_lost",
    "validate_chunk_size",
    "validate_keyed",
    "validate_max_file_bytes",
    "validate_mode",
    "validate_namespace",
]

T = TypeVar("T")
C = TypeVar("C")

#: Rows a sink writes per round trip unless told otherwise.
DEFAULT_CHUNK_SIZE = 10_000

Mode = Literal["insert", "upsert", "keyed"]
MODES: tuple[Mode, ...] = ("insert", "upsert", "keyed")

_FIX_UNCLASSIFIED = "fix the cause named above, then restart the query"

#: What an error table maps a code to: the kind of error and the fix an operator can act on.
Verdict = tuple[type[TwoPhaseError], str]


def validate_chunk_size(sink: str, chunk_size: int) -> int:
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ConfigurationError(f"{sink}: chunk_size={chunk_size!r} must be a positive integer.",
                                 fix=f"leave it at {DEFAULT_CHUNK_SIZE} or pass a positive int")
    return chunk_size


def validate_mode(sink: str, mode: str, key: Sequence[str] = (), *,
                  key_required: bool = True) -> Mode:
    """``mode`` if it is one of :data:`MODES` and upsert has the key it needs (the keyed
    mode's own options: :func:`validate_keyed`)."""
    if mode not in MODES:
        raise ConfigurationError(f"{sink}: unknown mode {mode!r}.",
                                 fix="use mode='insert', 'upsert' or 'keyed'")
    if mode in ("upsert", KEYED) and (key_required or mode == KEYED) and not key:
        raise ConfigurationError(f"{sink}: mode={mode!r} needs the key columns.",
                                 fix="pass key=('id',) naming a unique key of the target")
    return next(known for known in MODES if known == mode)


def namespace_from(name: str, fallback: str) -> str:
    """A namespace from a target's name: unsafe characters become ``_``, at most 24 of them."""
    cleaned = UNSAFE_IN_NAMESPACE.sub("_", name)[:NAMESPACE_MAX_LENGTH]
    return cleaned or fallback


@dataclass(frozen=True)
class Condition:
    """One meaning of a code that covers several: the verdict when the error's message
    contains ``text`` (case-insensitive). PostgreSQL's 55000 is "prepared transaction is busy"
    (retryable) and "prepared transactions are disabled" (a configuration error)."""

    text: str
    verdict: Verdict

    def matches(self, message: str) -> bool:
        return self.text.lower() in message.lower()


@dataclass(frozen=True)
class ErrorTable:
    """A system's error codes classified once, in one place (as Flink's ``XaFacade`` does).

    A code's verdict (the kind of error and the fix) is looked up in this order:

    1. ``conditions[code]``: the first :class:`Condition` whose text the message contains;
    2. ``rules[code]``: the code itself (a server error number, an SQLite error name, an HTTP
       status, a SQLSTATE);
    3. ``classes``: the longest key that the code's text starts with (a SQLSTATE class such
       as ``"23"`` integrity or ``"08"`` connection);
    4. ``default``: fatal, so that nothing is retried blindly.

    :meth:`error` words the result the same way for every sink.
    """

    system: str
    rules: Mapping[Hashable, Verdict]
    default: Verdict = field(default=(FatalError, _FIX_UNCLASSIFIED))
    classes: Mapping[str, Verdict] = field(default_factory=dict)
    conditions: Mapping[Hashable, Sequence[Condition]] = field(default_factory=dict)

    def verdict(self, code: Hashable, message: str = "") -> Verdict:
        for condition in self.conditions.get(code, ()):
            if condition.matches(message):
                return condition.verdict
        if code in self.rules:
            return self.rules[code]
        text = str(code) if code is not None else ""
        prefixes = [prefix for prefix in self.classes if prefix and text.startswith(prefix)]
        if prefixes:
            return self.classes[max(prefixes, key=len)]
        return self.default

    def class_code(self, exc: BaseException) -> str:
        """The most specific class name of ``exc`` (along its MRO) that the table has a rule
        or a condition for; else its own class name. For systems whose errors are classes."""
        for kind in type(exc).__mro__:
            if kind.__name__ in self.rules or kind.__name__ in self.conditions:
                return kind.__name__
        return type(exc).__name__

    def error_of(self, exc: BaseException, what: str) -> TwoPhaseError:
        """:meth:`error` for an exception classified by its class (:meth:`class_code`), its
        message's first line as the detail."""
        code = self.class_code(exc)
        message = (str(exc).strip() or type(exc).__name__).splitlines()[0]
        return self.error(code, what, f"[{code}] {message}")

    def error(self, code: Hashable, what: str, detail: str) -> TwoPhaseError:
        """The verdict for ``code`` (conditions read in ``detail``) as an error naming the
        system, the step that failed and the system's own message."""
        kind, fix = self.verdict(code, detail)
        return kind(f"{self.system}: {what} failed: {_sentence(detail)}", fix=fix)


def _sentence(detail: str) -> str:
    """A driver's message as the end of a sentence: one period, none after a multi-line text
    (which ends where the driver's own last line does)."""
    text = detail.strip()
    if not text or "\n" in text:
        return text or "(no message)."
    return text if text.endswith((".", "!", "?")) else f"{text}."


def as_utc(moment: datetime) -> datetime:
    """``moment`` as an aware datetime in UTC. An aware one (a Spark TIMESTAMP, an instant) is
    converted; a naive one (a TIMESTAMP_NTZ, a wall clock) is never read as the process's local
    time: its wall clock is taken as UTC, which is how the prebuilt sinks store it."""
    if moment.utcoffset() is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


class ConnectionPool(Generic[C]):
    """Connections that one committer's threads share: each is lent to one thread at a time.

    The driver commits a batch's handles from up to ``commit_parallelism`` threads through one
    committer; with a pool, a batch of N handles opens about ``min(N, commit_parallelism)``
    connections instead of N. A connection goes back only if the block that borrowed it ended
    without an error (an error may leave a transaction open or the connection broken: it is
    closed), at most ``max_idle`` are kept, and none is lent again after ``max_idle_s`` idle
    (the server may have ended it) or once ``usable`` says it is closed. Thread-safe::

        pool = ConnectionPool(server.connect, close=close_quietly, usable=lambda c: not c.closed)
        with pool.connection() as conn:
            ...
        pool.close()
    """

    def __init__(self, connect: Callable[[], C], *, close: Callable[[C], None],
                 usable: Callable[[C], bool] = lambda _conn: True,
                 max_idle: int = DEFAULT_COMMIT_PARALLELISM,
                 max_idle_s: float | None = None) -> None:
        self._connect, self._close_one, self._usable = connect, close, usable
        self._max_idle, self._max_idle_s = max_idle, max_idle_s
        self._idle: list[tuple[C, float]] = []
        self._lock = threading.Lock()
        self._closed = False

    @contextlib.contextmanager
    def connection(self) -> Iterator[C]:
        """A connection of the pool (or a new one) for the block; given back if it ends well."""
        conn = self._take()
        if conn is None:
            conn = self._connect()
        try:
            yield conn
        except BaseException:
            self._close_one(conn)
            raise
        self._give_back(conn)

    def close(self) -> None:
        """Close every idle connection; connections lent now are closed when given back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn, _since in idle:
            self._close_one(conn)

    def _take(self) -> C | None:
        stale = []
        try:
            with self._lock:
                while self._idle:
                    conn, since = self._idle.pop()
                    if self._usable(conn) and (self._max_idle_s is None
                                               or time.monotonic() - since < self._max_idle_s):
                        return conn
                    stale.append(conn)
            return None
        finally:
            for conn in stale:
                self._close_one(conn)

    def _give_back(self, conn: C) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle and self._usable(conn):
                self._idle.append((conn, time.monotonic()))
                return
        self._close_one(conn)


class PooledCommitter(Committer, Generic[C]):
    """A committer whose threads borrow sessions of one :class:`ConnectionPool`, any error in
    a session classified by the sink's ``classify`` naming the step (``where(what)``)::

        class MyCommitter(PooledCommitter[Connection]):
            def __init__(self, sink):
                super().__init__(sink, sink.server.pool(sink.commit_parallelism), classify,
                                 driver.Error, sink.server.on)

            def commit(self, handle):
                with self.session(f"commit of {handle.txn_id}") as conn:
                    ...
    """

    def __init__(self, sink: Any, pool: ConnectionPool[C], classify: Classify,
                 errors: type[BaseException] | tuple[type[BaseException], ...],
                 where: Callable[[str], str] = lambda what: what) -> None:
        super().__init__(sink)
        self._pool, self._classify, self._errors, self._where = pool, classify, errors, where

    @contextlib.contextmanager
    def session(self, what: str) -> Iterator[C]:
        """A pooled session for one step; errors inside are classified."""
        with classified(self._classify, self._where(what), self._errors), \
                self._pool.connection() as conn:
            yield conn

    def close(self) -> None:
        self._pool.close()


@dataclass(frozen=True)
class TableColumn:
    """A column of the target as its catalog describes it, for :func:`check_columns`.

    ``required``: NOT NULL without a default (nor generated, nor auto-increment): an insert
    must write it. ``zoned``: whether the column keeps an instant's time zone (``timestamptz``)
    or not (``timestamp``); None where it does not apply or the sink stores instants in UTC
    wall-clock time by design.
    """

    name: str
    required: bool = False
    zoned: bool | None = None


def check_columns(where: str, table: Sequence[TableColumn], written: Sequence[Column], *,
                  upsert_key: Sequence[str] | None = None,
                  unique_keys: Sequence[Sequence[str]] = (),
                  case_sensitive: bool = True) -> None:
    """The column checks of ``check_schema``, in one wording for every sink.

    Refuses with :class:`SchemaMismatchError`: a target without columns (it does not exist),
    a written column the target lacks, a required column (NOT NULL without default) the rows
    lack, an instant (Spark ``TIMESTAMP``) written into a column that keeps no time zone, and,
    when ``upsert_key`` is given (upsert mode), a key that is no unique key of the target.
    ``upsert_key=()`` asks for any unique key made only of written columns (a sink that
    updates on whichever key the target has). ``where`` names the target ("table x of ...").
    """
    def same(name: str) -> str:
        return name if case_sensitive else name.lower()

    if not table:
        raise SchemaMismatchError(f"{where} does not exist.",
                                  fix="create it before starting the query, or fix its name")
    existing = {same(column.name): column for column in table}
    if missing := [c.name for c in written if same(c.name) not in existing]:
        raise SchemaMismatchError(
            f"{where} has no column {', '.join(map(repr, missing))} (its columns: "
            f"{', '.join(column.name for column in table)}).",
            fix="ALTER TABLE ... ADD COLUMN the missing columns, or select/rename them in "
            "the DataFrame")
    given = {same(c.name) for c in written}
    if required := [c.name for c in table if c.required and same(c.name) not in given]:
        raise SchemaMismatchError(
            f"{where} requires column {', '.join(map(repr, required))} (NOT NULL without "
            "default), which the rows do not have.",
            fix="add the column to the DataFrame, or give it a default in the table")
    if naive := [c.name for c in written
                 if c.type == INSTANT_TYPE and existing[same(c.name)].zoned is False]:
        raise SchemaMismatchError(
            f"{where}: column {', '.join(map(repr, naive))} keeps no time zone, but the rows "
            "hold instants (Spark TIMESTAMP) there.",
            fix="make the column zoned (PostgreSQL: timestamptz), or cast the values to "
            "timestamp_ntz (wall-clock values) in the DataFrame")
    if upsert_key is not None:
        _check_upsert_key(where, [c.name for c in written], upsert_key, unique_keys, same)


def _check_upsert_key(where: str, written: Sequence[str], upsert_key: Sequence[str],
                      unique_keys: Sequence[Sequence[str]], same: Callable[[str], str]) -> None:
    keys = [{same(name) for name in key} for key in unique_keys]
    if upsert_key:
        wanted = {same(name) for name in upsert_key}
        if wanted in keys and wanted <= {same(name) for name in written}:
            return
        problem = f"the upsert key {list(upsert_key)} is not a PRIMARY or UNIQUE key"
    elif any(key <= {same(name) for name in written} for key in keys):
        return
    else:
        problem = "mode='upsert' needs a PRIMARY or UNIQUE key"
    raise SchemaMismatchError(
        f"{where}: {problem} made of written columns; its unique keys: "
        f"{sorted(sorted(key) for key in keys) or 'none'}.",
        fix="write the key columns, create a unique index on the key, or use mode='insert'")


#: What a lake sink's own file work raises, the same for every format: the file system (a
#: local disk, pyarrow's) and pyarrow's value errors. A lake sink's :class:`ErrorTable` takes
#: them with its own (``rules={**LAKE_FILE_RULES, ...}``, ``conditions={**LAKE_FILE_CONDITIONS,
#: ...}``).
FIX_LAKE_RETRY = "retried automatically; if it persists, check the table's storage"
FIX_LAKE_VALUES = "cast the column in the query to the table's type, or fix the table's schema"
FIX_LAKE_DISK = "free space on (or grant write access to) the table's storage, then restart"
LAKE_FILE_RULES: Mapping[Hashable, Verdict] = {
    "OSError": (RetryableError, FIX_LAKE_RETRY),
    "FileNotFoundError": (RetryableError, FIX_LAKE_RETRY),
    "ArrowInvalid": (SchemaMismatchError, FIX_LAKE_VALUES),
    "ArrowTypeError": (SchemaMismatchError, FIX_LAKE_VALUES),
    "ArrowNotImplementedError": (SchemaMismatchError, FIX_LAKE_VALUES),
}
LAKE_FILE_CONDITIONS: Mapping[Hashable, Sequence[Condition]] = {
    "OSError": (Condition("No space left", (ConfigurationError, FIX_LAKE_DISK)),
                Condition("Permission denied", (ConfigurationError, FIX_LAKE_DISK))),
}


def lake_classifier(errors: ErrorTable, s3_errors: S3Errors) -> Classify:
    """A lake sink's classifier: a boto3 error (a table on S3) by the S3 table, anything else
    by its class in ``errors`` (:meth:`ErrorTable.error_of`)."""

    def classify(exc: BaseException, what: str) -> TwoPhaseError:
        if type(exc).__module__.startswith("botocore"):
            return s3_errors.classify(exc, what)
        return errors.error_of(exc, what)

    return classify


# -- deprecated: removed in 0.6.0 (see CHANGELOG.md) ------------------------------------------

#: What the shim says when a class lists it among its bases.
COMMITS_VIA_COMMITTER_DEPRECATED = (
    "twophase.kit.CommitsViaCommitter is deprecated since 0.2.0 and is removed in 0.6.0: "
    "remove it from {name}'s bases; nothing replaces it. TwoPhaseCommitSink itself now runs "
    "sink.commit(handle) and sink.abort(handle) through the Committer your committer() "
    "returns (keep commit/abort in that Committer, off the sink)."
)


class CommitsViaCommitter:
    """Deprecated (0.1.0's base for a sink whose committer does the work); removed in 0.6.0.

    Since 0.2.0 :class:`~twophase.TwoPhaseCommitSink` itself runs ``sink.commit(handle)`` and
    ``sink.abort(handle)`` through the :class:`~twophase.Committer` that ``committer()``
    returns. This shim only keeps a sink written to 0.1.0's README importable: it defines
    nothing (a sink with both ``commit`` and ``committer()`` is refused) and warns, with a
    :class:`DeprecationWarning` naming the fix, when a class lists it among its bases.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if CommitsViaCommitter in cls.__bases__:
            warnings.warn(COMMITS_VIA_COMMITTER_DEPRECATED.format(name=cls.__qualname__),
                          DeprecationWarning, stacklevel=_class_statement_level())


#: Modules whose frames sit between a ``class`` statement and ``__init_subclass__``.
_CLASS_MACHINERY = frozenset({__name__, "abc", "typing", "twophase.sink"})


def _class_statement_level() -> int:
    """The ``stacklevel`` of the ``class`` statement that runs the caller's
    ``__init_subclass__`` (under ``ABCMeta`` and ``Generic`` the frames in between vary)."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_globals.get("__name__") in _CLASS_MACHINERY:
        frame, level = frame.f_back, level + 1
    return level
