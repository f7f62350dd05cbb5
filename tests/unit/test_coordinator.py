"""The driver-side protocol against the real SQLite sink, without Spark."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from sinks.sqlite import SQLiteSink
from twophase import ConfigurationError, FatalError, FencedError, RetryPolicy, TransactionLostError
from twophase._coordinator import Coordinator
from twophase._state import HISTORY_LIMIT, Decision, StateStore
from twophase.testing.contract import (
    OTHER_QUERY_ID,
    QUERY_ID,
    abort,
    list_in_doubt,
    orders,
    prepare,
)

FAST_RETRY = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02)


def start_run(sink: SQLiteSink, tmp_path: Path) -> Coordinator:
    store = StateStore(tmp_path / "state")
    epoch = store.start_run("orders", {}).epoch
    return Coordinator(sink, store, namespace="orders", epoch=epoch, retry=FAST_RETRY)


def event_ids(reader: sqlite3.Connection) -> list[int]:
    return [row[0] for row in reader.execute("SELECT event_id FROM orders ORDER BY 1")]


def test_a_batch_is_decided_committed_and_marked_done(
    sqlite_sink: SQLiteSink, sqlite_reader: sqlite3.Connection, tmp_path: Path
) -> None:
    run = start_run(sqlite_sink, tmp_path)
    handles = [prepare(sqlite_sink, orders(0, 3), partition=0),
               prepare(sqlite_sink, orders(3, 2), partition=1)]
    run.commit_batch(0, QUERY_ID, handles)
    assert event_ids(sqlite_reader) == [0, 1, 2, 3, 4]
    state = run.store.read()
    assert state is not None
    assert (state.last_done_batch, state.pending, state.query_id) == (0, (), QUERY_ID)
    (record,) = state.history
    assert (record.batch, record.txns, record.rows, record.already_committed) == (0, 2, 5, 0)


def test_a_replayed_batch_aborts_its_new_transactions_and_commits_nothing_twice(
    sqlite_sink: SQLiteSink, sqlite_reader: sqlite3.Connection, tmp_path: Path
) -> None:
    run = start_run(sqlite_sink, tmp_path)
    run.commit_batch(0, QUERY_ID, [prepare(sqlite_sink, orders(0, 3), attempt=1)])
    replay = [prepare(sqlite_sink, orders(0, 3), attempt=2)]
    run.commit_batch(0, QUERY_ID, replay)
    assert event_ids(sqlite_reader) == [0, 1, 2]
    assert list_in_doubt(sqlite_sink, "orders") == []


def test_orphans_of_failed_attempts_and_older_runs_are_aborted_others_kept(
    sqlite_sink: SQLiteSink, sqlite_reader: sqlite3.Connection, tmp_path: Path
) -> None:
    store = StateStore(tmp_path / "state")
    store.start_run("orders", {})
    older_run_orphan = prepare(sqlite_sink, orders(100, 1), batch=5, epoch=1)
    run = start_run(sqlite_sink, tmp_path)  # epoch 2
    failed_attempt = prepare(sqlite_sink, orders(200, 1), batch=0, attempt=1, epoch=2)
    other_query = prepare(sqlite_sink, orders(300, 1), batch=0, query_id=OTHER_QUERY_ID, epoch=2)
    future_batch = prepare(sqlite_sink, orders(400, 1), batch=1, epoch=2)
    newer_run = prepare(sqlite_sink, orders(500, 1), batch=0, epoch=3)
    winner = prepare(sqlite_sink, orders(0, 1), batch=0, attempt=2, epoch=2)

    run.commit_batch(0, QUERY_ID, [winner])

    in_doubt = {h.txn_id for h in list_in_doubt(sqlite_sink, "orders")}
    assert older_run_orphan.txn_id not in in_doubt
    assert failed_attempt.txn_id not in in_doubt
    assert in_doubt == {other_query.txn_id, future_batch.txn_id, newer_run.txn_id}
    assert event_ids(sqlite_reader) == [0]


def test_recovery_commits_what_an_earlier_run_decided_oldest_first(
    sqlite_sink: SQLiteSink, sqlite_reader: sqlite3.Connection, tmp_path: Path
) -> None:
    crashed = start_run(sqlite_sink, tmp_path)
    decisions = [Decision(batch, crashed.epoch, 0.0, (prepare(sqlite_sink, orders(batch * 10, 2),
                                                              batch=batch),))
                 for batch in (1, 0)]
    crashed.store.update(lambda s: replace(s, pending=tuple(decisions)), epoch=crashed.epoch)

    start_run(sqlite_sink, tmp_path).recover()

    assert event_ids(sqlite_reader) == [0, 1, 10, 11]
    after = crashed.store.read()
    assert after is not None
    assert (after.pending, after.last_done_batch) == ((), 1)
    assert [record.batch for record in after.history] == [0, 1]


def test_a_zombie_run_is_refused_and_changes_nothing(
    sqlite_sink: SQLiteSink, sqlite_reader: sqlite3.Connection, tmp_path: Path
) -> None:
    zombie = start_run(sqlite_sink, tmp_path)
    handles = [prepare(sqlite_sink, orders(0, 2), epoch=zombie.epoch)]
    newer = start_run(sqlite_sink, tmp_path)
    before = zombie.store.read()

    with pytest.raises(FencedError, match=rf"epoch {zombie.epoch}\) was fenced"):
        zombie.commit_batch(0, QUERY_ID, handles)

    after = zombie.store.read()  # the zombie only counted itself fenced (see _metrics)
    assert before is not None and after is not None
    assert replace(after, metrics={}) == replace(before, metrics={})
    assert after.metrics == {"runs_fenced": 1}
    assert event_ids(sqlite_reader) == []
    # The newer run replays batch 0 and sweeps the zombie's prepared transaction.
    newer.commit_batch(0, QUERY_ID, [prepare(sqlite_sink, orders(0, 2), epoch=newer.epoch)])
    assert event_ids(sqlite_reader) == [0, 1]
    assert list_in_doubt(sqlite_sink, "orders") == []


def test_a_decided_transaction_aborted_outside_is_reported_lost_and_stays_pending(
    sqlite_sink: SQLiteSink, tmp_path: Path
) -> None:
    run = start_run(sqlite_sink, tmp_path)
    handle = prepare(sqlite_sink, orders(0, 2))
    run.store.update(lambda s: replace(s, pending=(Decision(0, run.epoch, 0.0, (handle,)),)),
                     epoch=run.epoch)
    abort(sqlite_sink, handle)  # an operator's over-eager cleanup

    with pytest.raises(TransactionLostError, match=f"transaction {handle.txn_id}"):
        start_run(sqlite_sink, tmp_path).recover()
    state = run.store.read()
    assert state is not None and [d.batch for d in state.pending] == [0]


def test_a_commit_that_keeps_failing_surfaces_after_bounded_retries_then_recovers(
    orders_db: Path, sqlite_reader: sqlite3.Connection, tmp_path: Path
) -> None:
    sink = SQLiteSink(orders_db, "orders", busy_timeout_s=0.01)
    run = start_run(sink, tmp_path)
    handle = prepare(sink, orders(0, 2))
    blocker = sqlite3.connect(orders_db, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")  # another process holds the database

    with pytest.raises(FatalError, match=r"commit of transaction .* failing after 3 attempts"):
        run.commit_batch(0, QUERY_ID, [handle])

    blocker.execute("ROLLBACK")
    blocker.close()
    state = run.store.read()
    assert state is not None and [d.batch for d in state.pending] == [0]  # decided, kept
    start_run(sink, tmp_path).recover()
    assert event_ids(sqlite_reader) == [0, 1]


def test_abort_never_touches_a_decided_batch(
    sqlite_sink: SQLiteSink, sqlite_reader: sqlite3.Connection, tmp_path: Path
) -> None:
    run = start_run(sqlite_sink, tmp_path)
    handle = prepare(sqlite_sink, orders(0, 1))
    run.commit_batch(0, QUERY_ID, [handle])
    run.abort_batch(0, QUERY_ID, [handle])
    assert event_ids(sqlite_reader) == [0]


def test_history_stays_bounded(sqlite_sink: SQLiteSink, tmp_path: Path) -> None:
    run = start_run(sqlite_sink, tmp_path)
    for batch in range(HISTORY_LIMIT + 5):
        run.commit_batch(batch, QUERY_ID, [])
    state = run.store.read()
    assert state is not None
    assert len(state.history) == HISTORY_LIMIT
    assert state.history[-1].batch == HISTORY_LIMIT + 4


def test_a_new_run_aborts_earlier_runs_orphans_before_it_writes(
    sqlite_sink: SQLiteSink, sqlite_reader: sqlite3.Connection, tmp_path: Path
) -> None:
    """Orphans hold locks in a database: the replay of their batch must not wait for them."""
    crashed = start_run(sqlite_sink, tmp_path)
    crashed.commit_batch(0, QUERY_ID, [prepare(sqlite_sink, orders(0, 1), batch=0)])
    orphan = prepare(sqlite_sink, orders(1, 1), batch=1, epoch=crashed.epoch)
    other_query = prepare(sqlite_sink, orders(2, 1), batch=1, query_id=OTHER_QUERY_ID)

    start_run(sqlite_sink, tmp_path).start(QUERY_ID)

    in_doubt = {h.txn_id for h in list_in_doubt(sqlite_sink, "orders")}
    assert orphan.txn_id not in in_doubt
    assert in_doubt == {other_query.txn_id}
    assert event_ids(sqlite_reader) == [0]


def test_a_handle_of_another_sink_kind_is_refused_before_the_sink_sees_it(
    sqlite_sink: SQLiteSink, tmp_path: Path
) -> None:
    coordinator = start_run(sqlite_sink, tmp_path)
    foreign = replace(prepare(sqlite_sink, orders(0, 1), epoch=coordinator.epoch), sink="mysql")
    with pytest.raises(ConfigurationError, match="written by a 'mysql' sink"):
        coordinator.commit_batch(0, QUERY_ID, [foreign])
    assert list_in_doubt(sqlite_sink, "orders") == [replace(foreign, sink="sqlite", rows=1)]
