"""Metrics: counts kept in the state by whichever process decides, exported, scraped by a real
Prometheus through a driver crash and the recovery, for both Spark adapters (foreachBatch's
under ``-m long``); and served by a
Spark Connect client, whose server's processes decide and commit."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from pyspark.sql import SparkSession

from setups.servers.connect import ConnectServer
from setups.servers.local import HOST, free_port, stop_process
from setups.servers.prometheus import PrometheusServer
from setups.sqlite import ORDERS_DDL
from sinks.sqlite import SQLiteCommitter, SQLiteSink
from twophase import CommitOutcome, Handle, RetryableError, RetryPolicy
from twophase._coordinator import Coordinator
from twophase._crash import AFTER_DECISION
from twophase._state import StateStore
from twophase.errors import ConfigurationError
from twophase.metrics import StateCollector, parse_listen
from twophase.spark import write_stream
from twophase.testing.contract import QUERY_ID, abort, list_in_doubt, orders, prepare
from twophase.testing.driver import DriverSpec, generate_feed, launch, read_feed

FAST_RETRY = RetryPolicy(max_attempts=3, initial_backoff_s=0.001, max_backoff_s=0.002)
ROWS_PER_FILE = 50
FILES = 3


def scraped(store: StateStore) -> dict[str, float]:
    """What an endpoint serving ``store``'s query shows: sample name{labels} -> value."""
    registry = CollectorRegistry()
    registry.register(StateCollector([store]))
    text = generate_latest(registry).decode()
    return {_sample_key(sample.name, sample.labels): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def _sample_key(name: str, labels: dict[str, str]) -> str:
    extra = {k: v for k, v in labels.items() if k not in ("query", "namespace", "sink", "state")}
    return name + (f"{extra}" if extra else "")


class FlakyCommitter(SQLiteCommitter):
    """Every transaction's first commit attempt fails as retryable."""

    failed_once: ClassVar[set[str]] = set()

    def commit(self, handle: Handle) -> CommitOutcome:
        if str(handle.txn_id) not in self.failed_once:
            self.failed_once.add(str(handle.txn_id))
            raise RetryableError("the first commit attempt fails", fix="retried")
        return super().commit(handle)


class FlakyCommits(SQLiteSink):
    def committer(self) -> SQLiteCommitter:
        return FlakyCommitter(self)


def test_the_coordinator_counts_into_the_state_and_the_collector_exports_it(
    orders_db: Path, tmp_path: Path
) -> None:
    sink = FlakyCommits(orders_db, "orders")
    store = StateStore(tmp_path / "state")
    epoch = store.start_run("orders", {"sink": sink.kind}).epoch
    with Coordinator(sink, store, namespace="orders", epoch=epoch, retry=FAST_RETRY) as run:
        orphan = prepare(sink, orders(90, 1), batch=0, attempt=9)
        run.commit_batch(0, QUERY_ID, [prepare(sink, orders(0, 2), batch=0)])
        run.commit_batch(1, QUERY_ID, [prepare(sink, orders(2, 3), batch=1, partition=p)
                                       for p in range(2)])
        run.abort_batch(2, QUERY_ID, [prepare(sink, orders(8, 1), batch=2)])
    assert list_in_doubt(sink, "orders") == []

    seen = scraped(store)
    assert seen["twophase_batches_decided_total"] == 2
    assert seen["twophase_batches_committed_total"] == 2
    assert seen["twophase_rows_committed_total"] == 8
    assert seen["twophase_transactions_committed_total"] == 3
    assert seen["twophase_batches_given_up_total"] == 1
    assert seen["twophase_orphans_found_total"] >= 1  # the failed attempt's, swept by batch 0
    assert seen["twophase_orphans_aborted_total"] == seen["twophase_orphans_found_total"]
    # each first attempt, by the kind of error (a RetryableError with no cause behind it)
    assert seen["twophase_retries_total{'kind': 'RetryableError', 'operation': 'commit'}"] == 3
    assert seen["twophase_commit_duration_seconds_count"] == 2
    assert seen["twophase_decision_write_duration_seconds_count"] == 2
    assert seen["twophase_decision_write_duration_seconds_bucket{'le': '+Inf'}"] == 2
    assert seen["twophase_batches_pending"] == 0
    assert seen["twophase_last_committed_batch"] == 1
    assert seen["twophase_transactions_lost_total"] == 0
    assert str(orphan.txn_id) not in {str(h.txn_id) for h in list_in_doubt(sink, "orders")}


def test_a_lost_transaction_and_a_fenced_run_are_counted(orders_db: Path,
                                                         tmp_path: Path) -> None:
    sink = SQLiteSink(orders_db, "orders")
    store = StateStore(tmp_path / "state")
    zombie = Coordinator(sink, store, namespace="orders", epoch=store.start_run("orders", {}).epoch,
                         retry=FAST_RETRY)
    newer = Coordinator(sink, store, namespace="orders", epoch=store.start_run("orders", {}).epoch,
                        retry=FAST_RETRY)
    with pytest.raises(Exception, match="was fenced"):
        zombie.commit_batch(0, QUERY_ID, [prepare(sink, orders(0, 1), epoch=zombie.epoch)])
    lost = prepare(sink, orders(1, 1), epoch=newer.epoch)
    store.update(lambda s: replace(s, query_id=QUERY_ID), epoch=None)
    with newer:
        newer.commit_batch(0, QUERY_ID, [])
        abort(sink, lost)  # aborted outside after the decision below is written
        with pytest.raises(Exception, match="neither prepared nor recorded"):
            newer.commit_batch(1, QUERY_ID, [lost])

    seen = scraped(store)
    assert (seen["twophase_runs_fenced_total"], seen["twophase_transactions_lost_total"]) == (1, 1)
    assert seen["twophase_batches_pending"] == 1  # the lost batch stays pending
    assert seen["twophase_oldest_pending_batch_age_seconds"] >= 0


@pytest.mark.parametrize("listen, expected", [(9464, ("0.0.0.0", 9464)),
                                              ("127.0.0.1:9100", ("127.0.0.1", 9100)),
                                              (":80", ("0.0.0.0", 80))])
def test_metrics_port_reads_a_port_or_an_address(listen: int | str,
                                                 expected: tuple[str, int]) -> None:
    assert parse_listen(listen) == expected


@pytest.mark.parametrize("listen", ["http://x", 0, 70000, True, "host:"])
def test_a_bad_metrics_port_is_refused_with_the_fix(listen: object) -> None:
    with pytest.raises(ConfigurationError, match=r"is not a port.*Fix: pass a port number"):
        parse_listen(listen)


# -- a real Prometheus, a real driver crash --------------------------------------------------


@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """``python -m twophase.metrics`` for the checkpoint ``tmp_path/ckpt``: its port."""
    port, checkpoint = free_port(), tmp_path / "ckpt"
    process = subprocess.Popen([sys.executable, "-m", "twophase.metrics", "--listen",
                                f"{HOST}:{port}", str(checkpoint)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield port, checkpoint
    stop_process(process, 5.0)


@pytest.mark.spark
@pytest.mark.crash
@pytest.mark.parametrize("foreach_batch", [
    pytest.param(False, id="data_source"),
    # CI time: the counts are the state's, whichever adapter decides (the data source's, in
    # Spark's process, is the harder); foreachBatch crashed in CI by the SQLite crash suite
    pytest.param(True, id="foreach_batch", marks=pytest.mark.long)])
def test_prometheus_sees_a_driver_crash_with_a_decided_batch_and_its_recovery(
    spark: SparkSession, prometheus: PrometheusServer, exporter: tuple[int, Path],
    tmp_path: Path, *, foreach_batch: bool
) -> None:
    """The driver dies after deciding batch 1; an exporter beside it shows the pending batch;
    the restart (this process, ``metrics_port``) commits it: both endpoints show it through
    Prometheus, whichever process committed (Spark's, on the Data Source path)."""
    exporter_port, checkpoint = exporter
    database = tmp_path / "orders.db"
    with sqlite3.connect(database) as connection:
        connection.execute(ORDERS_DDL)
    generate_feed(tmp_path / "feed", files=FILES, rows_per_file=ROWS_PER_FILE)
    spec = DriverSpec(input_dir=str(tmp_path / "feed"), checkpoint=str(checkpoint),
                      sink_factory="sinks.sqlite:SQLiteSink",
                      sink_kwargs={"path": str(database), "table": "orders"},
                      foreach_batch=foreach_batch)
    prometheus.scrape(exporter_port, "exporter")

    crashed = launch(spec, workdir=tmp_path / "runs", crash_at=f"{AFTER_DECISION}@1")
    assert crashed.crashed, crashed.log.read_text()[-2000:]
    query = spec.state_store().read_existing().query_id
    labels = f'{{job="exporter",query="{query}",sink="sqlite"}}'
    prometheus.wait_for({
        f"twophase_batches_pending{labels}": 1,
        f"twophase_batches_decided_total{labels}": 2,
        f"twophase_batches_committed_total{labels}": 1,
        f"twophase_rows_committed_total{labels}": ROWS_PER_FILE,
        f"twophase_last_committed_batch{labels}": 0,
        f"twophase_oldest_pending_batch_age_seconds{labels}": lambda age: (age or 0) > 0,
    })

    driver_port = free_port()
    prometheus.scrape(driver_port, "driver")
    restarted = write_stream(read_feed(spark, tmp_path / "feed"),
                             SQLiteSink(database, "orders"), checkpoint_location=str(checkpoint),
                             trigger={"availableNow": True}, foreach_batch=foreach_batch,
                             metrics_port=f"{HOST}:{driver_port}")
    restarted.awaitTermination()
    for job in ("driver", "exporter"):
        labels = f'{{job="{job}",query="{query}",sink="sqlite"}}'
        prometheus.wait_for({
            f"twophase_batches_pending{labels}": 0,
            f"twophase_oldest_pending_batch_age_seconds{labels}": 0,
            f"twophase_batches_committed_total{labels}": FILES,
            f"twophase_batches_decided_total{labels}": FILES,
            f"twophase_rows_committed_total{labels}": FILES * ROWS_PER_FILE,
            f"twophase_last_committed_batch{labels}": FILES - 1,
            f"twophase_run_epoch{labels}": 2,
            # batch 1's decision latency died with the crashed driver; its commit was timed
            f"twophase_decision_write_duration_seconds_count{labels}": FILES - 1,
            f"twophase_commit_duration_seconds_count{labels}": FILES,
            f"twophase_transactions_lost_total{labels}": 0,
        })
    with sqlite3.connect(database) as connection:
        rows = [r[0] for r in connection.execute("SELECT event_id FROM orders ORDER BY 1")]
    assert rows == list(range(FILES * ROWS_PER_FILE))


# -- Spark Connect: the user's process is a thin client ---------------------------------------

#: A Connect client that starts the query with ``metrics_port``, runs it to its end, says so,
#: and keeps serving its metrics until its stdin closes.
CONNECT_CLIENT = """
import json, sys
from pyspark.sql import SparkSession
from sinks.sqlite import SQLiteCommitter, SQLiteSink
from twophase.spark import write_stream
from twophase.testing.driver import read_feed
spec = json.loads(sys.argv[1])
spark = SparkSession.builder.remote(spec["remote"]).getOrCreate()
write_stream(read_feed(spark, spec["feed"]), SQLiteSink(spec["database"], "orders"),
             checkpoint_location=spec["checkpoint"], trigger={"availableNow": True},
             foreach_batch=spec["foreach_batch"], metrics_port=spec["listen"]).awaitTermination()
print("finished", flush=True)
sys.stdin.read()
"""


@pytest.mark.spark
@pytest.mark.parametrize("foreach_batch", [
    pytest.param(False, id="data_source"),
    pytest.param(True, id="foreach_batch", marks=pytest.mark.long),  # the same reading of the
])                                                                   # state; CI seconds
def test_a_connect_client_serves_the_metrics_of_what_the_server_committed(
    connect: ConnectServer, tmp_path: Path, *, foreach_batch: bool
) -> None:
    """On Spark Connect every decision and commit runs in the server's processes; the
    client's endpoint still shows them all (it reads the state)."""
    database = tmp_path / "orders.db"
    with sqlite3.connect(database) as connection:
        connection.execute(ORDERS_DDL)
    generate_feed(tmp_path / "feed", files=FILES, rows_per_file=ROWS_PER_FILE)
    port = free_port()
    spec = {"remote": connect.url, "feed": str(tmp_path / "feed"), "database": str(database),
            "checkpoint": str(tmp_path / "ckpt"), "foreach_batch": foreach_batch,
            "listen": f"{HOST}:{port}"}
    with subprocess.Popen([sys.executable, "-c", CONNECT_CLIENT, json.dumps(spec)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as client:
        try:
            assert client.stdout is not None and client.stdout.readline() == "finished\n"
            with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=10) as reply:
                text = reply.read().decode()
        finally:
            client.kill()
    seen = {sample.name: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.labels.get("sink") == "sqlite"}
    assert seen["twophase_batches_committed_total"] == FILES
    assert seen["twophase_rows_committed_total"] == FILES * ROWS_PER_FILE
    assert seen["twophase_batches_pending"] == 0
    assert seen["twophase_commit_duration_seconds_count"] == FILES
