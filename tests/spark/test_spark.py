"""twophase.spark through real PySpark (one shared local session), SQLite as the target."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from sinks.sqlite import SQLiteCommitter, SQLiteSink
from twophase import CommitOutcome, ConfigurationError, Handle, SchemaMismatchError
from twophase._pipeline import COMMIT_BEHIND_THREAD
from twophase._spark import RunConfig, register_data_source
from twophase._state import Decision, StateStore
from twophase._workers import WORKER_TUNING_ENV
from twophase.spark import write, write_stream
from twophase.testing.contract import OPENED_AT, QUERY_ID, list_in_doubt, prepare
from twophase.testing.driver import FEED_SCHEMA, generate_feed, read_feed

pytestmark = pytest.mark.spark

FILES, ROWS_PER_FILE = 4, 150
#: A commit slowed so that not waiting for it shows.
SLOW_COMMIT_S = 0.4


@pytest.fixture
def feed(tmp_path: Path) -> Path:
    directory = tmp_path / "feed"
    generate_feed(directory, files=FILES, rows_per_file=ROWS_PER_FILE)
    return directory


def run_to_end(spark: SparkSession, feed: Path, sink: SQLiteSink, checkpoint: Path,
               **options: Any) -> None:
    query = write_stream(read_feed(spark, feed), sink, checkpoint_location=str(checkpoint),
                         trigger={"availableNow": True}, **options)
    query.awaitTermination()


def assert_exactly_once(reader: sqlite3.Connection, sink: SQLiteSink, expected: int) -> None:
    ids = [row[0] for row in reader.execute("SELECT event_id FROM orders ORDER BY event_id")]
    assert ids == list(range(expected))  # none missing, none twice
    assert list_in_doubt(sink, "orders") == []


def test_a_stream_delivers_every_row_exactly_once(
    spark: SparkSession, feed: Path, sqlite_sink: SQLiteSink, sqlite_reader: sqlite3.Connection,
    tmp_path: Path, foreach_batch: bool,
) -> None:
    run_to_end(spark, feed, sqlite_sink, tmp_path / "ckpt", foreach_batch=foreach_batch)
    assert_exactly_once(sqlite_reader, sqlite_sink, FILES * ROWS_PER_FILE)
    state = StateStore(tmp_path / "ckpt" / "twophase").read()
    assert state is not None
    assert (state.last_done_batch, state.pending) == (FILES - 1, ())
    assert [r.rows for r in state.history] == [ROWS_PER_FILE] * FILES
    assert all(r.txns == 2 for r in state.history)


@pytest.mark.parametrize("asked", [{"commits": "behind"}, {"pipelined_commits": True}],
                         ids=["commits", "deprecated-pipelined-commits"])
def test_a_query_that_ends_by_itself_and_pipelines_returns_once_its_last_batch_is_visible(
    spark: SparkSession, feed: Path, sqlite_sink: SQLiteSink, sqlite_reader: sqlite3.Connection,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, asked: dict[str, Any],
) -> None:
    """``availableNow`` with ``commits="behind"`` (through foreachBatch, chosen for it; or
    the deprecated ``pipelined_commits=True``, with a warning): each batch commits behind the
    next on a thread of this process, slowed here so that a query reported finished before
    its last commit would show it; ``awaitTermination`` returns after that commit."""
    behind: list[bool] = []
    commit = SQLiteCommitter.commit

    def slow_commit(self: SQLiteCommitter, handle: Handle) -> CommitOutcome:
        behind.append(threading.current_thread().name.startswith(COMMIT_BEHIND_THREAD))
        time.sleep(SLOW_COMMIT_S)
        return commit(self, handle)

    monkeypatch.setattr(SQLiteCommitter, "commit", slow_commit)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always", DeprecationWarning)
        run_to_end(spark, feed, sqlite_sink, tmp_path / "ckpt", **asked)
    ours = [w for w in warned if w.category is DeprecationWarning
            and str(w.message).startswith("write_stream(")]
    assert [(str(w.message).split(": ")[-1], w.filename) for w in ours] == (
        [("pass commits='behind' (for True) or commits='inline' (for False)", __file__)]
        if "pipelined_commits" in asked else [])  # named at the caller's line
    assert_exactly_once(sqlite_reader, sqlite_sink, FILES * ROWS_PER_FILE)
    state = StateStore(tmp_path / "ckpt" / "twophase").read()
    assert state is not None and (state.last_done_batch, state.pending) == (FILES - 1, ())
    assert behind and all(behind), "a batch committed in the callback, not behind it"


def test_a_batch_spark_replays_after_the_sink_committed_commits_nothing_twice(
    spark: SparkSession, feed: Path, sqlite_sink: SQLiteSink, sqlite_reader: sqlite3.Connection,
    tmp_path: Path,
) -> None:
    checkpoint = tmp_path / "ckpt"
    run_to_end(spark, feed, sqlite_sink, checkpoint)
    # A crash after twophase committed batch N but before Spark wrote commits/N:
    for name in (str(FILES - 1), f".{FILES - 1}.crc"):
        (checkpoint / "commits" / name).unlink()
    run_to_end(spark, feed, sqlite_sink, checkpoint)
    assert_exactly_once(sqlite_reader, sqlite_sink, FILES * ROWS_PER_FILE)
    state = StateStore(checkpoint / "twophase").read()
    assert state is not None and state.epoch == 2
    assert (checkpoint / "commits" / str(FILES - 1)).exists()


def test_a_batch_job_is_one_decision_and_the_next_job_the_next_batch(
    spark: SparkSession, sqlite_sink: SQLiteSink, sqlite_reader: sqlite3.Connection,
    tmp_path: Path,
) -> None:
    jobs = [[(i, i, "paid", None) for i in range(first, first + 50)] for first in (0, 50)]
    for rows in jobs:
        df = spark.createDataFrame(rows, FEED_SCHEMA).repartition(3)
        write(df, sqlite_sink, state_location=str(tmp_path / "job-state"))
    assert_exactly_once(sqlite_reader, sqlite_sink, 100)
    state = StateStore(tmp_path / "job-state").read()
    assert state is not None
    assert [(r.batch, r.rows, r.txns) for r in state.history] == [(0, 50, 3), (1, 50, 3)]


def test_a_batch_job_after_one_that_crashed_after_deciding_delivers_both(
    spark: SparkSession, sqlite_sink: SQLiteSink, sqlite_reader: sqlite3.Connection,
    tmp_path: Path,
) -> None:
    """A job killed between its decision and its commit leaves batch 0 pending; the next job
    finishes it and writes its own rows as batch 1 (not as a "replay" of batch 0)."""
    store = StateStore(tmp_path / "job-state")
    epoch = store.start_run("orders", {"kind": "batch"}).epoch
    crashed = prepare(sqlite_sink, [(i, i, "paid", None) for i in range(50)], epoch=epoch)
    store.update(lambda s: replace(s, query_id=QUERY_ID, pending=(
        Decision(0, epoch, OPENED_AT, (crashed,)),)), epoch=epoch)
    df = spark.createDataFrame([(i, i, "paid", None) for i in range(50, 100)], FEED_SCHEMA)
    write(df, sqlite_sink, state_location=str(tmp_path / "job-state"))
    assert_exactly_once(sqlite_reader, sqlite_sink, 100)
    state = store.read()
    assert state is not None and [r.batch for r in state.history] == [0, 1]


def rewrite_keeping_mtime(path: Path, lines: list[str]) -> None:
    stat = path.stat()
    path.write_text("\n".join(lines) + "\n")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_a_row_that_does_not_fit_stops_the_query_then_the_fixed_restart_delivers_all(
    spark: SparkSession, feed: Path, sqlite_sink: SQLiteSink, sqlite_reader: sqlite3.Connection,
    tmp_path: Path,
) -> None:
    bad_file = sorted(feed.iterdir())[2]
    good_lines = bad_file.read_text().splitlines()
    bad_event = json.loads(good_lines[7])
    bad_lines = list(good_lines)
    bad_lines[7] = json.dumps({**bad_event, "status": "bogus"})  # fails CHECK (status <> 'bogus')
    rewrite_keeping_mtime(bad_file, bad_lines)  # the file source orders files by mtime

    with pytest.raises(StreamingQueryException, match=r"CHECK constraint failed.*Fix: a row "
                       r"violates a constraint of the target.*correct or filter"):
        run_to_end(spark, feed, sqlite_sink, tmp_path / "ckpt")
    # Batches 0 and 1 are in; nothing of batch 2 is visible; nothing is left in doubt.
    assert_exactly_once(sqlite_reader, sqlite_sink, 2 * ROWS_PER_FILE)

    rewrite_keeping_mtime(bad_file, good_lines)  # the operator fixes the input
    run_to_end(spark, feed, sqlite_sink, tmp_path / "ckpt")
    assert_exactly_once(sqlite_reader, sqlite_sink, FILES * ROWS_PER_FILE)


def test_an_unwritable_state_location_fails_before_the_start_then_the_fix_delivers_all(
    spark: SparkSession, feed: Path, sqlite_sink: SQLiteSink, sqlite_reader: sqlite3.Connection,
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(ConfigurationError,
                       match=f"cannot write the state location {blocker}/state.*Fix: give"):
        run_to_end(spark, feed, sqlite_sink, tmp_path / "ckpt",
                   state_location=str(blocker / "state"))
    assert not (tmp_path / "ckpt").exists()
    assert_exactly_once(sqlite_reader, sqlite_sink, 0)

    run_to_end(spark, feed, sqlite_sink, tmp_path / "ckpt", state_location=str(tmp_path / "state"))
    assert_exactly_once(sqlite_reader, sqlite_sink, FILES * ROWS_PER_FILE)


@pytest.mark.parametrize(("options", "error", "message"), [
    ({"checkpoint_location": ""}, ConfigurationError, "write_stream needs checkpoint_location"),
    ({"namespace": "has space"}, ConfigurationError, "namespace 'has space' is not usable"),
    ({"state_location": "hdfs://nn/state"}, ConfigurationError, "on a local file system or on S3"),
])
def test_a_missing_or_wrong_option_is_named_before_anything_is_written(
    spark: SparkSession, feed: Path, sqlite_sink: SQLiteSink, sqlite_reader: sqlite3.Connection,
    tmp_path: Path, options: dict[str, str], error: type[Exception], message: str,
) -> None:
    arguments: dict[str, Any] = {"checkpoint_location": str(tmp_path / "ckpt"), **options}
    with pytest.raises(error, match=f"{message}.*Fix: "):
        write_stream(read_feed(spark, feed), sqlite_sink, **arguments)
    assert_exactly_once(sqlite_reader, sqlite_sink, 0)
    run_to_end(spark, feed, sqlite_sink, tmp_path / "ckpt")
    assert_exactly_once(sqlite_reader, sqlite_sink, FILES * ROWS_PER_FILE)


def test_rows_with_a_column_the_table_lacks_are_refused_before_the_start(
    spark: SparkSession, feed: Path, sqlite_sink: SQLiteSink, tmp_path: Path,
) -> None:
    df = read_feed(spark, feed).withColumnRenamed("status", "state")
    with pytest.raises(SchemaMismatchError,
                       match=r"table 'orders' of SQLite .* has no column 'state'"):
        write_stream(df, sqlite_sink, checkpoint_location=str(tmp_path / "ckpt"))
    with pytest.raises(ConfigurationError, match="is not a TwoPhaseCommitSink"):
        write_stream(df, object(), checkpoint_location=str(tmp_path / "ckpt"))  # type: ignore[arg-type]


def test_a_new_checkpoint_with_an_old_state_location_is_refused_before_the_start(
    spark: SparkSession, feed: Path, sqlite_sink: SQLiteSink, sqlite_reader: sqlite3.Connection,
    tmp_path: Path,
) -> None:
    """A new checkpoint restarts batch ids at 0: they must not pass for replays of old ones."""
    state = str(tmp_path / "state")
    run_to_end(spark, feed, sqlite_sink, tmp_path / "ckpt", state_location=state)
    with pytest.raises(ConfigurationError, match=r"belongs to query .* but the checkpoint .* "
                       r"to query \(none: a new checkpoint\)"):
        run_to_end(spark, feed, sqlite_sink, tmp_path / "new-ckpt", state_location=state)
    assert_exactly_once(sqlite_reader, sqlite_sink, FILES * ROWS_PER_FILE)


@pytest.mark.parametrize("setting", [None, "0"], ids=["default", "opted-out"])
def test_the_worker_tuning_opt_out_where_write_runs_is_shipped_to_the_tasks(
        spark: SparkSession, feed: Path, sqlite_sink: SQLiteSink, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, setting: str | None) -> None:
    """``TWOPHASE_WORKER_TUNING=0`` where ``write`` (or ``write_stream``) runs is read there
    into the run's config, which Spark pickles into every task (the tasks honour it:
    tests/unit/test_workers.py)."""
    if setting is None:
        monkeypatch.delenv(WORKER_TUNING_ENV, raising=False)
    else:
        monkeypatch.setenv(WORKER_TUNING_ENV, setting)
    shipped: list[RunConfig] = []

    def registered(df: DataFrame, config: RunConfig) -> str:
        shipped.append(config)
        return register_data_source(df, config)

    monkeypatch.setattr("twophase.spark.register_data_source", registered)
    write(spark.read.schema(FEED_SCHEMA).json(str(feed)), sqlite_sink,
          state_location=str(tmp_path / "state"))
    assert [config.worker_tuning for config in shipped] == [setting is None]
