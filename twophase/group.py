"""Several systems, one decision: :class:`SinkGroup`, a sink made of named member sinks.

``write_stream(df, SinkGroup({"orders": table_sink, "events": topic_sink}, commit_order=[...]))``
reads the source once. Each partition opens one transaction per member, writes its rows into each
(every member takes its own columns of the DataFrame), and pre-commits them all; the batch is
decided once, the decision listing every member's transactions; then the members commit one
after the other in the declared order: every transaction of member k is committed before any
of member k+1, also on recovery and in ``python -m twophase.cleanup``.

What a group promises: every batch is in all members or in none, each member eventually, in
the declared order (a consumer of the topic always finds the row in the table committed before
it). Not simultaneous visibility: between the first and the last member's commit, a reader of
one system sees the batch and a reader of another does not yet. Except where consecutive members
publish into one database (:class:`~twophase.kit.LocalCommitMember`: a PostgreSQL table staged,
and an Iceberg table whose SQL catalog is in the same database): their commit is ONE local
transaction of that database, so a reader of that database sees the batch in both or in
neither (one commit stage, labelled ``"orders+lake"``; no crash point between them).

======================  =====================================================================
phase                   what the group does, and what a crash there leaves behind
======================  =====================================================================
begin                   begins each member's transaction (id: the member's namespace, the
                        rest of the partition's id); a member that fails to begin ends the
                        ones begun before it
write                   hands every row (or Arrow batch) to each member's ``write`` at once,
                        each in a thread of its own with a bounded queue (memory: a few
                        chunks per member); one member's failure stops them all
pre-commit              pre-commits each member; a failure aborts the members pre-committed
                        before it. A crash leaves member transactions in doubt: the next
                        sweep or cleanup aborts them (they are no decision's)
decide                  only if every member of every partition pre-committed, every member
                        can commit now (:meth:`~twophase.Committer.check_committable`:
                        an HTTP member's receiver answers; retried within the policy), and no
                        member transaction may expire before its commit could end (the
                        deadline gate, :meth:`~twophase.Committer.commit_deadline`):
                        else the batch is given up, every member's transactions aborted
commit                  member by member in ``commit_order``; a crash between members leaves
                        the later members prepared: recovery commits them, in order
lost after decision     a member transaction found gone raises
                        :class:`~twophase.TransactionLostError` naming the batch, the
                        members committed and the member lost: the batch is split
======================  =====================================================================

Member names are stable: they are written in the state file (each member transaction's
handle names its member), so renaming a member of a running query strands its transactions.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from twophase._handle import PARTS_KEY, Handle, TxnId, fitted_namespace, validate_namespace
from twophase._loader import build_sink
from twophase._local_commit import LocalCommitMember, LocalCommitStage, LocalPart, local_commit_of
from twophase.errors import ConfigurationError, SchemaMismatchError, TwoPhaseError
from twophase.sink import (
    AbortOutcome,
    Column,
    CommitOutcome,
    CommitStage,
    Committer,
    StageCommits,
    TransactionContext,
    TwoPhaseCommitSink,
)

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

GROUP_KIND = "group"
#: How many chunks (row lists or Arrow batches) wait for each member's writer.
FAN_OUT_DEPTH = 4
#: How long the reader waits for a slow member's queue before it checks for a failure.
_FAN_OUT_POLL_S = 0.5
_NAMED = "sink group member "

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class GroupTransaction:
    """One partition's transactions, one per member (in commit order)."""

    ctx: TransactionContext
    begun: dict[str, Any] = field(default_factory=dict)
    prepared: dict[str, Handle] = field(default_factory=dict)


class SinkGroup(TwoPhaseCommitSink[GroupTransaction]):
    """Named member sinks written and decided as one (see the module docstring).

    ``members``: name -> sink (or, as in a cleanup config, name -> ``{"sink": "module:Class",
    "options": {...}}``). ``commit_order``: every member's name once (default: the order of
    ``members``). ``columns``: name -> the DataFrame's columns that member writes (default:
    every column). A member's transaction ids carry the namespace ``<group's>-<member>``
    (the group's: the job's ``namespace``, by default the first member's default; shortened
    with a stable hash past 24 characters), or the one ``namespaces`` gives it (at most 24
    characters of ``[A-Za-z0-9_-]``).
    """

    kind = GROUP_KIND

    def __init__(
        self,
        members: Mapping[str, TwoPhaseCommitSink[Any] | Mapping[str, Any]],
        *,
        commit_order: Sequence[str] | None = None,
        columns: Mapping[str, Sequence[str]] | None = None,
        namespaces: Mapping[str, str] | None = None,
    ) -> None:
        if not members:
            raise ConfigurationError("a sink group needs at least one member.",
                                     fix="pass {'name': sink, ...}")
        built = {name: _member_sink(name, member) for name, member in members.items()}
        self.commit_order = _checked_order(list(built), commit_order)
        self.members = {name: built[name] for name in self.commit_order}
        self.columns = _checked_columns(self.members, columns or {})
        self.namespaces = _checked_namespaces(self.members, namespaces or {})

    def member_namespaces(self, namespace: str) -> dict[str, str]:
        """Each member's namespace when the group's is ``namespace``: the one ``namespaces``
        gives it, else ``<namespace>-<member>`` (shortened with a stable hash where that is
        no usable namespace, so a default is never refused)."""
        chosen = {name: self.namespaces.get(name) or fitted_namespace(f"{namespace}-{name}")
                  for name in self.members}
        _require_distinct(chosen)
        return chosen

    def __repr__(self) -> str:
        members = ", ".join(f"{name}={sink!r}" for name, sink in self.members.items())
        return f"SinkGroup({members})"

    def client_extras(self) -> tuple[str, ...]:
        """Every member's extras."""
        return tuple(dict.fromkeys(extra for member in self.members.values()
                                   for extra in member.client_extras()))

    def default_namespace(self) -> str:
        return self.members[self.commit_order[0]].default_namespace()

    def former_default_namespaces(self) -> tuple[str, ...]:
        return self.members[self.commit_order[0]].former_default_namespaces()

    def route_key(self) -> tuple[str, ...] | None:
        """The key columns that every member which needs rows routed by key shares (routing by
        them keeps each member's whole key in one task), None if no member needs routing."""
        keys = {name: key for name, sink in self.members.items()
                if (key := sink.route_key()) is not None}
        if not keys:
            return None
        shared = tuple(column for column in next(iter(keys.values()))
                       if all(column in key for key in keys.values()))
        if not shared:
            raise ConfigurationError(
                f"the sink group's keyed members write under locks by keys that share no "
                f"column ({', '.join(f'{name}: {list(key)}' for name, key in keys.items())}): "
                "no routing of the rows keeps every key of a batch in one task.",
                fix="give the keyed members a common key column, or put them in groups of "
                    "their own")
        return shared

    # -- driver: before the first write ----------------------------------------------------

    def check_schema(self, columns: Sequence[Column]) -> None:
        by_name = {column.name: column for column in columns}
        for name, sink in self.members.items():
            wanted = self.columns.get(name)
            if wanted is None:
                with naming(name):
                    sink.check_schema(columns)
                continue
            if missing := [column for column in wanted if column not in by_name]:
                raise SchemaMismatchError(
                    f"member {name!r} of the sink group writes column "
                    f"{', '.join(map(repr, missing))}, which the DataFrame lacks (its columns: "
                    f"{', '.join(by_name)}).",
                    fix=f"add the column to the DataFrame, or fix columns[{name!r}]")
            with naming(name):
                sink.check_schema([by_name[column] for column in wanted])

    # -- executor --------------------------------------------------------------------------

    def begin_transaction(self, ctx: TransactionContext) -> GroupTransaction:
        txn = GroupTransaction(ctx)
        namespaces = self.member_namespaces(ctx.txn_id.namespace)
        try:
            for name, sink in self.members.items():
                member_ctx = self._member_context(name, ctx, namespaces[name])
                with naming(name):
                    txn.begun[name] = sink.begin_transaction(member_ctx)
        except BaseException:
            self.discard(txn)
            raise
        return txn

    def write(self, txn: GroupTransaction, rows: Iterable[Sequence[Any]]) -> None:
        writers = {name: self._row_writer(name, txn) for name in self.members}
        fan_out(rows, writers)

    def write_arrow(self, txn: GroupTransaction, batches: Iterable[pa.RecordBatch]) -> None:
        writers = {name: self._arrow_writer(name, txn) for name in self.members}
        fan_out(batches, writers)

    def pre_commit(self, txn: GroupTransaction) -> Handle:
        for name, sink in self.members.items():
            with naming(name):
                txn.prepared[name] = sink.pre_commit(txn.begun[name])
            del txn.begun[name]
        return self.partition_handle(txn.ctx.txn_id, txn.prepared)

    def discard(self, txn: GroupTransaction) -> None:
        """End what the partition began: discard the begun members, abort the pre-committed
        ones through their committers (a later sweep or cleanup aborts what this cannot)."""
        for name, begun in txn.begun.items():
            self.members[name].discard(begun)
        for name, handle in txn.prepared.items():
            try:
                with self.members[name].committer() as committer, naming(name):
                    committer.abort(handle)
            except TwoPhaseError as exc:
                log.warning("member %s: transaction %s stays in doubt (a sweep or cleanup "
                            "aborts it): %s", name, handle.txn_id, exc)

    # -- driver ----------------------------------------------------------------------------

    #: Deprecated on the sink (removed in 0.6.0): :meth:`GroupCommitter.list_in_doubt`, on
    #: ``group.committer()``.
    moved_to_committer = frozenset({"list_in_doubt"})

    def committer(self) -> GroupCommitter:
        """Everything the driver does for the group, member by member."""
        return GroupCommitter(self)

    # -- handles ---------------------------------------------------------------------------

    def member_handles(self, handle: Handle) -> list[tuple[str, Handle]]:
        """The member transactions a handle of this group stands for, in commit order."""
        order = {name: number for number, name in enumerate(self.commit_order)}
        return sorted(member_handles(handle), key=lambda pair: order.get(pair[0], len(order)))

    def by_member(self, handles: Sequence[Handle]) -> dict[str, list[Handle]]:
        """The member transactions ``handles`` stand for, per member in commit order (a
        member this group does not have is left out)."""
        held: dict[str, list[Handle]] = {name: [] for name in self.commit_order}
        for handle in handles:
            for name, member in member_handles(handle):
                if name in held:
                    held[name].append(member)
        return held

    def partition_handle(self, txn_id: TxnId, members: Mapping[str, Handle]) -> Handle:
        """One handle for a partition's member transactions (``pre_commit``'s, a listing's)."""
        rows = max((handle.rows for handle in members.values()), default=0)
        return self.handle(txn_id, rows, **{PARTS_KEY: {
            name: handle.to_json() for name, handle in members.items()}})

    def _member_context(self, name: str, ctx: TransactionContext,
                        namespace: str) -> TransactionContext:
        txn_id = replace(ctx.txn_id, namespace=namespace)
        wanted = self.columns.get(name)
        if wanted is None:
            return TransactionContext(txn_id, ctx.columns)
        by_name = {column.name: column for column in ctx.columns}
        return TransactionContext(txn_id, tuple(by_name[column] for column in wanted))

    def _row_writer(self, name: str, txn: GroupTransaction
                    ) -> Callable[[Iterator[Sequence[Any]]], None]:
        sink, begun = self.members[name], txn.begun[name]
        wanted = self.columns.get(name)
        positions = None if wanted is None else [txn.ctx.column_names.index(c) for c in wanted]

        def write(rows: Iterator[Sequence[Any]]) -> None:
            with naming(name):
                sink.write(begun, rows if positions is None
                           else ([row[i] for i in positions] for row in rows))

        return write

    def _arrow_writer(self, name: str, txn: GroupTransaction
                      ) -> Callable[[Iterator[pa.RecordBatch]], None]:
        sink, begun = self.members[name], txn.begun[name]
        wanted = self.columns.get(name)

        def write(batches: Iterator[pa.RecordBatch]) -> None:
            with naming(name):
                sink.write_arrow(begun, batches if wanted is None
                                 else (batch.select(wanted) for batch in batches))

        return write


class GroupCommitter(Committer):
    """The group's driver side: one committer per member (opened on first use), each member's
    transactions through its own, in commit order.

    ==========================  ==============================================================
    method                      what it does over the members
    ==========================  ==============================================================
    ``fence``                   fences every member's committer under its namespace
    ``commit_stages``           every member's stages, in commit order: its committer and its
                                own handles (the coordinator commits stage after stage);
                                consecutive members of one local domain: ONE stage, settled
                                in one local transaction (:class:`LocalCommitStage`)
    ``check_committable``       asks every member with its transactions, in commit order
    ``commit_deadline``         the earliest of the member transactions' deadlines
    ``finish_batch``            every member's, in commit order, with its own handles
    ``list_in_doubt``           every member's, one handle per partition transaction
    ``commit_handles``          partition handles, stage after stage, each stage through its
                                committer's ``commit_handles`` (``commit``: one handle)
    ``abort``                   a partition handle's member transactions, in commit order
    ``purge_commit_records``    every member's
    ``tombstones``              every member's, added up (the oldest of all)
    ==========================  ==============================================================
    """

    sink: SinkGroup

    def __init__(self, sink: SinkGroup) -> None:
        super().__init__(sink)
        self._committers: dict[str, Committer] = {}
        self._lock = threading.Lock()

    def member(self, name: str) -> Committer:
        with self._lock:
            if name not in self._committers:
                self._committers[name] = self.sink.members[name].committer()
            return self._committers[name]

    def fence(self, namespace: str, query_id: str, epoch: int) -> None:
        namespaces = self.sink.member_namespaces(namespace)
        for name in self.sink.commit_order:
            with naming(name):
                self.member(name).fence(namespaces[name], query_id, epoch)

    def commit_stages(self, handles: Sequence[Handle]) -> list[CommitStage]:
        """Each member's own stages in commit order (by default one: every partition's
        transaction of that member), committed through the member's committer (the one this
        committer fenced, which commits its stage its own way: a Delta member in one commit),
        labelled with the member's name."""
        stages = []
        for run in self._runs(handles):
            if len(run) > 1:
                local = LocalCommitStage(run)
                stages.append(CommitStage(_Naming(local.label, local), local.handles, 1,
                                          label=local.label))
                continue
            name, transactions = run[0].name, list(run[0].handles)
            stages.extend(CommitStage(_Naming(name, stage.committer), stage.handles,
                                      stage.parallelism, label=name)
                          for stage in self.member(name).commit_stages(transactions))
        return stages

    def _runs(self, handles: Sequence[Handle]) -> list[list[LocalPart]]:
        """The members with transactions among ``handles``, in commit order, in runs: a run
        of several is consecutive members whose committers publish into the same database
        (:class:`~twophase.kit.LocalCommitMember`, the same ``local_domain()``), settled in ONE
        local transaction; any other member is a run of its own."""
        runs: list[list[LocalPart]] = []
        domain_of_last: str | None = None
        for name, transactions in self.sink.by_member(handles).items():
            if not transactions:
                continue
            committer = self.member(name)
            with naming(name):
                local = local_commit_of(committer)
                domain = local.local_domain() if local is not None else None
            part = LocalPart(name, committer, local or _NO_LOCAL, tuple(transactions))
            if domain is not None and domain == domain_of_last:
                runs[-1].append(part)
            else:
                runs.append([part])
            domain_of_last = domain
        return runs

    def check_committable(self, handles: Sequence[Handle]) -> None:
        for name, transactions in self.sink.by_member(handles).items():
            with naming(name):
                self.member(name).check_committable(transactions)

    def commit_deadline(self, handle: Handle) -> float | None:
        deadlines = [deadline for name, member in self.sink.member_handles(handle)
                     if (deadline := self.member(name).commit_deadline(member)) is not None]
        return min(deadlines, default=None)

    def finish_batch(self, namespace: str, batch: int, handles: Sequence[Handle]) -> None:
        namespaces = self.sink.member_namespaces(namespace)
        for name, transactions in self.sink.by_member(handles).items():
            if transactions:
                with naming(name):
                    self.member(name).finish_batch(namespaces[name], batch, transactions)

    def list_in_doubt(self, namespace: str) -> list[Handle]:
        """The members' unresolved transactions, one handle per partition transaction of the
        group (named as ``pre_commit`` named it) holding what each member still has of it."""
        held: dict[TxnId, dict[str, Handle]] = {}
        for name, member_namespace in self.sink.member_namespaces(namespace).items():
            with naming(name):
                member_held = self.member(name).list_in_doubt(member_namespace)
            for handle in member_held:
                held.setdefault(replace(handle.txn_id, namespace=namespace), {})[name] = handle
        return [self.sink.partition_handle(txn_id, members) for txn_id, members in held.items()]

    def commit_handles(self, handles: Sequence[Handle], commits: StageCommits
                       ) -> list[CommitOutcome]:
        """Partition handles committed stage after stage (:meth:`commit_stages`), each stage
        through its committer's own ``commit_handles``; a partition's outcome is COMMITTED if
        any member transaction of it was. (The coordinator commits the stages itself.)"""
        partition_of = {member.txn_id: handle.txn_id for handle in handles
                        for _, member in self.sink.member_handles(handle)}
        committed: set[TxnId] = set()
        for stage in self.commit_stages(handles):
            outcomes = stage.committer.commit_handles(stage.handles,
                                                      commits.through(stage.committer))
            committed.update(partition_of[member.txn_id]
                             for member, outcome in zip(stage.handles, outcomes, strict=True)
                             if outcome is CommitOutcome.COMMITTED)
        return [CommitOutcome.COMMITTED if handle.txn_id in committed
                else CommitOutcome.ALREADY_COMMITTED for handle in handles]

    def commit(self, handle: Handle) -> CommitOutcome:
        """A partition handle's member transactions, in commit order (:meth:`commit_handles`)."""
        return self.commit_handles([handle], StageCommits(self))[0]

    def abort(self, handle: Handle) -> AbortOutcome:
        aborted = AbortOutcome.ABORTED in self._each_member(
            handle, lambda member, txn: member.abort(txn))
        return AbortOutcome.ABORTED if aborted else AbortOutcome.NOT_FOUND

    def purge_commit_records(self, namespace: str, older_than: datetime) -> int:
        namespaces = self.sink.member_namespaces(namespace)
        purged = 0
        for name in self.sink.commit_order:
            with naming(name):
                purged += self.member(name).purge_commit_records(namespaces[name], older_than)
        return purged

    def tombstones(self) -> tuple[int, datetime | None]:
        counts = [self.member(name).tombstones() for name in self.sink.commit_order]
        oldest = [when for _, when in counts if when is not None]
        return sum(count for count, _ in counts), min(oldest, default=None)

    def _each_member(self, handle: Handle, step: Callable[[Committer, Handle], R]) -> list[R]:
        """``step`` (commit or abort) of every member transaction ``handle`` stands for, in
        commit order, through each member's committer."""
        outcomes = []
        for name, member in self.sink.member_handles(handle):
            with naming(name):
                outcomes.append(step(self.member(name), member))
        return outcomes

    def close(self) -> None:
        with self._lock:
            committers, self._committers = list(self._committers.values()), {}
        for committer in committers:
            committer.close()


class _NoLocalCommit:
    """The capability of a member that has none (never asked: it runs alone)."""

    def local_domain(self) -> str | None:
        return None

    def local_transaction(self) -> contextlib.AbstractContextManager[Any]:
        raise NotImplementedError

    def settle_in(self, connection: Any, handles: Sequence[Handle]
                  ) -> Mapping[TxnId, CommitOutcome]:
        raise NotImplementedError


_NO_LOCAL: LocalCommitMember = _NoLocalCommit()


class _Naming(Committer):
    """A member's committer whose errors name the member (see :func:`naming`): what a commit
    stage of the group commits through."""

    def __init__(self, name: str, committer: Committer) -> None:
        super().__init__(committer.sink)
        self._name, self._committer = name, committer

    def commit(self, handle: Handle) -> CommitOutcome:
        with naming(self._name):
            return self._committer.commit(handle)

    def commit_handles(self, handles: Sequence[Handle], commits: StageCommits
                       ) -> list[CommitOutcome]:
        with naming(self._name):
            return self._committer.commit_handles(handles, commits)

    def abort(self, handle: Handle) -> AbortOutcome:
        with naming(self._name):
            return self._committer.abort(handle)


@contextlib.contextmanager
def naming(member: str) -> Iterator[None]:
    """A member's error as it was (the same kind: retried or not alike), its message naming
    the member."""
    try:
        yield
    except TwoPhaseError as exc:
        if exc.cause.startswith(_NAMED):
            raise
        raise type(exc)(f"{_NAMED}{member!r}: {exc.cause}", fix=exc.fix) from exc


def member_handles(handle: Handle) -> list[tuple[str, Handle]]:
    """The member transactions a group's handle stands for, as it lists them; none for
    another sink's."""
    return list(handle.parts().items()) if handle.sink == GROUP_KIND else []


def fan_out(items: Iterable[T], writers: Mapping[str, Callable[[Iterator[T]], None]]) -> None:
    """Give every item to each writer, each running in a thread of its own and reading from a
    bounded queue; the first writer's error stops the others and is raised here."""
    feeds = {name: _Feed[T]() for name in writers}
    failures: list[BaseException] = []
    threads = [threading.Thread(target=_run_writer, args=(writer, feeds[name], failures),
                                name=f"twophase-group-{name}", daemon=True)
               for name, writer in writers.items()]
    for thread in threads:
        thread.start()
    try:
        for item in items:
            for feed in feeds.values():
                feed.put(item, failures)
            if failures:
                break
    except BaseException as exc:  # the source itself failed: the writers must not finish
        failures.append(exc)
    finally:
        for feed in feeds.values():
            feed.end(failures)
        for thread in threads:
            thread.join()
    if failures:
        raise failures[0]


class _Feed(Iterator[T]):
    """The items of one writer: a bounded queue, ended by a marker (or a failure)."""

    _END = object()
    _FAILED = object()

    def __init__(self) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=FAN_OUT_DEPTH)
        self._done = False

    def put(self, item: T, failures: list[BaseException]) -> None:
        while not failures:
            try:
                self._queue.put(item, timeout=_FAN_OUT_POLL_S)
                return
            except queue.Full:
                continue

    def end(self, failures: list[BaseException]) -> None:
        """Mark the end: after every item, or (a writer or the source failed) instead of the
        items not read yet, which a writer that stopped reading would never take."""
        while not failures:
            try:
                self._queue.put(self._END, timeout=_FAN_OUT_POLL_S)
                return
            except queue.Full:
                continue
        while True:
            try:
                self._queue.put_nowait(self._FAILED)
                return
            except queue.Full:
                with contextlib.suppress(queue.Empty):
                    self._queue.get_nowait()

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        item = self._queue.get()
        if item is self._END:
            self._done = True
            raise StopIteration
        if item is self._FAILED:
            self._done = True
            raise _WriteStoppedError
        return item  # type: ignore[no-any-return]


class _WriteStoppedError(Exception):
    """Raised inside a member's write when another member (or the source) failed."""


def _run_writer(writer: Callable[[Iterator[T]], None], feed: _Feed[T],
                failures: list[BaseException]) -> None:
    try:
        writer(feed)
        for _left in feed:  # a writer that stopped early still drains its feed
            pass
    except _WriteStoppedError:
        pass
    except BaseException as exc:
        failures.append(exc)


def _member_sink(name: str, member: TwoPhaseCommitSink[Any] | Mapping[str, Any]
                 ) -> TwoPhaseCommitSink[Any]:
    if isinstance(member, TwoPhaseCommitSink):
        if isinstance(member, SinkGroup):
            raise ConfigurationError(f"member {name!r} is itself a sink group.",
                                     fix="list its members in this group instead")
        return member
    if isinstance(member, Mapping) and isinstance(member.get("sink"), str):
        return build_sink(member["sink"], member.get("options", {}))
    raise ConfigurationError(
        f"member {name!r} of the sink group is {member!r}, not a sink.",
        fix="give a sink object, or {'sink': 'module:Class', 'options': {...}}")


def _checked_order(names: list[str], commit_order: Sequence[str] | None) -> list[str]:
    if commit_order is None:
        return names
    order = list(commit_order)
    if sorted(order) != sorted(names) or len(set(order)) != len(order):
        raise ConfigurationError(
            f"commit_order {order} must name every member of the group once: {names}.",
            fix="list each member's name exactly once, in the order they should commit")
    return order


def _checked_columns(members: Mapping[str, TwoPhaseCommitSink[Any]],
                     columns: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
    if unknown := sorted(set(columns) - set(members)):
        raise ConfigurationError(f"columns names no member {unknown} (members: {list(members)}).",
                                 fix="key columns= by the members' names")
    checked = {name: tuple(names) for name, names in columns.items()}
    if empty := [name for name, names in checked.items() if not names]:
        raise ConfigurationError(f"member {empty[0]!r} would write no column.",
                                 fix="give it at least one column, or leave it out of columns=")
    return checked


def _checked_namespaces(members: Mapping[str, TwoPhaseCommitSink[Any]],
                        namespaces: Mapping[str, str]) -> dict[str, str]:
    if unknown := sorted(set(namespaces) - set(members)):
        raise ConfigurationError(f"namespaces names no member {unknown}.",
                                 fix="key namespaces= by the members' names")
    chosen = {name: validate_namespace(namespace) for name, namespace in namespaces.items()}
    _require_distinct(chosen)
    return chosen


def _require_distinct(namespaces: Mapping[str, str]) -> None:
    seen: dict[str, str] = {}
    for name, namespace in namespaces.items():
        if namespace in seen:
            raise ConfigurationError(
                f"members {seen[namespace]!r} and {name!r} would both name their transactions "
                f"{namespace!r}.", fix="give one of them its own namespace in namespaces=")
        seen[namespace] = name
