"""The sink kit: what every sink needs and only its system's parts differ.

A new sink writes its phases and one error table; the rest comes from here:

=============================  ================================================================
piece                          what it does
=============================  ================================================================
:func:`chunks`                 groups rows into lists of at most ``chunk_size`` (bounded memory)
:func:`validate_chunk_size`    the option check every chunking sink makes
:func:`validate_mode`          ``mode="insert"`` / ``"upsert"`` and the ``key`` upsert needs
:func:`namespace_from`         a default namespace from a target's name (table, topic, prefix)
:class:`ErrorTable`            system error code -> retryable / fatal / config / schema + fix
:func:`classified`             a context manager that raises the table's verdict
:func:`transaction_lost`       the one wording of "a decided transaction is gone"
:func:`transaction_id_reused`  the one wording of "this id was already committed"
:func:`as_utc`                 an instant in UTC; a naive datetime is a wall clock, read as UTC
:class:`CommitsViaCommitter`   ``commit``/``abort`` of one handle through a fresh committer,
                               for a sink whose :class:`~twophase.Committer` does the work
=============================  ================================================================
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import islice
from typing import Literal, TypeVar

from twophase._handle import NAMESPACE_MAX_LENGTH, Handle, TxnId
from twophase.errors import (
    ConfigurationError,
    FatalError,
    TransactionLostError,
    TwoPhaseError,
)
from twophase.sink import AbortOutcome, CommitOutcome, Committer

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "MODES",
    "CommitsViaCommitter",
    "ErrorTable",
    "Mode",
    "as_utc",
    "chunks",
    "classified",
    "namespace_from",
    "split_s3_location",
    "transaction_id_reused",
    "transaction_lost",
    "validate_chunk_size",
    "validate_mode",
]

T = TypeVar("T")

#: Rows a sink writes per round trip unless told otherwise.
DEFAULT_CHUNK_SIZE = 10_000

Mode = Literal["insert", "upsert"]
MODES: tuple[Mode, ...] = ("insert", "upsert")

_UNSAFE_IN_NAMESPACE = re.compile(r"[^A-Za-z0-9_-]")
_FIX_UNCLASSIFIED = "fix the cause named above, then restart the query"

#: What an error table maps a code to: the kind of error and the fix an operator can act on.
Verdict = tuple[type[TwoPhaseError], str]
#: A sink's single classification function: a system error and the step it broke -> verdict.
Classify = Callable[[BaseException, str], TwoPhaseError]


def chunks(rows: Iterable[T], chunk_size: int) -> Iterator[list[T]]:
    """``rows`` in lists of at most ``chunk_size``, read lazily (memory: one chunk)."""
    iterator = iter(rows)
    while chunk := list(islice(iterator, chunk_size)):
        yield chunk


def validate_chunk_size(sink: str, chunk_size: int) -> int:
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ConfigurationError(f"{sink}: chunk_size={chunk_size!r} must be a positive integer.",
                                 fix=f"leave it at {DEFAULT_CHUNK_SIZE} or pass a positive int")
    return chunk_size


def validate_mode(sink: str, mode: str, key: Sequence[str] = (), *,
                  key_required: bool = True) -> Mode:
    """``mode`` if it is one of :data:`MODES` and upsert has the key it needs."""
    if mode not in MODES:
        raise ConfigurationError(f"{sink}: unknown mode {mode!r}.",
                                 fix="use mode='insert' or mode='upsert'")
    if mode == "upsert" and key_required and not key:
        raise ConfigurationError(f"{sink}: mode='upsert' needs the key columns.",
                                 fix="pass key=('id',) naming a unique key of the target")
    return "upsert" if mode == "upsert" else "insert"


def namespace_from(name: str, fallback: str) -> str:
    """A namespace from a target's name: unsafe characters become ``_``, at most 24 of them."""
    cleaned = _UNSAFE_IN_NAMESPACE.sub("_", name)[:NAMESPACE_MAX_LENGTH]
    return cleaned or fallback


@dataclass(frozen=True)
class ErrorTable:
    """A system's error codes classified once, in one place (as Flink's ``XaFacade`` does).

    ``rules`` maps a code (a server error number, an SQLite error name, an HTTP status) to the
    kind of error and the fix; a code not in it gets ``default``: fatal, so that nothing is
    retried blindly. :meth:`error` words the result the same way for every sink.
    """

    system: str
    rules: Mapping[Hashable, Verdict]
    default: Verdict = field(default=(FatalError, _FIX_UNCLASSIFIED))

    def verdict(self, code: Hashable) -> Verdict:
        return self.rules.get(code, self.default)

    def error(self, code: Hashable, what: str, detail: str) -> TwoPhaseError:
        kind, fix = self.verdict(code)
        return kind(f"{self.system}: {what} failed: {detail}.", fix=fix)


@contextlib.contextmanager
def classified(classify: Classify, what: str,
               errors: type[BaseException] | tuple[type[BaseException], ...] = Exception,
               ) -> Iterator[None]:
    """Raise ``classify(exc, what)`` for a system error ``exc`` of ``errors`` in the block.

    Errors of twophase's own taxonomy pass through unchanged.
    """
    try:
        yield
    except TwoPhaseError:
        raise
    except errors as exc:
        raise classify(exc, what) from exc


def transaction_lost(handle: Handle, *, where: str, why: str) -> TransactionLostError:
    """A decided transaction is neither committable nor provably committed in ``where``."""
    txn = handle.txn_id
    return TransactionLostError(
        f"transaction {txn} ({handle.rows} rows of batch {txn.batch}, partition "
        f"{txn.partition}) was decided, but {where} can neither commit it nor prove it "
        f"committed: {why}. Its rows may be missing there.",
        fix=f"look for the rows of batch {txn.batch} in {where}; if they are missing, "
        "re-deliver them from the source, then run `python -m twophase.cleanup --state "
        f"<state location> --forget-batch {txn.batch}`",
    )


def transaction_id_reused(txn_id: TxnId, *, where: str) -> FatalError:
    """``pre_commit`` of an id that ``where`` has already committed once."""
    return FatalError(
        f"transaction id {txn_id} was already committed once in {where}; committing it again "
        "would silently drop these rows (a state file restored from an older backup?).",
        fix="restart the query: a new run opens its transactions under a new epoch",
    )


def as_utc(moment: datetime) -> datetime:
    """``moment`` as an aware datetime in UTC. An aware one (a Spark TIMESTAMP, an instant) is
    converted; a naive one (a TIMESTAMP_NTZ, a wall clock) is never read as the process's local
    time: its wall clock is taken as UTC, which is how the prebuilt sinks store it."""
    if moment.utcoffset() is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def split_s3_location(location: str, *, named: str, fix: str) -> tuple[str, str]:
    """The bucket and the rest (the key or prefix, as given) of ``s3://bucket/rest`` (or
    ``s3a://``); a location without a bucket is a ConfigurationError naming it as ``named``."""
    bucket, _, rest = location.split("://", 1)[1].partition("/")
    if not bucket:
        raise ConfigurationError(f"{named} {location!r} names no bucket.", fix=fix)
    return bucket, rest


class CommitsViaCommitter:
    """For a sink whose committer does the work (a pool, a producer, a session): ``commit``
    and ``abort`` of a single handle open a committer, use it and close it. List it before
    :class:`~twophase.TwoPhaseCommitSink` among the bases."""

    def committer(self) -> Committer:
        raise NotImplementedError("a sink using CommitsViaCommitter returns its committer")

    def commit(self, handle: Handle) -> CommitOutcome:
        with self.committer() as committer:
            return committer.commit(handle)

    def abort(self, handle: Handle) -> AbortOutcome:
        with self.committer() as committer:
            return committer.abort(handle)
