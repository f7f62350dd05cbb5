"""Crash tests: a real Spark driver SIGKILLed at each named protocol point, then restarted.

Each test runs the driver (``twophase.testing.driver``) in a session of its own, armed with
``TWOPHASE_CRASH_AT=<point>@<batch>``; the protocol kills the driver, its JVM and its Python
workers at that point. A second, unarmed run recovers and finishes the stream. The external
system's own view must then hold every input row exactly once, with nothing left in doubt.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sinks.sqlite import SQLiteSink
from tests.conftest import MYSQL_ORDERS_DDL, ORDERS_DDL
from tests.servers.mariadb import Db, MariaDBServer
from twophase._crash import AFTER_DECISION, AFTER_PRE_COMMIT, CRASH_POINTS, MID_COMMIT
from twophase._state import StateStore
from twophase.testing.driver import DriverSpec, generate_feed, launch

pytestmark = [pytest.mark.spark, pytest.mark.crash]

FILES, ROWS_PER_FILE, CRASH_BATCH = 3, 200, 1
EXPECTED_IDS = list(range(FILES * ROWS_PER_FILE))


def driver_spec(tmp_path: Path, sink_factory: str, sink_kwargs: dict[str, Any], *,
                foreach_batch: bool = False) -> DriverSpec:
    generate_feed(tmp_path / "feed", files=FILES, rows_per_file=ROWS_PER_FILE)
    return DriverSpec(input_dir=str(tmp_path / "feed"), checkpoint=str(tmp_path / "ckpt"),
                      sink_factory=sink_factory, sink_kwargs=sink_kwargs,
                      foreach_batch=foreach_batch)


def crash_then_recover(spec: DriverSpec, workdir: Path, point: str,
                       while_down: Callable[[], None] | None = None) -> None:
    """Kill the driver at ``point`` (then run ``while_down``), restart it to the end."""
    crashed = launch(spec, workdir=workdir, crash_at=f"{point}@{CRASH_BATCH}")
    assert crashed.crashed, f"the driver did not die at {point}: see {crashed.log}"
    if while_down is not None:
        while_down()
    recovered = launch(spec, workdir=workdir)
    assert recovered.returncode == 0, f"the restarted driver failed: see {recovered.log}"


def assert_state_finished(spec: DriverSpec) -> None:
    state = StateStore(Path(spec.checkpoint) / "twophase").read()
    assert state is not None
    assert (state.pending, state.last_done_batch) == ((), FILES - 1)


# -- SQLite ------------------------------------------------------------------------------------


def sqlite_spec(tmp_path: Path, *, foreach_batch: bool = False) -> DriverSpec:
    database = tmp_path / "orders.db"
    with sqlite3.connect(database) as connection:
        connection.execute(ORDERS_DDL)
    return driver_spec(tmp_path, "sinks.sqlite:SQLiteSink",
                       {"path": str(database), "table": "orders"}, foreach_batch=foreach_batch)


def assert_sqlite_exactly_once(spec: DriverSpec) -> None:
    sink = SQLiteSink(**spec.sink_kwargs)
    with sqlite3.connect(sink.path) as connection:
        ids = [row[0] for row in connection.execute("SELECT event_id FROM orders ORDER BY 1")]
        staged = connection.execute("SELECT count(*) FROM sqlite_master "
                                    "WHERE name GLOB '_twophase_stage:*'").fetchone()[0]
    assert ids == EXPECTED_IDS, "rows lost or duplicated"
    assert staged == 0
    assert sink.list_in_doubt("orders") == []
    assert_state_finished(spec)


def refused_while_the_state_is_lost(spec: DriverSpec, workdir: Path) -> None:
    """A restart whose state directory is gone is refused, and writes nothing."""
    state_dir = Path(spec.checkpoint) / "twophase"
    aside = workdir / "state-aside"
    state_dir.rename(aside)
    with sqlite3.connect(spec.sink_kwargs["path"]) as connection:
        before = connection.execute("SELECT count(*) FROM orders").fetchone()
    refused = launch(spec, workdir=workdir / "refused")
    assert refused.returncode not in (0, -9), f"a start without state ran: see {refused.log}"
    assert "there is no state file" in refused.log.read_text()
    with sqlite3.connect(spec.sink_kwargs["path"]) as connection:
        assert connection.execute("SELECT count(*) FROM orders").fetchone() == before
    aside.rename(state_dir)  # the operator restores it, as the message says


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_sqlite_driver_killed_at_each_point_recovers_every_row_exactly_once(
    tmp_path: Path, point: str
) -> None:
    """Also: the restart is refused while the state is lost, then the restored state recovers."""
    spec = sqlite_spec(tmp_path)
    crash_then_recover(spec, tmp_path / "runs", point,
                       lambda: refused_while_the_state_is_lost(spec, tmp_path / "runs"))
    assert_sqlite_exactly_once(spec)


def test_foreach_batch_driver_killed_mid_commit_recovers_every_row_exactly_once(
    tmp_path: Path,
) -> None:
    spec = sqlite_spec(tmp_path, foreach_batch=True)
    crash_then_recover(spec, tmp_path / "runs", MID_COMMIT)
    assert_sqlite_exactly_once(spec)


# -- MySQL / MariaDB ---------------------------------------------------------------------------


@pytest.fixture
def mysql_spec(mariadb: MariaDBServer, db: Db, tmp_path: Path) -> DriverSpec:
    """A stream into a fresh table (primary key on event_id) with in-database fencing on."""
    table = db.new_table(MYSQL_ORDERS_DDL, prefix="orders_")
    return driver_spec(tmp_path, "sinks.mysql:MySQLXASink",
                       {**mariadb.params.kwargs(), "table": table, "fencing": True})


def assert_mysql_exactly_once(spec: DriverSpec, db: Db) -> None:
    table = spec.sink_kwargs["table"]
    ids = [row[0] for row in db.query(f"SELECT event_id FROM `{table}` ORDER BY 1")]
    assert ids == EXPECTED_IDS, "rows lost or duplicated"
    assert db.xa_recover() == [], "prepared XA branches left behind"
    assert_state_finished(spec)


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_mysql_driver_killed_at_each_point_recovers_every_row_exactly_once(
    mysql_spec: DriverSpec, db: Db, tmp_path: Path, point: str
) -> None:
    crash_then_recover(mysql_spec, tmp_path / "runs", point)
    assert_mysql_exactly_once(mysql_spec, db)


@pytest.mark.parametrize("point", [AFTER_PRE_COMMIT, AFTER_DECISION])
def test_mysql_server_killed_while_branches_are_prepared_recovers_exactly_once(
    mysql_spec: DriverSpec, mariadb: MariaDBServer, db: Db, tmp_path: Path, point: str
) -> None:
    """Driver killed with branches prepared (undecided / decided), then kill -9 of MariaDB."""

    def kill_and_restart_the_server() -> None:
        assert db.xa_recover(), "nothing was prepared when the driver died"
        mariadb.kill()
        mariadb.restart_after_kill()

    crash_then_recover(mysql_spec, tmp_path / "runs", point, kill_and_restart_the_server)
    assert_mysql_exactly_once(mysql_spec, db)
