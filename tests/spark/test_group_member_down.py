"""One member of a sink group down for longer than a batch (its server SIGKILLed): no batch is
decided while it cannot commit, so the other member never runs ahead by a decided batch.
Within the retry policy's budget the query waits and goes on by itself once the server is
back; past it the query stops, naming the member and the cause, and a restart delivers every
row exactly once to both members.

The member is a private PostgreSQL (its pre-commit fails: the tasks cannot prepare) or the
HTTP receiver (its pre-commit stages locally and succeeds: the driver's check before the
decision, ``check_committable``, is what holds the batch back).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from setups.base import SinkSetup
from setups.http import HttpSetup
from setups.postgres import PostgresSetup
from setups.sqlite import SQLiteSetup
from twophase import RetryPolicy
from twophase.spark import write_stream
from twophase.testing import GroupTarget
from twophase.testing.driver import generate_feed, read_feed

pytestmark = pytest.mark.spark

FILES, ROWS_PER_FILE = 3, 50
#: Longer than a batch here (one to two seconds).
DOWN_S = 6.0
TRIGGER = "0.5 seconds"
ROWS_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 120
#: Patient enough to outlast DOWN_S (about 30 s of backoff), as a user's production policy is.
PATIENT = RetryPolicy(max_attempts=40, initial_backoff_s=0.2, max_backoff_s=1.0)
#: Gives up within a second.
IMPATIENT = RetryPolicy(max_attempts=2, initial_backoff_s=0.05, max_backoff_s=0.1)


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresSetup]:
    """A private server of this module's own: its tests stop it."""
    with PostgresSetup.started(tmp_path_factory.mktemp("member-down")) as setup:
        yield setup


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpSetup]:
    """A receiver of this module's own: its tests stop it."""
    with HttpSetup.started(tmp_path_factory.mktemp("member-down")) as setup:
        yield setup


class Job:
    """The table (SQLite) and the events (the member that goes down) of one group, fed a file
    per batch."""

    def __init__(self, tmp_path: Path, events: SinkSetup) -> None:
        self.events = events
        self.group = GroupTarget.of({"table": SQLiteSetup(tmp_path / "sqlite").new_target(),
                                     "events": events.new_target()})
        self.files = sorted(self._generated(tmp_path / "generated"))
        self.feed, self.checkpoint = tmp_path / "feed", tmp_path / "checkpoint"
        self.feed.mkdir()

    @staticmethod
    def _generated(folder: Path) -> list[Path]:
        generate_feed(folder, files=FILES, rows_per_file=ROWS_PER_FILE)
        return list(folder.iterdir())

    def arrive(self, count: int) -> None:
        """The next ``count`` files arrive in the feed (newer than every file before)."""
        for source in self.files[:count]:
            moved = Path(shutil.copy(source, self.feed / source.name))
            os.utime(moved, (time.time(), time.time()))
            time.sleep(0.01)
        del self.files[:count]

    def start(self, spark: SparkSession, retry: RetryPolicy) -> StreamingQuery:
        """The query, running: a batch as soon as a file arrives."""
        return write_stream(read_feed(spark, self.feed), self.group.build(),
                            checkpoint_location=str(self.checkpoint),
                            trigger={"processingTime": TRIGGER}, retry=retry)

    def wait_for_rows(self, query: StreamingQuery, count: int) -> None:
        deadline = time.monotonic() + ROWS_TIMEOUT_S
        while len(self.group.members["events"].visible()) < count:
            assert query.isActive, query.exception()
            assert time.monotonic() < deadline, f"fewer than {count} rows after {ROWS_TIMEOUT_S}s"
            time.sleep(0.2)

    def table_rows(self) -> list[int]:
        return self.group.members["table"].visible()

    def assert_every_row_once_in_both(self) -> None:
        expected = list(range(FILES * ROWS_PER_FILE))
        assert self.group.visible() == expected
        assert self.group.members["events"].visible() == expected
        assert self.group.in_doubt() == []


@pytest.fixture(params=["postgres", "http"])
def job(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Job]:
    events: SinkSetup = request.getfixturevalue(request.param)
    job = Job(tmp_path, events)
    yield job
    events.start_server()  # for the next test, whatever this one did


def first_batch_then_member_down(job: Job, spark: SparkSession, retry: RetryPolicy
                                 ) -> StreamingQuery:
    """The query runs; batch 0 lands in both members; then the events' server is SIGKILLed
    and the other files arrive: the next batch's partitions cannot pre-commit."""
    query = job.start(spark, retry)
    job.arrive(1)
    job.wait_for_rows(query, ROWS_PER_FILE)
    job.events.kill_server()
    job.arrive(FILES - 1)
    return query


def test_within_the_budget_the_query_waits_for_the_member_and_goes_on(
        spark: SparkSession, job: Job) -> None:
    query = first_batch_then_member_down(job, spark, PATIENT)
    landed = list(range(ROWS_PER_FILE))
    down_until, checks = time.monotonic() + DOWN_S, 0
    while time.monotonic() < down_until:
        assert query.isActive, query.exception()
        assert job.table_rows() == landed, "the table ran ahead while the events were down"
        checks += 1
        time.sleep(0.5)
    job.events.start_server()
    try:
        job.wait_for_rows(query, FILES * ROWS_PER_FILE)
    finally:
        query.stop()
    assert query.exception() is None and checks >= DOWN_S
    job.assert_every_row_once_in_both()


def test_past_the_budget_the_query_stops_naming_the_member_and_a_restart_goes_on(
        spark: SparkSession, job: Job, caplog: pytest.LogCaptureFixture) -> None:
    query = first_batch_then_member_down(job, spark, IMPATIENT)
    with caplog.at_level(logging.ERROR, "twophase"), \
            pytest.raises(StreamingQueryException):
        query.awaitTermination(STOP_TIMEOUT_S)
    [stopped] = [r.getMessage() for r in caplog.records if "stopped: " in r.getMessage()]
    assert "FatalError: " in stopped and "sink group member 'events'" in stopped, stopped
    assert "Connection refused" in stopped and "Fix:" in stopped, stopped
    assert job.table_rows() == list(range(ROWS_PER_FILE))
    job.events.start_server()
    restarted = job.start(spark, PATIENT)
    try:
        job.wait_for_rows(restarted, FILES * ROWS_PER_FILE)
    finally:
        restarted.stop()
    job.assert_every_row_once_in_both()
