"""The keyed mode of a lake table (Delta, Iceberg): the keyed contract, judged by DuckDB, and
what only a lake table needs: nothing staged left after the sweep, one commit per batch
carrying each transaction's proof, a crash between the tombstones and the table's commit, a
lost staged file, two committers racing on one batch, another writer's append during the
apply. A sink's module subclasses :class:`LakeKeyedSuite` with a ``keyed_target`` fixture.
"""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from twophase import CommitOutcome, RetryableError, TransactionLostError, TwoPhaseCommitSink
from twophase._handle import Handle
from twophase.testing.contract import NAMESPACE, prepare
from twophase.testing.keyed import KEYED_COLUMNS, KeyedContract, KeyedTarget, change

#: Racing trials in CI (``-m long``: :data:`LONG_RACES`).
CI_RACES, LONG_RACES = 3, 100
#: How many times a racing committer retries its conflicts, as the driver would.
RETRIES = 20
#: The other writer's rows: keys no batch of the tests touches.
OTHER_KEYS = (100, 101)
#: The other writer's version of a key the batch inserts: newer than the batch's.
OTHER_VERSION = 5


class LakeKeyedTarget(KeyedTarget):
    """A keyed lake table, with what the lake suite reads of it."""

    #: The committer module's name of the function that makes the table's commit (the suite
    #: replaces it to crash or to race another writer).
    apply_function: str

    @abstractmethod
    def left_behind(self) -> set[str]:
        """Intents and staged files left under the table's ``_twophase`` folder."""

    @abstractmethod
    def commits(self) -> int:
        """How many commits the table has had (its version)."""

    @abstractmethod
    def keys_read(self) -> list[int]:
        """Every row's key as a reader sees it, duplicates included."""

    @abstractmethod
    def append_other(self, keys: tuple[int, ...], version: int) -> None:
        """Another writer's plain append of ``(key, "other", version)`` rows."""

    @abstractmethod
    def created(self) -> bool:
        """Whether the table exists yet."""

    @abstractmethod
    def maintain(self) -> None:
        """The format's own maintenance, as an operator runs it (compaction, removal of the
        files no version needs, snapshot expiry), at once."""


def checked(target: KeyedTarget, **options: Any) -> TwoPhaseCommitSink[Any]:
    sink = target.sink(**options)
    sink.check_schema(KEYED_COLUMNS)
    return sink


def race(sink: TwoPhaseCommitSink[Any], handles: list[Handle], committers: int = 2
         ) -> list[CommitOutcome]:
    """``committers`` committers settle one decided batch at once, each retrying its
    conflicts as the driver does: every committer's outcome of every handle."""
    start = threading.Barrier(committers)

    def settle() -> dict[Any, CommitOutcome]:
        with sink.committer() as committer:
            start.wait()
            for _ in range(RETRIES):
                try:
                    return dict(committer.settle(tuple(handles)))  # type: ignore[attr-defined]
                except RetryableError:
                    continue
        raise AssertionError("never settled")

    with ThreadPoolExecutor(committers) as pool:
        results = list(pool.map(lambda _: settle(), range(committers)))
    return [result[handle.txn_id] for result in results for handle in handles]


class LakeKeyedSuite(KeyedContract):
    """Every rule of the keyed mode, and the lake's own cases (module docstring); after each
    test no key is there twice, the sweep finds nothing in doubt and nothing staged is left."""

    @pytest.fixture(autouse=True)
    def swept(self, keyed_target: LakeKeyedTarget) -> Iterator[None]:
        yield
        if keyed_target.created():
            keys = keyed_target.keys_read()
            assert len(keys) == len(set(keys)), "a key is there twice"
            with keyed_target.sink().committer() as committer:
                assert committer.list_in_doubt(NAMESPACE) == []
        assert keyed_target.left_behind() == set()

    def test_one_commit_per_batch_carries_each_transactions_proof(
            self, keyed_target: LakeKeyedTarget) -> None:
        sink = checked(keyed_target)
        handles = [prepare(sink, rows, batch=0, partition=partition, columns=KEYED_COLUMNS)
                   for partition, rows in enumerate([[change(1, 1)], [change(2, 1)], []])]
        before = keyed_target.commits()
        with sink.committer() as committer:
            assert committer.settle(tuple(handles)) == {  # type: ignore[attr-defined]
                handles[0].txn_id: CommitOutcome.COMMITTED,
                handles[1].txn_id: CommitOutcome.COMMITTED,
                handles[2].txn_id: CommitOutcome.ALREADY_COMMITTED}
            assert keyed_target.commits() == before + 1
            assert {committer.commit(handle) for handle in handles} == {
                CommitOutcome.ALREADY_COMMITTED}
            committer.finish_batch(NAMESPACE, 0, handles)
        assert keyed_target.state() == {1: ("paid", 1), 2: ("paid", 1)}

    def test_a_batch_with_nothing_newer_commits_its_proof_alone(
            self, keyed_target: LakeKeyedTarget) -> None:
        sink = checked(keyed_target)
        self.apply(sink, [change(1, 5, "delivered")])
        late = prepare(sink, [change(1, 2, "paid")], batch=1, columns=KEYED_COLUMNS)
        with sink.committer() as committer:
            assert committer.commit(late) is CommitOutcome.COMMITTED
            assert committer.commit(late) is CommitOutcome.ALREADY_COMMITTED
        assert keyed_target.state() == {1: ("delivered", 5)}

    def test_a_crash_between_the_tombstones_and_the_commit_ends_as_one_commit(
            self, keyed_target: LakeKeyedTarget, monkeypatch: pytest.MonkeyPatch) -> None:
        """The tombstones are written, the table's commit fails (a crash): the retry still
        deletes the row (a delete equal to its own tombstone applies to an older row) and
        inserts the key written again (its tombstone already cleared)."""
        sink = checked(keyed_target)
        self.apply(sink, [change(1, 1, "placed"), change(2, 1, "placed")])
        self.apply(sink, [change(2, 2, op="d")], batch=1)
        handle = prepare(sink, [change(1, 3, op="d"), change(2, 4, "back")], batch=2,
                         columns=KEYED_COLUMNS)

        def crash(*args: Any, **kwargs: Any) -> None:
            raise OSError("killed between the tombstones and the table's commit")

        with monkeypatch.context() as patched:
            patched.setattr(keyed_target.apply_function, crash)
            with sink.committer() as committer, pytest.raises(Exception, match="killed"):
                committer.commit(handle)
        assert keyed_target.tombstones() == {1: 3}
        assert keyed_target.state() == {1: ("placed", 1)}
        with sink.committer() as committer:
            assert committer.commit(handle) is CommitOutcome.COMMITTED
        assert keyed_target.state() == {2: ("back", 4)}
        assert keyed_target.tombstones() == {1: 3}

    def test_a_partitioned_table_moves_a_key_between_partitions(
            self, keyed_target: LakeKeyedTarget) -> None:
        """Partitioned by the column a change updates: the key's row leaves its partition."""
        sink = checked(keyed_target, partition_by=("status",))
        self.apply(sink, [change(1, 1, "placed"), change(2, 1, "placed"), change(3, 1, "paid")])
        self.apply(sink, [change(1, 2, "paid"), change(2, 2, op="d"), change(3, 2, "shipped")],
                   batch=1, arrow=True)
        assert keyed_target.state() == {1: ("paid", 2), 3: ("shipped", 2)}

    def test_maintenance_between_a_batchs_stage_and_its_commit_keeps_both(
            self, keyed_target: LakeKeyedTarget) -> None:
        """Compaction, VACUUM / expiry run while a decided batch is staged: they never touch
        the staged files, and the batch applies on the maintained table."""
        sink = checked(keyed_target)
        for batch in range(3):
            self.apply(sink, [change(key, batch + 1, f"status {batch}") for key in range(5)],
                       batch=batch)
        staged = prepare(sink, [change(0, 9, op="d"), change(1, 9, "last")], batch=3,
                         columns=KEYED_COLUMNS)
        keyed_target.maintain()
        with sink.committer() as committer:
            assert committer.commit(staged) is CommitOutcome.COMMITTED
        keyed_target.maintain()
        assert keyed_target.state() == {1: ("last", 9), **{
            key: ("status 2", 3) for key in range(2, 5)}}

    def test_a_lost_staged_file_loses_the_transaction_and_applies_nothing(
            self, keyed_target: LakeKeyedTarget) -> None:
        sink = checked(keyed_target)
        kept = prepare(sink, [change(1, 1)], batch=0, partition=0, columns=KEYED_COLUMNS)
        lost = prepare(sink, [change(2, 1)], batch=0, partition=1, columns=KEYED_COLUMNS)
        sink.storage.delete([staged.path for staged in sink.staged_in(lost)])  # type: ignore[attr-defined]
        with sink.committer() as committer:
            with pytest.raises(TransactionLostError, match="staged changes"):
                committer.settle((kept, lost))  # type: ignore[attr-defined]
            assert committer.abort(kept) is not None and committer.abort(lost) is not None
        assert keyed_target.state() == {}

    @pytest.mark.parametrize("trial", range(CI_RACES))
    def test_two_committers_racing_on_one_batch_make_one_commit(
            self, keyed_target: LakeKeyedTarget, trial: int) -> None:
        self.assert_one_commit_per_race(keyed_target, trial)

    @pytest.mark.long
    @pytest.mark.parametrize("trial", range(LONG_RACES))
    def test_two_committers_racing_a_hundred_times(
            self, keyed_target: LakeKeyedTarget, trial: int) -> None:
        self.assert_one_commit_per_race(keyed_target, trial)

    def assert_one_commit_per_race(self, target: LakeKeyedTarget, trial: int) -> None:
        sink = checked(target)
        self.apply(sink, [change(key, 1, "placed") for key in range(10)])
        version = 2 + trial
        handles = [prepare(sink, [change(key, version, op="d" if key % 3 == 0 else "u")
                                  for key in range(partition, 10, 2)],
                           batch=1, partition=partition, columns=KEYED_COLUMNS)
                   for partition in range(2)]
        before = target.commits()
        outcomes = race(sink, handles)
        assert outcomes.count(CommitOutcome.COMMITTED) == len(handles), outcomes
        assert target.commits() == before + 1
        assert target.state() == {key: ("paid", version) for key in range(10) if key % 3}
        assert target.tombstones() == {key: version for key in range(0, 10, 3)}

    @pytest.mark.parametrize("overlapping", [False, True], ids=["other-keys", "a-key-of-the-batch"])
    def test_another_writers_append_during_the_apply_lands_and_nothing_doubles(
            self, keyed_target: LakeKeyedTarget, monkeypatch: pytest.MonkeyPatch,
            overlapping: bool) -> None:
        """Another writer appends between the committer's read and its commit: keys the batch
        does not touch (the format may rebase the commit over it, or fail it as a conflict
        and the retry reads again), or, newer, a key the batch inserts (a conflict: the retry
        reads it and drops the batch's older insert). Both land, each key once."""
        sink = checked(keyed_target)
        self.apply(sink, [change(key, 1, "placed") for key in range(4)])
        handle = prepare(sink, [change(key, 2, "paid") for key in range(5)], batch=1,
                         columns=KEYED_COLUMNS)
        other, version = ((4,), OTHER_VERSION) if overlapping else (OTHER_KEYS, 1)
        module, _, name = keyed_target.apply_function.rpartition(".")
        apply = getattr(__import__(module, fromlist=[name]), name)

        def append_first(*args: Any, **kwargs: Any) -> None:
            monkeypatch.setattr(keyed_target.apply_function, apply)
            keyed_target.append_other(other, version)
            apply(*args, **kwargs)

        monkeypatch.setattr(keyed_target.apply_function, append_first)
        with sink.committer() as committer:
            try:
                outcome = committer.commit(handle)
            except RetryableError:
                outcome = committer.commit(handle)
            assert outcome is CommitOutcome.COMMITTED
        expected = {**{key: ("paid", 2) for key in range(5)},
                    **{key: ("other", version) for key in other}}
        assert keyed_target.state() == expected
        assert sorted(keyed_target.keys_read()) == sorted(expected), "a key is there twice"
