"""python -m twophase.cleanup and python -m twophase.status against real SQLite and state files."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from sinks.sqlite import SQLiteSink
from tests.servers.moto import MotoServer
from twophase import cleanup
from twophase._state import Decision, StateStore
from twophase.testing.contract import OPENED_AT, OTHER_QUERY_ID, QUERY_ID, orders, prepare

HOUR = 3600.0


def running_query(tmp_path: Path, *, epoch_bumps: int = 1, last_done: int = -1) -> StateStore:
    """A state file as a query at ``last_done`` leaves it (epoch = ``epoch_bumps``)."""
    store = StateStore(tmp_path / "state")
    for _ in range(epoch_bumps):
        store.start_run("orders", {"trigger": {"processingTime": "1 minute"}})
    store.update(lambda s: replace(s, query_id=QUERY_ID, last_done_batch=last_done), epoch=None)
    return store


def target(sink: SQLiteSink, store: StateStore, **options: object) -> cleanup.Target:
    return cleanup.Target(sink=sink, states=(store,), namespace="orders", **options)  # type: ignore[arg-type]


def run_cleanup(tgt: cleanup.Target, *, now: float, dry_run: bool = False) -> cleanup.Report:
    report = cleanup.Report()
    cleanup.clean(tgt, report, dry_run=dry_run, clock=lambda: now)
    return report


def in_doubt(sink: SQLiteSink) -> set[str]:
    return {str(h.txn_id) for h in sink.list_in_doubt("orders")}


def test_decided_batches_are_rolled_forward(sqlite_sink: SQLiteSink,
                                            sqlite_reader: sqlite3.Connection,
                                            tmp_path: Path) -> None:
    store = running_query(tmp_path)
    handle = prepare(sqlite_sink, orders(0, 3), batch=0)
    store.update(lambda s: replace(s, pending=(Decision(0, 1, OPENED_AT, (handle,)),)), epoch=None)

    report = run_cleanup(target(sqlite_sink, store), now=OPENED_AT)

    assert [a.action for a in report.actions] == ["roll_forward", "purge"]
    assert sqlite_reader.execute("SELECT count(*) FROM orders").fetchone() == (3,)
    state = store.read()
    assert state is not None and (state.pending, state.last_done_batch) == ((), 0)
    assert report.exit_code == cleanup.EXIT_OK


def test_orphans_are_aborted_by_the_query_rules_and_young_ones_kept(
    sqlite_sink: SQLiteSink, tmp_path: Path
) -> None:
    store = running_query(tmp_path, epoch_bumps=2, last_done=4)
    earlier_run = prepare(sqlite_sink, orders(0, 1), epoch=1, batch=9)
    finished_batch = prepare(sqlite_sink, orders(1, 1), epoch=2, batch=3)
    in_flight = prepare(sqlite_sink, orders(2, 1), epoch=2, batch=5)

    report = run_cleanup(target(sqlite_sink, store), now=OPENED_AT + 60)
    assert in_doubt(sqlite_sink) == {str(in_flight.txn_id)}
    aborted = {a.subject for a in report.actions if a.action == "abort_orphan"}
    assert aborted == {str(earlier_run.txn_id), str(finished_batch.txn_id)}

    # Twice the trigger interval (1 minute) is below the 10-minute floor: kept until then.
    run_cleanup(target(sqlite_sink, store), now=OPENED_AT + 599)
    assert in_doubt(sqlite_sink) == {str(in_flight.txn_id)}
    run_cleanup(target(sqlite_sink, store), now=OPENED_AT + 601)
    assert in_doubt(sqlite_sink) == set()


def test_unknown_queries_are_reported_not_aborted_unless_asked(
    sqlite_sink: SQLiteSink, tmp_path: Path
) -> None:
    store = running_query(tmp_path)
    stranger = prepare(sqlite_sink, orders(0, 1), query_id=OTHER_QUERY_ID)

    report = run_cleanup(target(sqlite_sink, store), now=OPENED_AT + HOUR)
    assert report.exit_code == cleanup.EXIT_ATTENTION
    assert [a.action for a in report.actions if a.subject == str(stranger.txn_id)] == [
        "keep_unknown"]
    assert in_doubt(sqlite_sink) == {str(stranger.txn_id)}

    report = run_cleanup(target(sqlite_sink, store, abort_unknown=True), now=OPENED_AT + HOUR)
    assert report.exit_code == cleanup.EXIT_OK
    assert in_doubt(sqlite_sink) == set()


def test_dry_run_changes_nothing(sqlite_sink: SQLiteSink, tmp_path: Path) -> None:
    store = running_query(tmp_path, epoch_bumps=2)
    orphan = prepare(sqlite_sink, orders(0, 1), epoch=1)
    before = Path(store.path).read_bytes()
    report = run_cleanup(target(sqlite_sink, store), now=OPENED_AT, dry_run=True)
    assert [(a.action, a.done) for a in report.actions] == [("abort_orphan", False),
                                                            ("purge", False)]
    assert in_doubt(sqlite_sink) == {str(orphan.txn_id)}
    assert Path(store.path).read_bytes() == before


def test_a_lost_decided_transaction_needs_attention_then_can_be_forgotten(
    sqlite_sink: SQLiteSink, tmp_path: Path
) -> None:
    store = running_query(tmp_path)
    handle = prepare(sqlite_sink, orders(0, 1))
    store.update(lambda s: replace(s, pending=(Decision(0, 1, OPENED_AT, (handle,)),)), epoch=None)
    sqlite_sink.abort(handle)

    report = run_cleanup(target(sqlite_sink, store), now=OPENED_AT)
    (roll,) = [a for a in report.actions if a.action == "roll_forward"]
    assert roll.error is not None and "neither prepared nor recorded as committed" in roll.error
    assert report.exit_code == cleanup.EXIT_ATTENTION

    assert cleanup.main(["--state", str(store.location), "--forget-batch", "0"]) == 0
    state = store.read()
    assert state is not None and (state.pending, state.last_done_batch) == ((), 0)


def test_the_cron_command_reads_a_config_file_and_prints_json_lines(
    sqlite_sink: SQLiteSink, orders_db: Path, tmp_path: Path
) -> None:
    store = running_query(tmp_path, epoch_bumps=2)
    orphan = prepare(sqlite_sink, orders(0, 1), epoch=1)
    config = tmp_path / "cleanup.toml"
    config.write_text(
        "[[target]]\n"
        'sink = "sinks.sqlite:SQLiteSink"\n'
        'options = { path = { env = "ORDERS_DB" }, table = "orders" }\n'
        f'states = ["{store.location}"]\n'
    )
    result = subprocess.run(
        [sys.executable, "-m", "twophase.cleanup", "--config", str(config)],
        capture_output=True, text=True, env={"ORDERS_DB": str(orders_db), "PATH": "/usr/bin"},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    actions = [json.loads(line) for line in result.stdout.splitlines()]
    assert (actions[0]["action"], actions[0]["subject"]) == ("abort_orphan", str(orphan.txn_id))
    assert "abort_orphan orders" in result.stderr  # a log line per action
    assert in_doubt(sqlite_sink) == set()


@pytest.mark.parametrize(("argv", "message"), [
    ([], "no target given"),
    (["--sink", "sinks.sqlite:Nope", "--state", "x"], "cannot load 'sinks.sqlite:Nope'"),
    (["--sink", "sinks.sqlite:SQLiteSink", "--options", '{"path": "x", "table": "t"}',
      "--older-than", "soon"], "cannot read 'soon' as a duration"),
])
def test_usage_errors_exit_2_with_the_cause(argv: list[str], message: str,
                                            caplog: pytest.LogCaptureFixture) -> None:
    assert cleanup.main(argv) == cleanup.EXIT_USAGE
    assert message in caplog.text


def test_status_shows_pending_transactions(sqlite_sink: SQLiteSink, tmp_path: Path) -> None:
    store = running_query(tmp_path)
    handle = prepare(sqlite_sink, orders(0, 2))
    store.update(lambda s: replace(s, pending=(Decision(0, 1, OPENED_AT, (handle,)),)), epoch=None)
    result = subprocess.run([sys.executable, "-m", "twophase.status", str(store.location)],
                            capture_output=True, text=True, check=True)
    assert "pending    batch 0" in result.stdout
    assert f"{handle.txn_id} (sqlite, 2 rows)" in result.stdout


def test_status_shows_what_a_damaged_state_file_holds(
    sqlite_sink: SQLiteSink, tmp_path: Path
) -> None:
    store = StateStore(tmp_path / "state")
    store.start_run("orders", {})
    damaged = Path(store.path).read_text().replace('"epoch": 1', '"epoch": 7')
    Path(store.path).write_text(damaged)
    plain = subprocess.run([sys.executable, "-m", "twophase.status", str(store.location)],
                           capture_output=True, text=True, check=False)
    assert plain.returncode == 1
    assert f"--unverified {store.location}" in plain.stderr  # the fix names the way to look
    shown = subprocess.run([sys.executable, "-m", "twophase.status", "--unverified",
                            str(store.location)], capture_output=True, text=True, check=False)
    assert shown.returncode == 1
    assert "checksum does not match" in shown.stderr and "UNVERIFIED" in shown.stderr
    assert json.loads(shown.stdout)["epoch"] == 7


def test_status_and_cleanup_read_a_state_on_s3(sqlite_sink: SQLiteSink, orders_db: Path,
                                               moto_server: MotoServer, tmp_path: Path) -> None:
    """``python -m twophase.status s3://bucket/checkpoints/orders`` and the cron cleanup find
    the state inside an S3 checkpoint; the endpoint and keys come from boto3's environment."""
    checkpoint = f"s3://{moto_server.new_bucket('checkpoints')}/checkpoints/orders"
    options = moto_server.options()
    store = StateStore.for_checkpoint(checkpoint, {
        key: options[key] for key in ("endpoint_url", "access_key_id", "secret_access_key",
                                      "region")})
    store.start_run("orders", {})
    decided = prepare(sqlite_sink, orders(0, 2))
    store.update(lambda s: replace(s, query_id=QUERY_ID, pending=(
        Decision(0, 1, OPENED_AT, (decided,)),)), epoch=None)
    env = {"PATH": "/usr/bin", "AWS_ENDPOINT_URL_S3": options["endpoint_url"],
           "AWS_ACCESS_KEY_ID": options["access_key_id"],
           "AWS_SECRET_ACCESS_KEY": options["secret_access_key"],
           "AWS_DEFAULT_REGION": options["region"]}

    status = subprocess.run([sys.executable, "-m", "twophase.status", checkpoint],
                            capture_output=True, text=True, env=env, check=False)
    assert status.returncode == 0, status.stderr
    assert f"state      {store.path}" in status.stdout
    assert f"{decided.txn_id} (sqlite, 2 rows)" in status.stdout

    config = tmp_path / "cleanup.toml"
    config.write_text("[[target]]\n"
                      'sink = "sinks.sqlite:SQLiteSink"\n'
                      f'options = {{ path = "{orders_db}", table = "orders" }}\n'
                      f'states = ["{store.location}"]\n')
    result = subprocess.run([sys.executable, "-m", "twophase.cleanup", "--config", str(config)],
                            capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 0, result.stderr
    actions = [json.loads(line) for line in result.stdout.splitlines()]
    assert [a["action"] for a in actions if a["action"] != "purge"] == ["roll_forward"]
    state = store.read()
    assert state is not None and (state.pending, state.last_done_batch) == ((), 0)
    with sqlite3.connect(orders_db) as reader:
        assert reader.execute("SELECT count(*) FROM orders").fetchone() == (2,)
