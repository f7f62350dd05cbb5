"""The edges a new user finds: time zones, failed batches, lost state, redeploys, retries.

Each runs real PySpark (the shared session: its workers in Asia/Kolkata, its session zone
America/Los_Angeles, see setups/servers/spark.py) into SQLite, and ends with every row exactly
once and nothing in doubt.
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
import time
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from sinks.sqlite import SQLiteSink
from tests.edge_sinks import FailingPartitionSink, FlakyBeginSink
from twophase import ConfigurationError
from twophase._rows import INSTANT_TYPE, plain_rows, positions, rows_of
from twophase._spark import _instants_as_micros
from twophase._state import StateStore
from twophase.cleanup import main as cleanup_main
from twophase.spark import write_stream
from twophase.testing.contract import list_in_doubt, prepare
from twophase.testing.driver import FEED_START, generate_feed, read_feed

pytestmark = pytest.mark.spark

FILES, ROWS_PER_FILE = 3, 100
SETTLE_S = 20.0


@pytest.fixture
def feed(tmp_path: Path) -> Path:
    generate_feed(tmp_path / "feed", files=FILES, rows_per_file=ROWS_PER_FILE)
    return tmp_path / "feed"


def run_to_end(spark: SparkSession, feed: Path, sink: SQLiteSink, checkpoint: Path,
               **options: Any) -> None:
    write_stream(read_feed(spark, feed), sink, checkpoint_location=str(checkpoint),
                 trigger={"availableNow": True}, **options).awaitTermination()


def visible(database: Path) -> list[int]:
    with sqlite3.connect(database) as connection:
        return [row[0] for row in connection.execute("SELECT event_id FROM orders ORDER BY 1")]


def eventually(condition: Callable[[], bool], what: str) -> None:
    """Once the failed query's cancelled tasks have ended (bounded), ``condition`` holds."""
    deadline = time.monotonic() + SETTLE_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


# -- values ------------------------------------------------------------------------------------


def test_timestamps_are_stored_as_instants_whatever_the_zones(
    spark: SparkSession, feed: Path, sqlite_sink: SQLiteSink, orders_db: Path, tmp_path: Path,
    foreach_batch: bool,
) -> None:
    run_to_end(spark, feed, sqlite_sink, tmp_path / "ckpt", foreach_batch=foreach_batch)
    with sqlite3.connect(orders_db) as connection:
        stored = connection.execute("SELECT event_id, ts FROM orders ORDER BY 1").fetchall()
    expected = [(i, (FEED_START + timedelta(seconds=i)).isoformat(timespec="microseconds"))
                for i in range(FILES * ROWS_PER_FILE)]
    assert stored == expected  # UTC with "+00:00", not the workers' Kolkata wall clock


def test_every_type_reaches_a_sink_as_documented_on_both_paths(spark: SparkSession) -> None:
    instant = datetime(2026, 3, 8, 10, 30, 0, 250_000, tzinfo=UTC)  # LA's spring-forward day
    wall = datetime(2026, 3, 8, 2, 30)  # a wall clock that does not exist in Los Angeles
    df = spark.createDataFrame(
        [(1, instant, wall, date(2026, 3, 8), Decimal("12.34"), b"\x00\xff", ["a"], {"k": 1},
          (instant,)),
         (2, None, None, None, None, None, None, None, None)],
        "id BIGINT, at TIMESTAMP, wall TIMESTAMP_NTZ, day DATE, amount DECIMAL(10,2), "
        "payload BINARY, tags ARRAY<STRING>, attrs MAP<STRING,INT>, nested STRUCT<at: TIMESTAMP>")
    expected = [
        (1, instant, wall, date(2026, 3, 8), Decimal("12.34"), b"\x00\xff", ["a"], {"k": 1},
         {"at": instant}),
        (2, None, None, None, None, None, None, None, None),
    ]
    arrow_rows = sorted(rows_of(df._collect_as_arrow()))  # type: ignore[operator]
    assert arrow_rows == expected
    assert arrow_rows[0][1].tzinfo is not None and arrow_rows[0][2].tzinfo is None

    types = [field.dataType.simpleString() for field in df.schema.fields]
    spark_rows = _instants_as_micros(df, positions(types, INSTANT_TYPE)).collect()
    foreach_rows = sorted(plain_rows(spark_rows, instants=positions(types, INSTANT_TYPE),
                                     structs=positions(types, "struct<")))
    assert foreach_rows[0][:8] == expected[0][:8] and foreach_rows[1] == expected[1]
    assert foreach_rows[0][1].utcoffset() == timedelta(0)


# -- a failed batch leaves nothing prepared ------------------------------------------------------


@pytest.mark.parametrize("fail_batch", [0, 2], ids=["first-batch-of-a-new-query", "later-batch"])
def test_a_failed_batch_leaves_nothing_in_doubt_even_a_partition_that_pre_commits_late(
    spark: SparkSession, feed: Path, sqlite_sink: SQLiteSink, orders_db: Path, tmp_path: Path,
    fail_batch: int,
) -> None:
    checkpoint = tmp_path / "ckpt"
    failing = FailingPartitionSink(str(orders_db), "orders", fail_batch=fail_batch,
                                   state_dir=str(checkpoint / "twophase"))
    with pytest.raises(StreamingQueryException, match="partition refused on purpose"):
        run_to_end(spark, feed, failing, checkpoint)
    eventually(lambda: list_in_doubt(sqlite_sink, "orders") == [],
               "a transaction of the failed batch stayed in doubt")
    assert visible(orders_db) == list(range(fail_batch * ROWS_PER_FILE))
    state = StateStore(checkpoint / "twophase").read()
    assert state is not None and state.aborted_batch == fail_batch and state.query_id

    run_to_end(spark, feed, sqlite_sink, checkpoint)  # the fixed job, same checkpoint
    assert visible(orders_db) == list(range(FILES * ROWS_PER_FILE))
    assert list_in_doubt(sqlite_sink, "orders") == []


def test_cleanup_aborts_a_given_up_batch_at_once_without_flags(
    spark: SparkSession, feed: Path, sqlite_sink: SQLiteSink, orders_db: Path, tmp_path: Path,
) -> None:
    """A driver that died while aborting leaves the batch's transactions: cleanup, run from
    cron with no extra flags, knows them for orphans (the run recorded that it gave up)."""
    checkpoint = tmp_path / "ckpt"
    failing = FailingPartitionSink(str(orders_db), "orders", fail_batch=0,
                                   state_dir=str(checkpoint / "twophase"))
    with pytest.raises(StreamingQueryException):
        run_to_end(spark, feed, failing, checkpoint)
    store = StateStore(checkpoint / "twophase")
    state = store.read()
    assert state is not None
    # a transaction the dead driver did not abort:
    leftover = prepare(sqlite_sink, [(99, 1, "paid", None)], epoch=state.epoch,
                       query_id=str(state.query_id), namespace=state.namespace)
    assert list_in_doubt(sqlite_sink, state.namespace) == [leftover]
    code = cleanup_main(["--sink", "sinks.sqlite:SQLiteSink", "--options",
                         f'{{"path": "{orders_db}", "table": "orders"}}',
                         "--state", str(store.location)])
    assert code == 0
    assert list_in_doubt(sqlite_sink, state.namespace) == []
    assert visible(orders_db) == []


# -- lost or stale state -------------------------------------------------------------------------


def test_a_checkpoint_whose_state_was_lost_or_is_stale_is_refused_until_restored(
    spark: SparkSession, feed: Path, sqlite_sink: SQLiteSink, orders_db: Path, tmp_path: Path,
) -> None:
    checkpoint, backup = tmp_path / "ckpt", tmp_path / "backup"
    run_to_end(spark, feed, sqlite_sink, checkpoint)
    shutil.copytree(checkpoint / "twophase", backup)
    generate_feed(tmp_path / "more", files=FILES + 1, rows_per_file=ROWS_PER_FILE)
    shutil.copy(sorted((tmp_path / "more").iterdir())[-1], feed)  # rows 300-399, a newer file
    run_to_end(spark, feed, sqlite_sink, checkpoint)

    shutil.rmtree(checkpoint / "twophase")
    with pytest.raises(ConfigurationError, match=r"has run batches up to 3, but there is no "
                       r"state file.*Fix: restore the twophase/ directory"):
        run_to_end(spark, feed, sqlite_sink, checkpoint)
    shutil.copytree(backup, checkpoint / "twophase")  # an older backup: batches up to 2
    with pytest.raises(ConfigurationError, match=r"committed batches up to 3, but the state "
                       r"file .* knows batches only up to 2"):
        run_to_end(spark, feed, sqlite_sink, checkpoint)
    assert visible(orders_db) == list(range((FILES + 1) * ROWS_PER_FILE))

    run_to_end(spark, feed, sqlite_sink, checkpoint, accept_lost_state=True)  # the override
    assert visible(orders_db) == list(range((FILES + 1) * ROWS_PER_FILE))


# -- a failed redeploy leaves the live run alone ---------------------------------------------------


@pytest.mark.parametrize(("options", "message"), [
    # CI time: Spark's refusal of a trigger runs in CI through trigger-value
    pytest.param({"trigger": {"processingtime": "1 second"}}, "Spark refuses the trigger",
                 marks=pytest.mark.long),
    ({"trigger": {"processingTime": "soon"}}, "Spark refuses the trigger"),
    ({"query_name": ""}, "is not a usable name"),
    ({}, "is already running in this Spark session"),
], ids=["trigger-typo", "trigger-value", "query-name", "same-options"])
def test_a_redeploy_that_fails_to_start_leaves_the_live_run_untouched(
    spark: SparkSession, feed: Path, sqlite_sink: SQLiteSink, orders_db: Path, tmp_path: Path,
    options: dict[str, Any], message: str,
) -> None:
    checkpoint = tmp_path / "ckpt"
    live = write_stream(read_feed(spark, feed), sqlite_sink, checkpoint_location=str(checkpoint),
                        trigger={"processingTime": "1 second"})
    try:
        live.processAllAvailable()
        store = StateStore(checkpoint / "twophase")
        before = store.read()
        with pytest.raises(ConfigurationError, match=f"{message}.*Fix: "):
            write_stream(read_feed(spark, feed), sqlite_sink,
                         checkpoint_location=str(checkpoint), **options)
        assert store.read() == before  # not fenced: same epoch, nothing recovered
        generate_feed(tmp_path / "more", files=FILES + 1, rows_per_file=ROWS_PER_FILE)
        shutil.copy(sorted((tmp_path / "more").iterdir())[-1], feed)
        live.processAllAvailable()  # the live run goes on
        assert live.isActive and live.exception() is None
    finally:
        live.stop()
    assert visible(orders_db) == list(range((FILES + 1) * ROWS_PER_FILE))
    assert list_in_doubt(sqlite_sink, "orders") == []


# -- retries and visibility -----------------------------------------------------------------------


def test_a_retryable_error_in_a_task_is_retried_there(
    spark: SparkSession, feed: Path, orders_db: Path, tmp_path: Path,
) -> None:
    retries = tmp_path / "retries"
    retries.mkdir()
    flaky = FlakyBeginSink(str(orders_db), "orders", log_dir=str(retries), failures=2)
    run_to_end(spark, feed, flaky, tmp_path / "ckpt")
    assert visible(orders_db) == list(range(FILES * ROWS_PER_FILE))
    assert len(list(retries.iterdir())) == 2 * 2 * FILES  # two failures in each of 2 tasks
    assert list_in_doubt(flaky, "orders") == []


def test_every_commit_is_logged_by_the_driver(
    spark: SparkSession, feed: Path, sqlite_sink: SQLiteSink, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="twophase")
    run_to_end(spark, feed, sqlite_sink, tmp_path / "ckpt")

    def logged() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "twophase._progress"]

    eventually(lambda: len(logged()) >= FILES, f"commit lines in the driver log: {logged()}")
    assert sorted(line.split(":")[0] for line in logged()) == [  # listeners run out of order
        f"batch {batch} committed" for batch in range(FILES)]
    assert all(f"{ROWS_PER_FILE} rows in 2 transactions" in line for line in logged())
