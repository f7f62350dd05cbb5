"""The keyed contract: the rules of ``mode="keyed"`` (:mod:`twophase._keyed`), as inheritable
tests every table sink passes.

A sink's test module gives the suite a fresh table per test through a :class:`KeyedTarget`
(``order_id`` its primary key, ``status`` text, ``version`` a big integer; no delete marker
column: the marker is read, never written)::

    class TestMySinkKeyed(KeyedContract):
        @pytest.fixture
        def keyed_target(self, ...):
            return MyKeyedTarget(...)

The tests drive the sink as the framework does (a task's begin/write/pre-commit, the driver's
committer) and judge by what a reader of the table sees and by the sink's tombstones. Rows are
:data:`KEYED_COLUMNS`: ``(order_id, status, version, op)`` with Debezium's ``op``
(``'c'``, ``'u'``, ``'d'``).
"""

from __future__ import annotations

import random
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from twophase._handle import Handle
from twophase.errors import ConfigurationError
from twophase.sink import Column, TwoPhaseCommitSink
from twophase.testing.contract import prepare

#: The rows of the keyed contract: a change of one order's status at a version.
KEYED_COLUMNS = (
    Column("order_id", "bigint", False),
    Column("status", "string", True),
    Column("version", "bigint", False),
    Column("op", "string", True),
)
#: The same with a boolean delete marker in place of Debezium's ``op``.
FLAGGED_COLUMNS = (*KEYED_COLUMNS[:3], Column("gone", "boolean", True))
#: How long a batch's task runs before the batch ahead of it commits (its reads begin meanwhile),
#: and how long it may take after that commit.
BEHIND_HEAD_START_S = 0.5
BEHIND_TIMEOUT_S = 60.0
#: What a reader sees: order_id -> (status, version).
State = dict[int, tuple[str | None, int]]


class KeyedTarget(ABC):
    """A fresh, empty table ``(order_id PRIMARY KEY, status, version)`` and the sinks over it."""

    @abstractmethod
    def sink(self, **options: Any) -> TwoPhaseCommitSink[Any]:
        """A sink in the keyed mode over the table: ``key=("order_id",)``,
        ``version="version"``, ``deleted="op"``, unless ``options`` say otherwise."""

    @abstractmethod
    def state(self) -> State:
        """What a reader of the table sees."""

    @abstractmethod
    def tombstones(self) -> dict[int, int]:
        """The sink's tombstones: order_id -> version."""


def change(order_id: int, version: int, status: str | None = "paid",
           op: str = "u") -> tuple[Any, ...]:
    """One row of :data:`KEYED_COLUMNS`; ``op='d'`` is a delete."""
    return (order_id, None if op == "d" else status, version, op)


def two_tasks(sink: TwoPhaseCommitSink[Any], feed: Sequence[tuple[Any, ...]]
              ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """``feed`` split between two tasks of one batch as Spark would hand it to ``sink``: by key
    where the sink needs rows routed by key (:meth:`~twophase.TwoPhaseCommitSink.route_key`),
    else round-robin, so that one key's changes reach both tasks."""
    if sink.route_key() is not None:
        return ([row for row in feed if row[0] % 2 == 0], [row for row in feed if row[0] % 2])
    return list(feed[::2]), list(feed[1::2])


class KeyedContract:
    """Every rule of the keyed mode; a subclass provides the ``keyed_target`` fixture."""

    @pytest.fixture(params=[False, True], ids=["rows", "arrow"])
    def arrow(self, request: pytest.FixtureRequest) -> bool:
        return bool(request.param)

    @pytest.fixture
    def keyed(self, keyed_target: KeyedTarget) -> TwoPhaseCommitSink[Any]:
        sink = keyed_target.sink()
        sink.check_schema(KEYED_COLUMNS)
        return sink

    def apply(self, sink: TwoPhaseCommitSink[Any], *tasks: Sequence[tuple[Any, ...]],
              batch: int = 0, arrow: bool = False,
              columns: Sequence[Column] = KEYED_COLUMNS) -> None:
        """One batch: each of ``tasks`` pre-committed by a task of its own, then committed."""
        handles: list[Handle] = [
            prepare(sink, rows, batch=batch, partition=partition, columns=columns, arrow=arrow)
            for partition, rows in enumerate(tasks)]
        with sink.committer() as committer:
            for handle in handles:
                committer.commit(handle)

    def test_one_keys_changes_in_one_task_keep_the_newest(
            self, keyed: TwoPhaseCommitSink[Any], keyed_target: KeyedTarget,
            arrow: bool) -> None:
        self.apply(keyed, [change(1, 2, "paid"), change(1, 3, "shipped"), change(1, 1, "placed"),
                           change(2, 5, "placed"), change(2, 5, "duplicate")], arrow=arrow)
        assert keyed_target.state() == {1: ("shipped", 3), 2: ("placed", 5)}

    def test_late_and_repeated_changes_are_no_ops(
            self, keyed: TwoPhaseCommitSink[Any], keyed_target: KeyedTarget,
            arrow: bool) -> None:
        self.apply(keyed, [change(1, 4, "delivered"), change(2, 2, "paid")], arrow=arrow)
        self.apply(keyed, [change(1, 2, "paid"), change(2, 2, "repeated")], batch=1,
                   arrow=arrow)
        assert keyed_target.state() == {1: ("delivered", 4), 2: ("paid", 2)}

    def test_a_late_update_after_a_delete_does_not_bring_the_key_back(
            self, keyed: TwoPhaseCommitSink[Any], keyed_target: KeyedTarget,
            arrow: bool) -> None:
        self.apply(keyed, [change(1, 1, "placed"), change(2, 1, "placed")], arrow=arrow)
        self.apply(keyed, [change(1, 5, op="d"), change(3, 2, op="d")], batch=1, arrow=arrow)
        self.apply(keyed, [change(1, 4, "shipped"), change(3, 1, "placed")], batch=2,
                   arrow=arrow)
        assert keyed_target.state() == {2: ("placed", 1)}
        assert keyed_target.tombstones() == {1: 5, 3: 2}

    @pytest.mark.parametrize("held", [False, True], ids=["never-held", "held"])
    def test_a_batch_written_while_the_one_before_commits_sees_its_deletes(
            self, keyed: TwoPhaseCommitSink[Any], keyed_target: KeyedTarget, arrow: bool,
            held: bool) -> None:
        """Commits behind the next batch: batch 2's task writes while batch 1, decided, is not
        committed yet (prepared, holding its locks). Batch 1 deletes two keys the table holds,
        or never held (a tombstone alone: no row to wait on); batch 2's older change of one is
        a no-op and its newer change of the other applies: as if batch 1 had committed
        first."""
        if held:
            self.apply(keyed, [change(1, 1, "placed"), change(2, 1, "placed")], arrow=arrow)
        deletes = prepare(keyed, [change(1, 5, op="d"), change(2, 5, op="d")], batch=1,
                          columns=KEYED_COLUMNS, arrow=arrow)
        with ThreadPoolExecutor(1) as pool:
            behind = pool.submit(prepare, keyed, [change(1, 4, "late"), change(2, 6, "newer")],
                                 batch=2, columns=KEYED_COLUMNS, arrow=arrow)
            time.sleep(BEHIND_HEAD_START_S)  # batch 2 reads the keys before batch 1 commits
            with keyed.committer() as committer:
                committer.commit(deletes)
            handle = behind.result(timeout=BEHIND_TIMEOUT_S)
        with keyed.committer() as committer:
            committer.commit(handle)
        assert keyed_target.state() == {2: ("newer", 6)}
        assert keyed_target.tombstones() == {1: 5}

    def test_a_delete_and_a_newer_insert_in_one_batch_end_inserted(
            self, keyed: TwoPhaseCommitSink[Any], keyed_target: KeyedTarget,
            arrow: bool) -> None:
        self.apply(keyed, [change(1, 1, "placed"), change(2, 1, "placed")], arrow=arrow)
        self.apply(keyed, [change(1, 2, op="d"), change(1, 3, "placed again", "c"),
                           change(2, 3, op="d"), change(2, 2, "paid")], batch=1, arrow=arrow)
        assert keyed_target.state() == {1: ("placed again", 3)}
        assert keyed_target.tombstones() == {2: 3}

    def test_a_thousand_changes_to_ten_keys_leave_the_ten_newest(
            self, keyed: TwoPhaseCommitSink[Any], keyed_target: KeyedTarget) -> None:
        feed = [change(i % 10, i, f"status {i}", "d" if i % 7 == 0 else "u")
                for i in range(1000)]
        random.Random(47).shuffle(feed)  # noqa: S311 - a test feed, not a secret
        self.apply(keyed, *two_tasks(keyed, feed))
        newest = {key: max(row[2] for row in feed if row[0] == key) for key in range(10)}
        expected = {key: (f"status {version}", version) for key, version in newest.items()
                    if version % 7}
        assert keyed_target.state() == expected
        assert keyed_target.tombstones() == {key: v for key, v in newest.items() if not v % 7}

    def test_a_boolean_marks_a_delete_too(self, keyed_target: KeyedTarget) -> None:
        sink = keyed_target.sink(deleted="gone")
        sink.check_schema(FLAGGED_COLUMNS)
        self.apply(sink, [(1, "placed", 1, False), (2, "placed", 1, None)],
                   columns=FLAGGED_COLUMNS)
        self.apply(sink, [(1, None, 2, True), (2, "paid", 2, False)], batch=1,
                   columns=FLAGGED_COLUMNS)
        assert keyed_target.state() == {2: ("paid", 2)}

    def test_tombstones_are_counted_and_purged_after_their_retention(
            self, keyed: TwoPhaseCommitSink[Any], keyed_target: KeyedTarget) -> None:
        self.apply(keyed, [change(1, 1, op="d"), change(2, 1, op="d")])
        with keyed.committer() as committer:
            count, oldest = committer.tombstones()
            assert count == 2
            assert oldest is not None and abs(oldest - datetime.now(UTC)) < timedelta(minutes=1)
            assert committer.purge_tombstones(
                datetime.now(UTC) - timedelta(hours=1)) == 0
            assert committer.purge_tombstones(
                datetime.now(UTC) + timedelta(seconds=1)) == 2
        assert keyed_target.tombstones() == {}

    def test_keyed_options_are_checked(self, keyed_target: KeyedTarget) -> None:
        with pytest.raises(ConfigurationError, match="needs the key columns and a version"):
            keyed_target.sink(version=None)
        with pytest.raises(ConfigurationError, match="belong to mode='keyed'"):
            keyed_target.sink(mode="upsert")
        with pytest.raises(ConfigurationError, match="must be different columns"):
            keyed_target.sink(version="order_id")
