"""Where a sink's commit and abort live: on the sink or in its committer, never both, never
neither; the base class bridges the two ways, and every prebuilt sink has exactly one home."""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

import pytest

from setups import SETUPS
from sinks.http import HttpSink
from sinks.kafka import KafkaSink
from sinks.mysql import MySQLXASink
from sinks.postgres import PostgresSink
from sinks.s3 import S3Sink
from sinks.sqlite import SQLiteCommitter, SQLiteSink
from tests.user_sink import JsonLinesSink
from twophase import (
    AbortOutcome,
    CommitOutcome,
    Committer,
    ConfigurationError,
    Handle,
    TransactionContext,
    TransactionLostError,
    TwoPhaseCommitSink,
)
from twophase._coordinator import Coordinator
from twophase._state import StateStore
from twophase.cleanup import Report, clean
from twophase.cleanup import Target as CleanupTarget
from twophase.sink import CommitStage
from twophase.status import _in_target as status_in_target
from twophase.testing.contract import NAMESPACE, QUERY_ID, context

CALLS: list[str] = []


class _Phases(TwoPhaseCommitSink[TransactionContext]):
    """The executor's phases of a sink that writes nothing; each test adds a commit home."""

    kind = "phases"

    def begin_transaction(self, ctx: TransactionContext) -> TransactionContext:
        return ctx

    def write(self, txn: TransactionContext, rows: Iterable[Sequence[Any]]) -> None:
        """Nothing to write: these tests are about commit and abort."""

    def pre_commit(self, txn: TransactionContext) -> Handle:
        return self.handle(txn.txn_id, 0)

    def list_in_doubt(self, namespace: str) -> list[Handle]:
        return []


class OnTheSink(_Phases):
    def commit(self, handle: Handle) -> CommitOutcome:
        CALLS.append("sink.commit")
        return CommitOutcome.COMMITTED

    def abort(self, handle: Handle) -> AbortOutcome:
        CALLS.append("sink.abort")
        return AbortOutcome.ABORTED


class CountingCommitter(Committer):
    def commit(self, handle: Handle) -> CommitOutcome:
        CALLS.append("committer.commit")
        return CommitOutcome.COMMITTED

    def abort(self, handle: Handle) -> AbortOutcome:
        CALLS.append("committer.abort")
        return AbortOutcome.NOT_FOUND

    def close(self) -> None:
        CALLS.append("committer.close")


class InTheCommitter(_Phases):
    def committer(self) -> Committer:
        return CountingCommitter(self)


@pytest.fixture(autouse=True)
def _fresh_calls() -> None:
    CALLS.clear()


def _handle(sink: TwoPhaseCommitSink[Any]) -> Handle:
    return sink.pre_commit(sink.begin_transaction(context()))


def test_a_sink_with_commit_on_itself_is_committed_through_the_default_committer() -> None:
    sink = OnTheSink()
    with sink.committer() as committer:
        assert committer.commit(_handle(sink)) is CommitOutcome.COMMITTED
        assert committer.abort(_handle(sink)) is AbortOutcome.ABORTED
    assert CALLS == ["sink.commit", "sink.abort"]
    assert OnTheSink.commits_on == "sink"


def test_a_sink_with_a_committer_commits_one_handle_through_a_committer_it_closes() -> None:
    """Deprecated since 0.5.0 (the driver side is the committer's), working until 0.6.0."""
    sink = InTheCommitter()
    with pytest.warns(DeprecationWarning, match=r"InTheCommitter.commit\(\) on the sink is "
                      r"deprecated.*committer.commit\(\.\.\.\)"):
        assert sink.commit(_handle(sink)) is CommitOutcome.COMMITTED
    with pytest.warns(DeprecationWarning, match=r"InTheCommitter.abort\(\) on the sink"):
        assert sink.abort(_handle(sink)) is AbortOutcome.NOT_FOUND
    assert CALLS == ["committer.commit", "committer.close", "committer.abort", "committer.close"]
    assert InTheCommitter.commits_on == "committer"


def test_a_sink_with_commit_on_itself_and_a_committer_is_refused_when_defined() -> None:
    with pytest.raises(TypeError, match="defines commit/abort and also a committer"):
        class _Both(OnTheSink):
            def committer(self) -> Committer:
                return CountingCommitter(self)


def test_overriding_commit_on_a_sink_that_commits_in_its_committer_is_refused() -> None:
    """The driver commits through the committer: the override would silently never run."""
    with pytest.raises(TypeError, match="subclass its committer"):
        class _Logged(InTheCommitter):
            def commit(self, handle: Handle) -> CommitOutcome:
                return super().commit(handle)

            def abort(self, handle: Handle) -> AbortOutcome:
                return super().abort(handle)


def test_commit_without_abort_is_refused_on_a_sink_and_on_a_committer() -> None:
    with pytest.raises(TypeError, match="defines commit\\(\\) but not abort\\(\\)"):
        class _HalfSink(_Phases):
            def commit(self, handle: Handle) -> CommitOutcome:
                return CommitOutcome.COMMITTED
    with pytest.raises(TypeError, match="defines abort\\(\\) but not commit\\(\\)"):
        class _HalfCommitter(Committer):
            def abort(self, handle: Handle) -> AbortOutcome:
                return AbortOutcome.ABORTED


def test_a_sink_that_can_neither_commit_nor_abort_is_refused_when_built() -> None:
    with pytest.raises(TypeError, match="can neither commit nor abort"):
        _Phases()


class _NoListing(TwoPhaseCommitSink[TransactionContext]):
    """Commits on the sink, lists nothing in doubt: what list_in_doubt no longer abstract
    must not let through."""

    kind = "no-listing"

    def begin_transaction(self, ctx: TransactionContext) -> TransactionContext:
        return ctx

    def write(self, txn: TransactionContext, rows: Iterable[Sequence[Any]]) -> None:
        """Nothing to write."""

    def pre_commit(self, txn: TransactionContext) -> Handle:
        return self.handle(txn.txn_id, 0)

    def commit(self, handle: Handle) -> CommitOutcome:
        return CommitOutcome.COMMITTED

    def abort(self, handle: Handle) -> AbortOutcome:
        return AbortOutcome.ABORTED


class _NoListingAnywhere(_Phases):
    """A committer of its own, and list_in_doubt in neither place."""

    list_in_doubt = TwoPhaseCommitSink.list_in_doubt  # undo _Phases' listing

    def committer(self) -> Committer:
        return CountingCommitter(self)


def test_a_simple_sink_without_list_in_doubt_is_refused_when_built() -> None:
    with pytest.raises(ConfigurationError, match=r"_NoListing commits on the sink but lists "
                       r"nothing in doubt.*Fix: define list_in_doubt\(self, namespace\)"):
        _NoListing()


def test_a_sink_listing_in_doubt_nowhere_stops_the_query_at_its_start(tmp_path: Path) -> None:
    """Never an empty listing that would hide orphans: the start's sweep refuses it."""
    sink = _NoListingAnywhere()
    store = StateStore(tmp_path / "state")
    epoch = store.start_run(NAMESPACE, {}).epoch
    with Coordinator(sink, store, namespace=NAMESPACE, epoch=epoch) as coordinator, \
            pytest.raises(ConfigurationError, match=r"cannot list its transactions in doubt.*"
                          r"Fix: implement list_in_doubt\(self, namespace\) in "
                          r"_NoListingAnywhere's Committer subclass"):
        coordinator.start(QUERY_ID)


@pytest.mark.parametrize(("sink", "home"), [
    (SQLiteSink, "committer"), (JsonLinesSink, "sink"), (MySQLXASink, "committer"),
    (PostgresSink, "committer"), (S3Sink, "committer"), (KafkaSink, "committer"),
    (HttpSink, "committer"),
])
def test_every_shipped_sink_has_one_home_for_commit_and_abort(
        sink: type[TwoPhaseCommitSink[Any]], home: str) -> None:
    assert sink.commits_on == home
    defined_on_sink = {"commit", "abort"} & set(vars(sink))
    assert (defined_on_sink == {"commit", "abort"}) is (home == "sink")


def test_a_prebuilt_sink_changes_how_it_commits_by_subclassing_its_committer(
        tmp_path: Path) -> None:
    """The way the refusal above names: the driver's committer runs the override."""
    class AuditedCommitter(SQLiteCommitter):
        def commit(self, handle: Handle) -> CommitOutcome:
            CALLS.append("audited")
            return super().commit(handle)

    class Audited(SQLiteSink):
        def committer(self) -> SQLiteCommitter:
            return AuditedCommitter(self)

    sink = Audited(tmp_path / "db.sqlite", "orders")
    with pytest.raises(TransactionLostError, match="neither prepared"), \
            sink.committer() as committer:
        committer.commit(sink.handle(context().txn_id, 0))
    assert CALLS == ["audited"]


#: What runs on the driver (or in cron): a prebuilt sink keeps none of it on the sink.
DRIVER_SIDE = ("fence", "commit", "abort", "list_in_doubt", "commit_deadline",
               "check_committable", "purge_commit_records")


@pytest.mark.parametrize("factory", [*sorted(setup.factory for setup in SETUPS.values()),
                                     "twophase.group:SinkGroup"])
def test_every_prebuilt_sink_keeps_its_driver_side_in_its_committer(factory: str) -> None:
    """The sink writes; the committer is everything the driver does. What a prebuilt sink
    defined on the sink before 0.5.0 is only named in ``moved_to_committer`` (the base class's
    deprecated shims answer it through the committer, whose contract suite tests it)."""
    module, _, name = factory.partition(":")
    sink = getattr(importlib.import_module(module), name)
    assert sink.commits_on == "committer"
    assert [method for method in DRIVER_SIDE
            if getattr(sink, method) is not getattr(TwoPhaseCommitSink, method)] == []
    assert set(sink.moved_to_committer) <= set(DRIVER_SIDE) - {"commit", "abort"}


class _NotOnTheSink(_Phases):
    """Its driver side lives in its committer alone: a framework call on the sink fails."""

    def fence(self, namespace: str, query_id: str, epoch: int) -> None:
        raise AssertionError("sink.fence called")

    def list_in_doubt(self, namespace: str) -> list[Handle]:
        raise AssertionError("sink.list_in_doubt called")

    def commit_deadline(self, handle: Handle) -> float | None:
        raise AssertionError("sink.commit_deadline called")

    def check_committable(self, handles: Sequence[Handle]) -> None:
        raise AssertionError("sink.check_committable called")

    def purge_commit_records(self, namespace: str, older_than: datetime) -> int:
        raise AssertionError("sink.purge_commit_records called")

    def committer(self) -> Committer:
        return _WholeDriverSide(self)


class _WholeDriverSide(CountingCommitter):
    """Every driver-side method, each call recorded; one orphan in doubt until aborted."""

    orphan: ClassVar[list[Handle]] = []

    def fence(self, namespace: str, query_id: str, epoch: int) -> None:
        CALLS.append("committer.fence")

    def list_in_doubt(self, namespace: str) -> list[Handle]:
        CALLS.append("committer.list_in_doubt")
        return list(self.orphan)

    def abort(self, handle: Handle) -> AbortOutcome:
        self.orphan.clear()
        return super().abort(handle)

    def commit_deadline(self, handle: Handle) -> float | None:
        CALLS.append("committer.commit_deadline")
        return None

    def check_committable(self, handles: Sequence[Handle]) -> None:
        CALLS.append("committer.check_committable")

    def purge_commit_records(self, namespace: str, older_than: datetime) -> int:
        CALLS.append("committer.purge_commit_records")
        return 0

    def commit_stages(self, handles: Sequence[Handle]) -> list[CommitStage]:
        CALLS.append("committer.commit_stages")
        return super().commit_stages(handles)

    def finish_batch(self, namespace: str, batch: int, handles: Sequence[Handle]) -> None:
        CALLS.append("committer.finish_batch")


def test_the_framework_reaches_the_driver_side_through_the_committer_alone(
        tmp_path: Path) -> None:
    """The coordinator (start, a batch, a failed batch), cleanup and status: every call they
    make on the driver side goes to the committer, none to the sink."""
    sink = _NotOnTheSink()
    store = StateStore(tmp_path / "state")
    epoch = store.start_run(NAMESPACE, {}).epoch
    _WholeDriverSide.orphan[:] = [sink.pre_commit(sink.begin_transaction(
        context(epoch=epoch - 1 if epoch > 1 else 0)))]
    with Coordinator(sink, store, namespace=NAMESPACE, epoch=epoch,
                     straggler_grace_s=0) as coordinator:
        coordinator.start(QUERY_ID)
        coordinator.commit_batch(0, QUERY_ID, [_handle_of(sink, batch=0, epoch=epoch)])
        coordinator.abort_batch(1, QUERY_ID, [_handle_of(sink, batch=1, epoch=epoch)])
    report = Report()
    clean(CleanupTarget(sink, (store,), NAMESPACE), report, dry_run=False)
    assert report.exit_code == 0, report.actions
    undecided, tombstones = status_in_target(
        store.read_existing(), "tests.repo.test_commit_home:_NotOnTheSink", {})
    assert (undecided, tombstones) == ([], (0, None))
    assert set(CALLS) >= {f"committer.{name}" for name in (
        "fence", "list_in_doubt", "commit_deadline", "check_committable", "commit_stages",
        "commit", "finish_batch", "abort", "purge_commit_records", "close")}
    assert "committer.abort" in CALLS[:CALLS.index("committer.commit")]  # the start's sweep


def _handle_of(sink: TwoPhaseCommitSink[Any], *, batch: int, epoch: int) -> Handle:
    return sink.pre_commit(sink.begin_transaction(context(batch=batch, epoch=epoch)))
