"""python -m twophase.cleanup and python -m twophase.status against real SQLite and state files."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from setups.servers.local import free_port
from setups.servers.moto import MotoServer
from sinks.sqlite import SQLiteSink
from twophase import cleanup
from twophase._handle import query_key
from twophase._state import Decision, StateStore
from twophase._task import rows_delivery, run_transaction
from twophase.testing.contract import (
    OPENED_AT,
    OTHER_QUERY_ID,
    QUERY_ID,
    abort,
    commit,
    context,
    list_in_doubt,
    orders,
    prepare,
)
from twophase.testing.keyed import KEYED_COLUMNS

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
    return {str(h.txn_id) for h in list_in_doubt(sink, "orders")}


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
    abort(sqlite_sink, handle)

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


def metric_samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The samples of a Prometheus text exposition: (name, labels) -> value."""
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def cleanup_with_facts(sqlite_sink: SQLiteSink, orders_db: Path,
                       tmp_path: Path) -> tuple[list[str], StateStore]:
    """A state with a decided batch pending, an orphan of an earlier run, and an old
    transaction of a query cleanup does not know: the cleanup command line for it."""
    store = running_query(tmp_path, epoch_bumps=2)
    decided = prepare(sqlite_sink, orders(0, 3), epoch=2, batch=0)
    store.update(lambda s: replace(s, pending=(Decision(0, 2, OPENED_AT, (decided,)),)),
                 epoch=None)
    prepare(sqlite_sink, orders(3, 1), epoch=1)
    stranger = context(query_id=OTHER_QUERY_ID)
    an_hour_old = replace(stranger.txn_id, created=int(OPENED_AT - HOUR))
    run_transaction(sqlite_sink, replace(stranger, txn_id=an_hour_old), rows_delivery(orders(4, 1)))
    return ["--sink", "sinks.sqlite:SQLiteSink", "--options",
            json.dumps({"path": str(orders_db), "table": "orders"}),
            "--state", str(store.location)], store


def test_cleanup_writes_its_facts_and_the_query_metrics_as_a_textfile(
    sqlite_sink: SQLiteSink, orders_db: Path, tmp_path: Path
) -> None:
    argv, _ = cleanup_with_facts(sqlite_sink, orders_db, tmp_path)
    textfile = tmp_path / "textfile" / "twophase.prom"
    textfile.parent.mkdir()

    assert cleanup.main([*argv, "--metrics-file", str(textfile)]) == cleanup.EXIT_ATTENTION

    seen = metric_samples(textfile.read_text())
    assert [p.name for p in textfile.parent.iterdir()] == ["twophase.prom"]  # replaced whole
    target = {("namespace", "orders"), ("sink", "sqlite")}
    query = frozenset({("query", QUERY_ID), *target})
    assert seen[("twophase_cleanup_exit_code", frozenset())] == cleanup.EXIT_ATTENTION
    for action, outcome in (("roll_forward", "done"), ("abort_orphan", "done"),
                            ("keep_unknown", "skipped"), ("purge", "done")):
        labels = frozenset({("namespace", "orders"), ("action", action), ("outcome", outcome)})
        assert seen[("twophase_cleanup_actions", labels)] == 1, action
    assert seen[("twophase_cleanup_in_doubt_transactions", frozenset(target))] == 1  # unknown
    oldest = seen[("twophase_cleanup_oldest_in_doubt_age_seconds", frozenset(target))]
    assert oldest > seen[("twophase_cleanup_orphan_age_limit_seconds", frozenset(target))]
    assert seen[("twophase_batches_committed_total", query)] == 1  # rolled forward by cleanup
    assert seen[("twophase_rows_committed_total", query)] == 3
    assert seen[("twophase_batches_pending", query)] == 0
    assert seen[("twophase_cleanup_last_run_timestamp_seconds", frozenset())] > OPENED_AT


def test_cleanup_pushes_the_same_facts_to_a_pushgateway(
    sqlite_sink: SQLiteSink, orders_db: Path, tmp_path: Path, pushgateway: str
) -> None:
    argv, _ = cleanup_with_facts(sqlite_sink, orders_db, tmp_path)

    assert cleanup.main([*argv, "--pushgateway", pushgateway]) == cleanup.EXIT_ATTENTION

    with urllib.request.urlopen(f"{pushgateway}/metrics", timeout=10) as response:
        seen = metric_samples(response.read().decode())
    pushed = {("job", "twophase_cleanup"), ("instance", "")}
    assert seen[("twophase_cleanup_exit_code", frozenset(pushed))] == cleanup.EXIT_ATTENTION
    query = frozenset({("query", QUERY_ID), ("namespace", "orders"), ("sink", "sqlite"), *pushed})
    assert seen[("twophase_batches_committed_total", query)] == 1


def test_an_unreachable_pushgateway_fails_the_run_with_the_cause(
    sqlite_sink: SQLiteSink, orders_db: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = running_query(tmp_path)
    argv = ["--sink", "sinks.sqlite:SQLiteSink", "--options",
            json.dumps({"path": str(orders_db), "table": "orders"}), "--state",
            str(store.location)]
    assert cleanup.main([*argv, "--pushgateway", f"http://127.0.0.1:{free_port()}"]) == \
        cleanup.EXIT_FAILED
    assert "metrics not exported" in caplog.text


def test_settle_finishes_decided_batches_and_aborts_every_undecided_transaction(
    sqlite_sink: SQLiteSink, orders_db: Path, sqlite_reader: sqlite3.Connection,
    tmp_path: Path
) -> None:
    """Before a migration: also the crashed current run's undecided transaction, however
    young (cleanup would keep it: a live run might still decide it); the stranger stays."""
    argv, store = cleanup_with_facts(sqlite_sink, orders_db, tmp_path)
    young = prepare(sqlite_sink, orders(5, 1), epoch=2, batch=1)
    status = subprocess.run([sys.executable, "-m", "twophase.status", str(store.location),
                             *argv[:4]], capture_output=True, text=True, check=True)
    assert f"undecided  {young.txn_id}" in status.stdout
    assert "hold its locks" in status.stdout
    assert "python -m twophase.cleanup --settle --sink MODULE:CLASS" in status.stdout

    assert cleanup.main([*argv, "--settle"]) == cleanup.EXIT_OK

    assert sqlite_reader.execute("SELECT count(*) FROM orders").fetchone() == (3,)
    assert {h.txn_id.query for h in list_in_doubt(sqlite_sink, "orders")} == {
        query_key(OTHER_QUERY_ID)}
    state = store.read()
    assert state is not None and (state.pending, state.epoch, state.last_done_batch) == ((), 3, 0)


@pytest.mark.parametrize(("text", "seconds"), [("500 ms", 0.5), ("30s", 30.0), ("10m", 600.0),
                                               ("2 hours", 7200.0), ("10 seconds", 10.0),
                                               ("7d", 604_800.0), ("3 mins", 180.0)])
def test_durations_are_read_in_their_unit(text: str, seconds: float) -> None:
    assert cleanup.parse_duration(text) == seconds


def test_cleanup_purges_tombstones_past_the_sinks_retention_and_status_counts_them(
    tmp_path: Path,
) -> None:
    path = tmp_path / "live.db"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE live (order_id INTEGER PRIMARY KEY, status TEXT, "
                           "version INTEGER NOT NULL)")
    options = {"path": str(path), "table": "live", "mode": "keyed", "key": ["order_id"],
               "version": "version", "deleted": "op", "tombstone_retention_s": HOUR}
    sink = SQLiteSink(**options)  # type: ignore[arg-type]
    commit(sink, prepare(sink, [(1, None, 3, "d"), (2, None, 4, "d")], columns=KEYED_COLUMNS))
    store = running_query(tmp_path)
    status = subprocess.run(
        [sys.executable, "-m", "twophase.status", str(store.location),
         "--sink", "sinks.sqlite:SQLiteSink", "--options", json.dumps(options)],
        capture_output=True, text=True, check=True)
    assert "tombstones: 2 deleted keys remembered, the oldest deleted 0.0 h ago" in status.stdout

    def purges(report: cleanup.Report) -> list[str]:
        return [a.reason for a in report.actions if a.subject.startswith("tombstones")]

    now = time.time()
    assert purges(run_cleanup(target(sink, store), now=now)) == ["0 purged"]
    assert purges(run_cleanup(target(sink, store), now=now + HOUR + 60, dry_run=True)) == [
        "past the tombstone retention"]
    assert purges(run_cleanup(target(sink, store), now=now + HOUR + 60)) == ["2 purged"]
    with sink.committer() as committer:
        assert committer.tombstones() == (0, None)
