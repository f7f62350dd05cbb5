"""Commits behind the next batch (twophase._pipeline) against the real SQLite sink, without
Spark: the callback returns once the batch is decided, the batch commits on a thread, the next
batch is decided only once it is committed, a failed commit behind is finished (or raised) by
the next batch, and when a query pipelines at all."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sinks.sqlite import SQLiteCommitter, SQLiteSink
from twophase import (
    CommitOutcome,
    ConfigurationError,
    FatalError,
    Handle,
    RetryableError,
    RetryPolicy,
)
from twophase._coordinator import Coordinator
from twophase._pipeline import CommitPipeline
from twophase._state import StateStore
from twophase.spark import _commits_of, _plan
from twophase.testing.contract import QUERY_ID, list_in_doubt, orders, prepare
from twophase.testing.crash import CrashSuite
from twophase.testing.driver import DriverSpec

FAST_RETRY = RetryPolicy(max_attempts=2, initial_backoff_s=0.01, max_backoff_s=0.02)
#: Long enough for a commit that should not be waited for to show that it was not.
PATIENCE_S = 5.0


class Gate:
    """Holds commits until opened; makes them fail while ``failing`` is set."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.reached = threading.Event()
        self.failing = False

    def passed(self) -> None:
        self.reached.set()
        assert self.opened.wait(PATIENCE_S), "the gate was never opened"
        if self.failing:
            raise RetryableError("the database is away (simulated)", fix="wait")


class GatedCommitter(SQLiteCommitter):
    def __init__(self, sink: GatedSink) -> None:
        super().__init__(sink)
        self.gate = sink.gate

    def commit(self, handle: Handle) -> CommitOutcome:
        self.gate.passed()
        return super().commit(handle)


class GatedSink(SQLiteSink):
    """SQLite whose commits pass a :class:`Gate` first."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = Gate()

    def committer(self) -> GatedCommitter:
        return GatedCommitter(self)


@pytest.fixture
def gated(orders_db: Path) -> GatedSink:
    return GatedSink(orders_db, "orders")


@pytest.fixture
def pipeline(gated: GatedSink, tmp_path: Path) -> Iterator[CommitPipeline]:
    store = StateStore(tmp_path / "state")
    epoch = store.start_run("orders", {}).epoch

    def coordinator() -> Coordinator:
        return Coordinator(gated, store, namespace="orders", epoch=epoch, retry=FAST_RETRY)

    pipeline = CommitPipeline(coordinator(), coordinator(), elsewhere_wait_s=0.0)
    yield pipeline
    gated.gate.opened.set()
    pipeline.close()


def visible(database: Path) -> list[int]:
    with contextlib.closing(sqlite3.connect(database)) as reader:
        return [row[0] for row in reader.execute("SELECT event_id FROM orders ORDER BY 1")]


def pending(pipeline: CommitPipeline) -> list[int]:
    state = pipeline.deciding.store.read()
    assert state is not None
    return [decision.batch for decision in state.pending]


def test_the_callback_returns_once_decided_and_the_batch_commits_behind(
        pipeline: CommitPipeline, gated: GatedSink, orders_db: Path) -> None:
    pipeline.commit_batch(0, QUERY_ID, [prepare(gated, orders(0, 3), batch=0)])
    assert gated.gate.reached.wait(PATIENCE_S)
    assert pending(pipeline) == [0] and visible(orders_db) == []  # decided, committing behind
    gated.gate.opened.set()
    pipeline.wait_for_commit()
    assert pending(pipeline) == [] and visible(orders_db) == [0, 1, 2]


def test_the_next_batch_is_decided_only_once_the_batch_behind_is_committed(
        pipeline: CommitPipeline, gated: GatedSink, orders_db: Path) -> None:
    pipeline.commit_batch(0, QUERY_ID, [prepare(gated, orders(0, 3), batch=0)])
    second = prepare(gated, orders(3, 2), batch=1)  # the next batch's task, meanwhile
    deciding = threading.Thread(target=pipeline.commit_batch, args=(1, QUERY_ID, [second]))
    deciding.start()
    deciding.join(0.5)
    assert deciding.is_alive(), "batch 1 was decided while batch 0 was not committed"
    assert pending(pipeline) == [0]
    gated.gate.opened.set()
    deciding.join(PATIENCE_S)
    pipeline.wait_for_commit()
    assert visible(orders_db) == [0, 1, 2, 3, 4] and pending(pipeline) == []
    state = pipeline.deciding.store.read()
    assert state is not None
    assert state.metrics["commit_wait_seconds:count"] == 2


def test_a_failed_commit_behind_is_finished_by_the_next_batch_first(
        pipeline: CommitPipeline, gated: GatedSink, orders_db: Path) -> None:
    gated.gate.failing = True
    gated.gate.opened.set()
    pipeline.commit_batch(0, QUERY_ID, [prepare(gated, orders(0, 3), batch=0)])
    pipeline.wait_for_commit()  # logged, not raised: batch 0 stays decided
    assert pending(pipeline) == [0] and visible(orders_db) == []
    second = prepare(gated, orders(3, 2), batch=1)
    with pytest.raises(FatalError, match=r"still failing .* away"):
        pipeline.commit_batch(1, QUERY_ID, [second])  # still failing: raised here
    assert pending(pipeline) == [0]
    gated.gate.failing = False
    pipeline.commit_batch(1, QUERY_ID, [second])  # Spark's retry after the outage
    pipeline.drain()
    assert visible(orders_db) == [0, 1, 2, 3, 4] and pending(pipeline) == []


@pytest.mark.parametrize(("trigger", "connect", "expected"), [
    (None, False, True),
    ({"processingTime": "1 second"}, False, True),
    ({"availableNow": True}, False, False),
    ({"once": True}, False, False),
    (None, True, False),
])
@pytest.mark.parametrize("foreach_batch", [None, False, True])
def test_by_default_a_stream_commits_behind_when_it_runs_until_stopped_in_classic_spark(
        trigger: dict[str, Any] | None, *, connect: bool, expected: bool,
        foreach_batch: bool | None) -> None:
    assert _plan("auto", trigger, connect=connect, foreach_batch=foreach_batch).behind is expected
    assert _plan("inline", trigger, connect=connect, foreach_batch=foreach_batch).behind is False


@pytest.mark.parametrize("trigger", [{"availableNow": True}, {"once": True}])
@pytest.mark.parametrize("foreach_batch", [None, True])
def test_a_query_that_ends_by_itself_commits_behind_when_asked_through_foreach_batch(
        trigger: dict[str, Any], foreach_batch: bool | None) -> None:
    plan = _plan("behind", trigger, connect=False, foreach_batch=foreach_batch, pyspark=(4, 3))
    assert (plan.behind, plan.foreach_batch) == (True, True)


@pytest.mark.parametrize(("trigger", "connect", "pyspark", "expected"), [
    (None, False, (4, 3), False),
    ({"availableNow": True}, False, (4, 3), False),
    (None, False, (4, 1), True),  # before 4.3, foreachBatch is the faster way
    ({"availableNow": True}, False, (4, 2), True),
    ({"continuous": "1 second"}, False, (4, 1), False),  # foreachBatch is micro-batch only
    (None, True, (4, 1), False),  # over Spark Connect the client's PySpark tells nothing
])
def test_the_way_into_the_sink_is_chosen_by_pyspark_and_spark_connect(
        trigger: dict[str, Any] | None, *, connect: bool, pyspark: tuple[int, int],
        expected: bool) -> None:
    assert _plan("auto", trigger, connect=connect, foreach_batch=None,
                 pyspark=pyspark).foreach_batch is expected
    for forced in (False, True):  # the escape hatch
        assert _plan("auto", trigger, connect=connect, foreach_batch=forced,
                     pyspark=pyspark).foreach_batch is forced


@pytest.mark.parametrize(("commits", "trigger", "connect", "foreach_batch", "message", "fix"), [
    ("behind", {"availableNow": True}, False, False, "ends by itself",
     "leave foreach_batch out"),
    ("behind", {"once": True}, False, False, "ends by itself", "leave foreach_batch out"),
    ("behind", None, True, None, "over Spark Connect", "leave commits out"),
    ("behind", None, True, True, "over Spark Connect", "leave commits out"),
    ("later", None, False, None, "is none of 'auto', 'behind', 'inline'", "leave it out"),
])
def test_commits_where_nothing_could_commit_behind_are_refused(
        commits: Any, trigger: dict[str, Any] | None, *, connect: bool,
        foreach_batch: bool | None, message: str, fix: str) -> None:
    with pytest.raises(ConfigurationError, match=f"{message}.*Fix: {fix}"):
        _plan(commits, trigger, connect=connect, foreach_batch=foreach_batch)


@pytest.mark.parametrize(("pipelined", "commits"), [(True, "behind"), (False, "inline"),
                                                    (None, "auto")])
def test_the_deprecated_pipelined_commits_asks_for_commits(
        pipelined: bool | None, commits: str) -> None:
    assert _commits_of("auto", {"pipelined_commits": pipelined}) == commits
    with pytest.raises(ConfigurationError, match="Fix: pass commits= alone"):
        _commits_of("inline", {"pipelined_commits": True})


def test_a_long_lived_coordinator_sweeps_at_its_first_batch_after_a_failure_and_by_interval(
        sqlite_sink: SQLiteSink, tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    epoch = store.start_run("orders", {}).epoch
    run = Coordinator(sqlite_sink, store, namespace="orders", epoch=epoch, retry=FAST_RETRY,
                      sweep_interval_s=3600, straggler_grace_s=0)
    run.commit_batch(0, QUERY_ID, [prepare(sqlite_sink, orders(0, 1), batch=0, epoch=epoch)])
    orphan = prepare(sqlite_sink, orders(10, 1), batch=1, attempt=7, epoch=epoch)
    run.commit_batch(1, QUERY_ID, [prepare(sqlite_sink, orders(1, 1), batch=1, epoch=epoch)])
    assert orphan.txn_id in {h.txn_id for h in list_in_doubt(sqlite_sink, "orders")}  # not due
    run.abort_batch(2, QUERY_ID, [])  # a failed batch: the next sweep is due at once
    assert list_in_doubt(sqlite_sink, "orders") == []
    orphan = prepare(sqlite_sink, orders(20, 1), batch=3, attempt=7, epoch=epoch)
    run.sweep_next_batch()
    run.commit_batch(3, QUERY_ID, [prepare(sqlite_sink, orders(3, 1), batch=3, epoch=epoch)])
    assert list_in_doubt(sqlite_sink, "orders") == []


def test_the_testing_harness_s_deprecated_pipelined_commits_sets_commits(tmp_path: Path) -> None:
    """``DriverSpec(pipelined_commits=...)`` and a crash suite's ``pipelined_commits = ...``
    (deprecated in 0.5.0) still work, each with a warning naming ``commits``."""
    with pytest.warns(DeprecationWarning, match="DriverSpec's pipelined_commits is deprecated"
                      ".*set commits='behind'"):
        spec = DriverSpec(input_dir=str(tmp_path), checkpoint=str(tmp_path / "ckpt"),
                          sink_factory="sinks.sqlite:SQLiteSink", pipelined_commits=True)
    assert (spec.commits, spec.pipelined_commits) == ("behind", None)
    assert spec.fields_set().get("commits") == "behind"  # what the driver process is told
    with pytest.warns(DeprecationWarning, match="Inline's pipelined_commits is deprecated"):
        class Inline(CrashSuite):
            pipelined_commits = False
    assert Inline.commits == "inline"
