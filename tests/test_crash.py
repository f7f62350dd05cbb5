"""Crash tests: a real Spark driver SIGKILLed at each named protocol point, then restarted.

Each test runs the driver (``twophase._harness``) in a session of its own, armed with
``TWOPHASE_CRASH_AT=<point>@<batch>``; the protocol kills the driver, its JVM and its Python
workers at that point. A second, unarmed run recovers and finishes the stream. The external
system's own view must then hold every input row exactly once, with nothing left in doubt.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sinks.sqlite import SQLiteSink
from tests.conftest import ORDERS_DDL
from twophase._crash import CRASH_POINTS
from twophase._harness import DriverSpec, generate_feed, launch
from twophase._state import StateStore

pytestmark = [pytest.mark.spark, pytest.mark.crash]

FILES, ROWS_PER_FILE, CRASH_BATCH = 3, 200, 1


def sqlite_spec(tmp_path: Path, *, foreach_batch: bool = False) -> DriverSpec:
    database = tmp_path / "orders.db"
    with sqlite3.connect(database) as connection:
        connection.execute(ORDERS_DDL)
    generate_feed(tmp_path / "feed", files=FILES, rows_per_file=ROWS_PER_FILE)
    return DriverSpec(
        input_dir=str(tmp_path / "feed"), checkpoint=str(tmp_path / "ckpt"),
        sink_factory="sinks.sqlite:SQLiteSink",
        sink_kwargs={"path": str(database), "table": "orders"},
        foreach_batch=foreach_batch,
    )


def crash_then_recover(spec: DriverSpec, workdir: Path, point: str) -> None:
    crashed = launch(spec, workdir=workdir, crash_at=f"{point}@{CRASH_BATCH}")
    assert crashed.crashed, f"the driver did not die at {point}: see {crashed.log}"
    recovered = launch(spec, workdir=workdir)
    assert recovered.returncode == 0, f"the restarted driver failed: see {recovered.log}"


def assert_sqlite_exactly_once(spec: DriverSpec) -> None:
    sink = SQLiteSink(**spec.sink_kwargs)
    with sqlite3.connect(sink.path) as connection:
        ids = [row[0] for row in connection.execute("SELECT event_id FROM orders ORDER BY 1")]
        staged = connection.execute(f'SELECT count(*) FROM "{sink.staged_table}"').fetchone()[0]
    assert ids == list(range(FILES * ROWS_PER_FILE)), "rows lost or duplicated"
    assert staged == 0
    assert sink.list_in_doubt("orders") == []
    state = StateStore(Path(spec.checkpoint) / "twophase").read()
    assert state is not None
    assert (state.pending, state.last_done_batch) == ((), FILES - 1)


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_sqlite_driver_killed_at_each_point_recovers_every_row_exactly_once(
    tmp_path: Path, point: str
) -> None:
    spec = sqlite_spec(tmp_path)
    crash_then_recover(spec, tmp_path / "runs", point)
    assert_sqlite_exactly_once(spec)


def test_foreach_batch_driver_killed_mid_commit_recovers_every_row_exactly_once(
    tmp_path: Path,
) -> None:
    spec = sqlite_spec(tmp_path, foreach_batch=True)
    crash_then_recover(spec, tmp_path / "runs", "mid_commit")
    assert_sqlite_exactly_once(spec)
