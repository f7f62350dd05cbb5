"""The contract every sink implements: :class:`TwoPhaseCommitSink`.

A sink turns "these rows, from this partition of this micro-batch" into one transaction of an
external system, in two steps that Flink's ``TwoPhaseCommitSinkFunction`` made familiar:

=========================  ========  ==========================================================
method                     runs on   meaning
=========================  ========  ==========================================================
``check_schema(columns)``  driver    refuse, before anything is written, rows that cannot fit
``begin_transaction(ctx)`` executor  open a fresh, isolated transaction named ``ctx.txn_id``
``write(txn, rows)``       executor  write rows through the open transaction
``pre_commit(txn)``        executor  flush: durable but NOT visible; return a :class:`Handle`
``discard(txn)``           executor  release a transaction that will never be pre-committed
``fence(ns, query, epoch)`` driver   optional: claim the run's epoch in the external system
``commit(handle)``         driver    make it visible; idempotent
``abort(handle)``          driver    throw it away; idempotent
``list_in_doubt(ns)``      driver    pre-committed transactions of a namespace, not yet resolved
=========================  ========  ==========================================================

``commit`` and ``abort`` may be called from a different process than the one that wrote, any
number of times, also after a crash of either side. ``commit`` must tell "I made it visible"
(:attr:`CommitOutcome.COMMITTED`) from "it was already visible"
(:attr:`CommitOutcome.ALREADY_COMMITTED`), and must raise :class:`TransactionLostError` when it
can prove neither: that is the one case where rows may be lost, and it must never pass silently.

A sink object is configuration: it is pickled to executors, so keep connections out of it and
open them in ``begin_transaction``/``commit``. Raise the errors of :mod:`twophase.errors`;
anything else is treated as fatal.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Generic, TypeVar

from twophase._handle import Handle, TxnId
from twophase.errors import ConfigurationError

DEFAULT_COMMIT_PARALLELISM = 8

TxnT = TypeVar("TxnT")


class CommitOutcome(enum.Enum):
    COMMITTED = "committed"
    ALREADY_COMMITTED = "already_committed"


class AbortOutcome(enum.Enum):
    ABORTED = "aborted"
    NOT_FOUND = "not_found"  # never prepared, already aborted, or gone: nothing to do


@dataclass(frozen=True)
class Column:
    """A column of the rows given to ``write``: name, Spark SQL type string, nullability."""

    name: str
    type: str
    nullable: bool = True


@dataclass(frozen=True)
class TransactionContext:
    """Everything a sink may need to open a transaction for one partition of one batch."""

    txn_id: TxnId
    columns: tuple[Column, ...]

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(column.name for column in self.columns)


class TwoPhaseCommitSink(ABC, Generic[TxnT]):
    """Base class of every sink; subclass it for your own system (see ``sinks.sqlite``)."""

    #: Stamped into every handle; ``commit``/``abort`` refuse handles of another kind.
    kind: ClassVar[str]
    #: How many handles of one batch the driver commits at once.
    commit_parallelism: ClassVar[int] = DEFAULT_COMMIT_PARALLELISM

    def default_namespace(self) -> str:
        """The namespace used when the job names none (e.g. derived from the target's name)."""
        return self.kind

    def check_schema(self, columns: Sequence[Column]) -> None:
        """Raise :class:`SchemaMismatchError` if rows of these columns cannot be written."""

    @abstractmethod
    def begin_transaction(self, ctx: TransactionContext) -> TxnT: ...

    @abstractmethod
    def write(self, txn: TxnT, rows: Iterable[Sequence[Any]]) -> None:
        """Write rows (sequences in the order of ``ctx.columns``) through the transaction."""

    @abstractmethod
    def pre_commit(self, txn: TxnT) -> Handle:
        """Make the transaction durable and invisible, release its resources, return its handle."""

    def fence(self, namespace: str, query_id: str, epoch: int) -> None:
        """Claim ``epoch`` for the query in the external system, if it can fence (optional).

        The driver calls it before its first commit or sweep in a process. Raise
        :class:`FencedError` if a newer epoch has claimed the query: then ``commit`` must refuse
        this run's commits. The state file fences zombie runs anyway; a sink fences again where
        a zombie on another host might otherwise still commit (see ``sinks.mysql``).
        """

    def discard(self, txn: TxnT) -> None:
        """Release a transaction that failed before ``pre_commit``; must not raise."""

    @abstractmethod
    def commit(self, handle: Handle) -> CommitOutcome: ...

    @abstractmethod
    def abort(self, handle: Handle) -> AbortOutcome: ...

    @abstractmethod
    def list_in_doubt(self, namespace: str) -> list[Handle]:
        """Handles of every pre-committed, unresolved transaction whose id is in ``namespace``."""

    def purge_commit_records(self, namespace: str, older_than: datetime) -> int:
        """Forget proofs of commit older than ``older_than``; return how many (for cleanup)."""
        return 0

    def handle(self, txn_id: TxnId, rows: int, **data: Any) -> Handle:
        """Build a handle of this sink's kind."""
        return Handle(txn_id=txn_id, sink=self.kind, rows=rows, data=data)

    def require_own(self, handle: Handle) -> None:
        """Refuse a handle written by another kind of sink (a misconfigured job or cleanup)."""
        if handle.sink != self.kind:
            raise ConfigurationError(
                f"handle of transaction {handle.txn_id} was written by a {handle.sink!r} sink, "
                f"but this is a {self.kind!r} sink.",
                fix="point the job or cleanup at the sink the state file was written with",
            )
