"""The contract every sink implements: :class:`TwoPhaseCommitSink`.

A sink turns "these rows, from this partition of this micro-batch" into one transaction of an
external system, in two steps that Flink's ``TwoPhaseCommitSinkFunction`` made familiar:

===========================  ========  ========================================================
method                       runs on   meaning
===========================  ========  ========================================================
``check_schema(columns)``    driver    optional: refuse, before anything is written, rows that
                                       cannot fit (a missing column, an unusable type)
``begin_transaction(ctx)``   executor  open a fresh, isolated transaction named ``ctx.txn_id``
``write(txn, rows)``         executor  write rows through the open transaction
``write_arrow(txn, batches)`` executor optional: the same from Arrow record batches (default:
                                       converts them to rows and calls ``write``)
``pre_commit(txn)``          executor  flush: durable but NOT visible; return a :class:`Handle`
``discard(txn)``             executor  optional: release a transaction that failed before
                                       ``pre_commit`` (must not raise)
``committer()``              any       optional: the driver side in one process (default: a
                                       :class:`Committer` forwarding to the methods below)
``fence(ns, query, epoch)``  driver    optional: claim the run's epoch in the external system
``commit(handle)``           driver    make it visible; idempotent
``abort(handle)``            driver    throw it away; idempotent
``list_in_doubt(ns)``        driver    required: this namespace's transactions not yet resolved
``commit_deadline(handle)``  driver    optional: when a pre-committed transaction may expire
``check_committable(handles)`` driver  optional: raise if the system cannot commit them now
                                       (a pre-commit that never reached it: its server down)
``purge_commit_records``     cron      optional: forget old proofs of commit
``finish_batch(ns, batch, …)`` driver  optional, on a committer subclass: once a batch is all
                                       committed, publish it as a whole (a manifest)
===========================  ========  ========================================================

The sink writes; the committer is everything the driver does. The framework calls every
method below ``committer()`` through the committer, never on the sink. A simple sink writes
them on the sink and the default committer forwards each to the sink's method of the same
name, in that one direction; a sink with a committer of its own implements them there (every
prebuilt sink does: its sink keeps only what executors and configuration need), and any it
leaves out falls to the default's forwarding (see "Where commit and abort live"). Executors
use a committer too, to abort what a failed task attempt left. Calling ``commit``, ``abort``
or a method a prebuilt sink moved into its committer on such a sink still answers, through a
committer of its own, with a :class:`DeprecationWarning` (until 0.6.0).

The rules, as a sink author needs them:

* **Rows.** ``write`` gets an iterable of tuples in the order of ``ctx.columns``, with these
  Python types (the same on the data source and the ``foreachBatch`` path, whatever the
  workers' ``TZ`` and ``spark.sql.session.timeZone``):

  ====================================  =====================================================
  Spark type                            Python value (``None`` for NULL, in every type)
  ====================================  =====================================================
  BOOLEAN                               ``bool``
  TINYINT, SMALLINT, INT, BIGINT        ``int``
  FLOAT, DOUBLE                         ``float``
  DECIMAL(p, s)                         ``decimal.Decimal``
  STRING                                ``str``
  BINARY                                ``bytes``
  DATE                                  ``datetime.date``
  TIMESTAMP                             aware ``datetime`` with ``tzinfo=UTC``: an instant
  TIMESTAMP_NTZ                         naive ``datetime``: a wall-clock value, no zone
  ARRAY, MAP, STRUCT                    ``list``, ``dict``, ``dict`` (nested TIMESTAMPs aware)
  INTERVAL DAY TO SECOND                ``datetime.timedelta``
  ====================================  =====================================================

  Store an instant as an instant: a database session in a fixed zone (UTC), never the
  server's or the worker's local time. ``write_arrow`` gets ``pyarrow.RecordBatch`` es whose
  top-level TIMESTAMP columns are ``timestamp[us, tz=UTC]``.
* **write** is called once per transaction with every row of the partition (possibly none);
  a sink that buffers must bound its memory itself (write chunks as they fill).
* **Transaction ids** (:class:`TxnId`): ``str(txn_id)`` is
  ``namespace.query.epoch.batch.partition.attempt.created``, at most ``TXN_ID_MAX_LENGTH``
  (92) characters of ``[A-Za-z0-9_.-]``; ``TxnId.parse`` reads it back;
  ``txn_id.global_part`` (at most 59 characters) and ``txn_id.branch_part`` split it for
  systems with short id fields. A
  transaction id is used once: ``pre_commit`` of an id the system has already committed must
  raise (a state file restored from a backup would otherwise drop rows silently).
* **Where errors are retried.** On executors, ``begin_transaction`` is retried on
  :class:`RetryableError` (bounded, with backoff): nothing exists yet. An error in ``write`` or
  ``pre_commit`` discards the transaction and fails the task; Spark retries the task
  (``spark.task.maxFailures``: 1 in local mode, 4 on a cluster) or the query stops, and the
  driver aborts every transaction of the batch. On the driver, ``commit``, ``abort`` and
  ``fence`` are retried on :class:`RetryableError`. Anything not a :class:`TwoPhaseError` is
  fatal, and so is a retryable error after the last attempt.
* **commit and abort** run in the driver or any later process (recovery, cleanup), any number
  of times, after a crash of either side, and **concurrently on one sink object** (up to
  ``commit_parallelism`` threads): keep no per-call state on ``self`` (a committer shares
  connections between those threads through :class:`twophase.kit.sql.ConnectionPool`).
  ``commit`` returns COMMITTED or ALREADY_COMMITTED, and must *prove* the latter (a commit
  record, a marker row, object metadata, a replayed response); when it can prove neither it
  raises :class:`TransactionLostError`. ``abort`` of something unknown returns NOT_FOUND.
* **list_in_doubt** returns every transaction of the namespace that the system still holds
  and that is not resolved: the pre-committed ones *and* those begun but never pre-committed
  that outlive their writer (staged rows, an open upload). A begun transaction that the system
  itself ends with its writer's session (a database rolls back an unprepared transaction when
  the connection ends: PostgreSQL, MySQL XA) is not listed, and neither is one the system
  cannot name by id (PostgreSQL's ``application_name`` holds 63 bytes, an id up to 92): such a
  sink bounds how long a writer's session can outlive its host (an idle timeout on the
  session) and says so in its docstring. Handles carry the id and, where known, the row count
  (0 otherwise); ``abort`` must accept them.
* **Orphans hold locks.** Until the driver's sweep (at the next batch, at the next start, or
  cleanup) aborts it, the transaction of a failed task attempt or a crashed run may hold row
  locks in a database: bound your lock waits (a lock-wait timeout raised as
  :class:`RetryableError`) so a writer blocked on one fails with a message, not a hang.
* **Proofs of commit** that ``commit`` reads to answer ALREADY_COMMITTED name the transaction
  id. ``purge_commit_records(ns, older_than)`` may drop a proof only if its transaction
  *committed* before ``older_than`` (the cleanup's retention: by then every batch referencing
  it is done). A proof written inside the transaction (a marker row) cannot know when it will
  commit: stamp the commit time when ``commit`` (or a repeated commit that proved it) returns,
  purge by that stamp, and never purge an unstamped one. Never purge by write time: a batch
  may be decided long before it is committed (a driver down for a day).
* **Optional methods.** ``check_schema``: implement it whenever the target has a schema.
  ``discard``: when ``begin_transaction`` acquires something (a connection, an upload).
  ``default_namespace``: derive it from the target (table, topic, prefix) so two sinks of one
  job do not share a namespace. ``committer``: when committing wants a connection, producer
  or session shared by a batch's handles, or state that must not be pickled (see "Where
  commit and abort live"). ``fence``: when
  a zombie run on another host could still reach the system between its last state check and
  its commit. ``Committer.finish_batch``: when readers want a batch at once (a manifest, a
  log of committed files); it runs after the batch's last commit, before the batch is marked
  done, so after a crash it runs again: make it idempotent. ``purge_commit_records``:
  when proofs of commit accumulate. ``commit_parallelism``: 1 for a system with one writer.

**Where commit and abort live: in one place.** A simple sink implements ``commit`` and
``abort`` (and any optional driver-side method) on the sink (the docs' example,
``tests/user_sink.py``); the framework reaches them through the default :class:`Committer`,
which forwards to them. A sink whose commits share something per batch (a connection pool, a
producer, a session) implements them in a :class:`Committer` subclass that ``committer()``
returns, and leaves ``commit``/``abort`` off the sink (``sinks.sqlite``, every prebuilt sink,
whose committers also list in doubt, purge, fence and gate). A caller of ``sink.commit(handle)``
on such a sink gets it run through a committer of its own (opened, used, closed), with a
:class:`DeprecationWarning` (until 0.6.0): call ``sink.committer()`` instead. Never both: a class
that defines ``commit`` or ``abort`` *and* ``committer`` is refused when it is defined (a
subclass of a prebuilt sink that overrides ``commit`` would otherwise be bypassed by its
committer); one that defines neither is refused when it is built, and so is a simple sink
without ``list_in_doubt`` (a sink with a committer that lists nothing in doubt in either place
raises :class:`~twophase.errors.ConfigurationError` at its first listing, the query's start:
never an empty listing). The driver checks that each
handle is of this sink's ``kind`` before it commits or aborts it.

A sink object is configuration: it is pickled to executors, so keep connections out of it and
open them in ``begin_transaction``/``commit``. Raise the errors of :mod:`twophase.errors` with a
message that names the cause and the fix.
"""

from __future__ import annotations

import enum
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, Self, TypeVar

from twophase._handle import Handle, TxnId
from twophase._rows import rows_of
from twophase.errors import ConfigurationError

if TYPE_CHECKING:
    import pyarrow as pa

DEFAULT_COMMIT_PARALLELISM = 8

TxnT = TypeVar("TxnT")
#: Where a sink class commits and aborts (:attr:`TwoPhaseCommitSink.commits_on`).
CommitHome = Literal["sink", "committer"]


class CommitOutcome(enum.Enum):
    COMMITTED = "committed"
    ALREADY_COMMITTED = "already_committed"


class AbortOutcome(enum.Enum):
    ABORTED = "aborted"
    NOT_FOUND = "not_found"  # never prepared, already aborted, or gone: nothing to do


@dataclass(frozen=True)
class Column:
    """A column of the rows given to ``write``: name, type, nullability.

    ``type`` is Spark's ``DataType.simpleString()``: ``boolean``, ``tinyint``, ``smallint``,
    ``int``, ``bigint``, ``float``, ``double``, ``decimal(12,3)``, ``string``, ``binary``,
    ``date``, ``timestamp`` (an instant; :data:`twophase.kit.INSTANT_TYPE`), ``timestamp_ntz``
    (a wall clock), ``array<int>``, ``map<string,int>``, ``struct<a:int,b:string>``, ...
    """

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


@dataclass(frozen=True)
class CommitStage:
    """Handles that commit together through one committer, after every earlier stage.

    A sink's batch is one stage; a sink group's, one per member in commit order, each with
    that member's committer and its own handles. ``label`` names the stage in errors and
    metrics (a group's member name; None for a single sink).
    """

    committer: Committer
    handles: tuple[Handle, ...]
    parallelism: int
    label: str | None = None


@dataclass(frozen=True)
class StageCommits:
    """How the handles of one commit stage are committed, given to
    :meth:`Committer.commit_handles` by its caller: this plain one commits in turn, once each;
    the coordinator's commits the first handle alone, passes the ``mid_commit`` crash point,
    then the rest in parallel, each retried and counted.

    A committer that makes a stage visible handle by handle (the default) calls
    :meth:`one_by_one`; one that makes it visible in ONE commit of its target (a lake table's
    snapshot, one local transaction, one script) calls :meth:`at_once` with its settle.
    """

    committer: Committer

    def through(self, committer: Committer) -> StageCommits:
        """The same commits, through another committer (a group member's)."""
        return replace(self, committer=committer)

    def one_by_one(self, handles: Sequence[Handle]) -> list[CommitOutcome]:
        """Each handle through ``committer.commit``: the outcomes in ``handles``' order."""
        return [self.committer.commit(handle) for handle in handles]

    def at_once(self, settle: Callable[[], Mapping[TxnId, CommitOutcome]],
                handles: Sequence[Handle]) -> list[CommitOutcome]:
        """``settle()`` commits (or proves) every one of ``handles`` in one commit and returns
        each one's outcome: the outcomes in ``handles``' order. It must be idempotent (a
        proof first): a retry, and recovery, settle again."""
        return in_order(settle(), handles)


def in_order(outcomes: Mapping[TxnId, CommitOutcome], handles: Sequence[Handle]
             ) -> list[CommitOutcome]:
    """``outcomes`` of a settle, in ``handles``' order (a handle it did not settle: a bug)."""
    missing = [handle.txn_id for handle in handles if handle.txn_id not in outcomes]
    if missing:
        raise RuntimeError(f"a settle returned no outcome for {missing}: a committer bug")
    return [outcomes[handle.txn_id] for handle in handles]


class Committer:
    """The driver side of one sink, in one process: for one batch, a recovery or a cleanup
    pass, then closed.

    The framework reaches a sink's driver side through this object alone: the coordinator,
    recovery, cleanup and ``status`` open ``sink.committer()``, ``fence`` it once per query,
    list what is in doubt, check and gate a batch before its decision, commit its stages and
    abort orphans through it, from up to ``commit_parallelism`` threads at once. This default
    one forwards every method to the sink's method of the same name (a simple sink writes them
    there). A sink returns its own subclass to hold what should live for the batch in this
    process and never be pickled (a connection or a pool, a producer, an HTTP session, the
    epoch it claimed when fencing); that subclass is then the one home of the sink's commit
    and abort, defines both, and may take over any other method here.
    """

    def __init__(self, sink: TwoPhaseCommitSink[Any]) -> None:
        self.sink = sink

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _require_both(cls, Committer, "committer")

    def fence(self, namespace: str, query_id: str, epoch: int) -> None:
        """Claim ``epoch`` for the query before the first commit (see ``sink.fence``)."""
        self.sink.fence(namespace, query_id, epoch)

    def commit(self, handle: Handle) -> CommitOutcome:
        return self.sink.commit(handle)

    def abort(self, handle: Handle) -> AbortOutcome:
        return self.sink.abort(handle)

    def list_in_doubt(self, namespace: str) -> list[Handle]:
        """This namespace's unresolved transactions (see ``sink.list_in_doubt``)."""
        return self.sink.list_in_doubt(namespace)

    def commit_deadline(self, handle: Handle) -> float | None:
        """When the transaction may stop being committable (see ``sink.commit_deadline``)."""
        return self.sink.commit_deadline(handle)

    def check_committable(self, handles: Sequence[Handle]) -> None:
        """Raise if the system cannot commit ``handles`` now (see ``sink.check_committable``)."""
        self.sink.check_committable(handles)

    def purge_commit_records(self, namespace: str, older_than: datetime) -> int:
        """Forget old proofs of commit (see ``sink.purge_commit_records``)."""
        return self.sink.purge_commit_records(namespace, older_than)

    def purge_tombstones(self, older_than: datetime) -> int:
        """Delete the keyed mode's tombstones of deletes applied before ``older_than``
        (``python -m twophase.cleanup`` passes now less the sink's ``tombstone_retention_s``);
        how many. A sink that keeps none: 0."""
        return 0

    def tombstones(self) -> tuple[int, datetime | None]:
        """How many tombstones the keyed mode keeps and when the oldest one's delete was
        applied (``python -m twophase.status --sink``). A sink that keeps none: ``(0, None)``."""
        return 0, None

    @property
    def commit_parallelism(self) -> int:
        """How many handles of one batch the driver commits at once (the sink class's)."""
        return self.sink.commit_parallelism

    def require_own(self, handle: Handle) -> None:
        """Refuse a handle of another sink's kind (before its commit or abort)."""
        self.sink.require_own(handle)

    def commit_stages(self, handles: Sequence[Handle]) -> list[CommitStage]:
        """The order in which a decision's handles commit: by default all at once, through
        this committer (a sink group's committer gives one stage per member)."""
        return [CommitStage(self, tuple(handles), self.commit_parallelism)]

    def commit_handles(self, handles: Sequence[Handle], commits: StageCommits
                       ) -> list[CommitOutcome]:
        """Commit one stage's ``handles`` (one batch's, of this committer): each one's outcome,
        in order. By default one by one (``commits.one_by_one``: each through :meth:`commit`).
        A committer that makes a batch visible in one commit of its target overrides it with
        ``commits.at_once(settle, handles)``: one settle, retried as one."""
        return commits.one_by_one(handles)

    def finish_batch(self, namespace: str, batch: int, handles: Sequence[Handle]) -> None:
        """Every handle of ``batch`` is committed: publish the batch as a whole (optional).

        Called once the batch's commits all succeeded and before the batch is marked done, in
        batch order; again after a crash, so it must be idempotent. Retried on
        :class:`RetryableError`. Nothing by default.
        """

    def close(self) -> None:
        """Release what the committer holds; called once, also after an error."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class TwoPhaseCommitSink(ABC, Generic[TxnT]):
    """Base class of every sink; subclass it for your own system (see ``sinks.sqlite``)."""

    #: Stamped into every handle; the driver refuses to commit handles of another kind.
    kind: ClassVar[str]
    #: How many handles of one batch the driver commits at once.
    commit_parallelism: ClassVar[int] = DEFAULT_COMMIT_PARALLELISM
    #: Where this class commits and aborts: on the sink, in its committer, or not yet decided
    #: (an intermediate base class); set when the class is defined.
    commits_on: ClassVar[CommitHome | None] = None
    #: Whether a preflight (``python -m twophase.check``) may probe the target with a
    #: transaction of this sink: begun, written with no rows, pre-committed and aborted under a
    #: reserved id (:meth:`TxnId.probe`), seen by no reader, and exercising what the query's
    #: transactions need (connection, grants, prepare). False where such a probe would publish
    #: or would not reach the target: the preflight then reports what it could not verify.
    invisible_probe: ClassVar[bool] = True
    #: The driver-side methods (``fence``, ``list_in_doubt``, ``commit_deadline``,
    #: ``check_committable``, ``purge_commit_records``) that this class defined on the sink
    #: before 0.5.0 and now implements in its committer alone: calling one on the sink still
    #: answers, through a committer of its own, with a DeprecationWarning. Removed in 0.6.0
    #: with those shims.
    moved_to_committer: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        on_sink = _require_both(cls, TwoPhaseCommitSink, "sink")
        in_committer = _overrides(cls, TwoPhaseCommitSink, "committer")
        if on_sink and in_committer:
            raise TypeError(
                f"{cls.__qualname__} defines commit/abort and also a committer(): keep them in "
                "one place. A sink's commit and abort live on the sink or in the Committer its "
                "committer() returns, never both (to change how a prebuilt sink commits, "
                "subclass its committer and return that from committer()).")
        cls.commits_on = "sink" if on_sink else "committer" if in_committer else None

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        if cls.commits_on is None:
            raise TypeError(
                f"{cls.__qualname__} can neither commit nor abort: implement commit() and "
                "abort() on the sink, or return a Committer that does from committer().")
        if cls.commits_on == "sink" and not _overrides(cls, TwoPhaseCommitSink, "list_in_doubt"):
            raise ConfigurationError(
                f"{cls.__qualname__} commits on the sink but lists nothing in doubt: without "
                "list_in_doubt(namespace) no sweep or cleanup finds the transactions a failed "
                "task or a crashed run left.",
                fix=f"define list_in_doubt(self, namespace) on {cls.__qualname__}, beside commit "
                    "and abort: the handles of every unresolved transaction of the namespace "
                    "that the system holds (see docs/writing-a-sink.md)")
        return super().__new__(cls)

    def default_namespace(self) -> str:
        """The namespace used when the job names none (e.g. derived from the target's name and
        where it is: :func:`twophase.kit.qualified_namespace`)."""
        return self.kind

    def former_default_namespaces(self) -> tuple[str, ...]:
        """Defaults an earlier release derived for this target: a state saved under one of them
        keeps it when the job names no namespace (its in-doubt transactions carry it)."""
        return ()

    def client_extras(self) -> tuple[str, ...]:
        """The extras of ``pip install 'twophase[...]'`` whose client libraries this sink needs
        on the driver and on every executor (default: the one its ``kind`` names, if any): the
        preflight and a query's start check that they import there."""
        return (self.kind,)

    def check_schema(self, columns: Sequence[Column]) -> None:
        """Raise :class:`SchemaMismatchError` if rows of these columns cannot be written."""

    def route_key(self) -> tuple[str, ...] | None:
        """The columns by which Spark must route rows so that every key of a batch is written
        by one task, or None (the default) where any partitioning will do. A sink that writes
        keyed changes under locks held until the decision (``mode="keyed"`` into MySQL XA or
        PostgreSQL prepared transactions) returns its key: a key written by two tasks of one
        batch would wait on a lock that only the decision, which waits for both, releases. So
        does a sink whose order of writes decides which change wins (a Kafka changelog: two
        tasks' records of one key would land in its partition in no version order)."""
        return None

    @abstractmethod
    def begin_transaction(self, ctx: TransactionContext) -> TxnT: ...

    @abstractmethod
    def write(self, txn: TxnT, rows: Iterable[Sequence[Any]]) -> None:
        """Write rows (tuples in the order of ``ctx.columns``) through the transaction."""

    def write_arrow(self, txn: TxnT, batches: Iterable[pa.RecordBatch]) -> None:
        """Write Arrow record batches (top-level timestamps in UTC) through the transaction.

        The data source path calls this; the default converts the batches to rows of the types
        in the module docstring and calls :meth:`write`. Override it to skip per-row Python.
        """
        self.write(txn, rows_of(batches))

    @abstractmethod
    def pre_commit(self, txn: TxnT) -> Handle:
        """Make the transaction durable and invisible, release its resources, return its handle."""

    def discard(self, txn: TxnT) -> None:
        """Release a transaction that failed before ``pre_commit``; must not raise."""

    # -- the driver side of a simple sink: the default committer forwards to these ------------

    def fence(self, namespace: str, query_id: str, epoch: int) -> None:
        """Claim ``epoch`` for the query in the external system, if it can fence (optional).

        The driver calls it (through the default committer) before its first commit or sweep
        in a process. Raise :class:`FencedError` if a newer epoch has claimed the query: then
        ``commit`` must refuse this run's commits. The state file fences zombie runs anyway; a
        sink fences again where a zombie on another host might otherwise still commit (see
        ``sinks.mysql``, whose committer fences).
        """
        if "fence" in self.moved_to_committer:
            self._through_committer("fence", namespace, query_id, epoch)

    def commit(self, handle: Handle) -> CommitOutcome:
        """Make the transaction visible; idempotent: COMMITTED or a proven ALREADY_COMMITTED.

        Implement this and :meth:`abort` (a simple sink), or both in the :class:`Committer`
        that :meth:`committer` returns. Deprecated (removed in 0.6.0) on a sink of the latter
        kind: this then commits through a committer of its own, warning; call
        ``committer.commit(handle)`` on ``sink.committer()`` instead.
        """
        outcome: CommitOutcome = self._through_committer("commit", handle)
        return outcome

    def abort(self, handle: Handle) -> AbortOutcome:
        """Throw the transaction away; idempotent (NOT_FOUND when there is nothing). Where it
        lives, and its deprecated use on a sink with a committer: as :meth:`commit`."""
        outcome: AbortOutcome = self._through_committer("abort", handle)
        return outcome

    def list_in_doubt(self, namespace: str) -> list[Handle]:
        """Handles of every unresolved transaction of ``namespace`` that the system holds:
        pre-committed, or begun and outliving its writer (see "list_in_doubt" in the module
        docstring for those a system ends with the writer's session).

        Required: on a simple sink (a sink that commits on itself without it is refused when
        it is built), or in the sink's committer. A sink that has it in neither place raises
        :class:`ConfigurationError` when the driver first lists (at the query's start, in the
        preflight, in cleanup): never an empty listing that would hide orphans.
        """
        if "list_in_doubt" in self.moved_to_committer:
            listed: list[Handle] = self._through_committer("list_in_doubt", namespace)
            return listed
        name = type(self).__qualname__
        raise ConfigurationError(
            f"{name} cannot list its transactions in doubt: neither the sink nor the Committer "
            "its committer() returns implements list_in_doubt(namespace), so no sweep or "
            "cleanup would find what a failed task or a crashed run left.",
            fix=f"implement list_in_doubt(self, namespace) in {name}'s Committer subclass (or, "
                "for a sink that commits on itself, on the sink): the handles of every "
                "unresolved transaction of the namespace that the system holds")

    def committer(self) -> Committer:
        """What commits and aborts a batch's handles in one process (see :class:`Committer`)."""
        return Committer(self)

    def commit_deadline(self, handle: Handle) -> float | None:
        """When (Unix time) this pre-committed transaction may stop being committable, if the
        system expires it (Kafka's transaction timeout, a receiver's key expiry): the driver
        does not decide a batch one of whose transactions may expire before its commit could
        end, and gives the batch up instead (see ``DEADLINE_MARGIN_S``). None: never."""
        if "commit_deadline" in self.moved_to_committer:
            deadline: float | None = self._through_committer("commit_deadline", handle)
            return deadline
        return None

    def check_committable(self, handles: Sequence[Handle]) -> None:
        """Raise (RetryableError while it may pass later) if the system that commits
        ``handles`` cannot commit them now. The driver calls it before deciding a batch, within
        its retry policy, and gives the batch up if it still fails: in a sink group a member
        must not fall behind the others by a decided batch. Only a sink whose ``pre_commit``
        does not reach the system needs it (HttpSink stages its requests without the
        receiver); for the others a pre-commit that succeeded is the proof."""
        if "check_committable" in self.moved_to_committer:
            self._through_committer("check_committable", handles)

    def purge_commit_records(self, namespace: str, older_than: datetime) -> int:
        """Forget proofs of transactions *committed* before ``older_than`` (never by the time
        the proof was written; see "Proofs of commit" above); return how many."""
        if "purge_commit_records" in self.moved_to_committer:
            purged: int = self._through_committer("purge_commit_records", namespace,
                                                  older_than)
            return purged
        return 0

    def _through_committer(self, method: str, *args: Any) -> Any:
        """Deprecated, removed in 0.6.0: the sink-side convenience that answers ``method``
        through a committer of the sink's own (opened, used, closed), warning. Reached by a
        caller of ``sink.commit``/``abort`` on a sink with a committer, or of a method the
        class moved into its committer (:attr:`moved_to_committer`); the framework calls the
        committer itself, and the default committer forwards to the sink, never back."""
        name = type(self).__qualname__
        warnings.warn(DRIVER_SIDE_ON_SINK_DEPRECATED.format(sink=name, method=method),
                      DeprecationWarning, stacklevel=3)
        with self.committer() as committer:
            if not _overrides(type(committer), Committer, method):
                raise TypeError(
                    f"{name}: neither the sink nor its committer "
                    f"{type(committer).__qualname__} implements {method}(): implement it in "
                    "the committer (a sink's driver side lives in one place).")
            return getattr(committer, method)(*args)

    def handle(self, txn_id: TxnId, rows: int, **data: Any) -> Handle:
        """Build a handle of this sink's kind."""
        return Handle(txn_id=txn_id, sink=self.kind, rows=rows, data=data)

    def require_own(self, handle: Handle) -> None:
        """Refuse a handle written by another kind of sink (a misconfigured job or cleanup).

        The framework checks every handle before the driver or cleanup commits or aborts it;
        a sink need not check again.
        """
        if handle.sink != self.kind:
            raise ConfigurationError(
                f"handle of transaction {handle.txn_id} was written by a {handle.sink!r} sink, "
                f"but this is a {self.kind!r} sink.",
                fix="point the job or cleanup at the sink the state file was written with",
            )


#: What a sink-side call of a driver-side method says on a sink whose driver side lives in its
#: committer (deprecated in 0.5.0, removed in 0.6.0).
DRIVER_SIDE_ON_SINK_DEPRECATED = (
    "{sink}.{method}() on the sink is deprecated since 0.5.0 and is removed in 0.6.0: the "
    "driver side lives in the sink's committer; call it there: "
    "`with sink.committer() as committer: committer.{method}(...)`."
)


def _overrides(cls: type, base: type, name: str) -> bool:
    return getattr(cls, name) is not getattr(base, name)


def _require_both(cls: type, base: type, home: str) -> bool:
    """Whether ``cls`` defines commit and abort itself (below ``base``); one without the other
    is refused (the missing one would call back into the defined one's counterpart)."""
    defined = [name for name in ("commit", "abort") if _overrides(cls, base, name)]
    if len(defined) == 1:
        missing = {"commit", "abort"}.difference(defined).pop()
        raise TypeError(f"{cls.__qualname__} defines {defined[0]}() but not {missing}(): a "
                        f"{home} that commits also aborts; define both.")
    return bool(defined)
