"""Prometheus metrics of twophase queries, read from their state files.

Turn them on with one option, ``write_stream(..., metrics_port=9464)`` (or ``"127.0.0.1:9464"``
to bind one interface): the process that starts the query serves ``/metrics`` on that port.
Or run an exporter beside the query, which goes on reporting while the driver is down (when
a decided batch waits for the next start, the moment an alert matters most)::

    python -m twophase.metrics --listen :9464 /data/checkpoints/orders /data/checkpoints/pay

Every value comes from the query's state file (see :mod:`twophase._metrics` for why): the
counters are cumulative over every run of the query and every process that committed for it
(Spark's commit processes on the Data Source path, the driver with ``foreach_batch``, a Spark
Connect server, ``cleanup``), and each scrape reads the state once. Labels: ``query`` (Spark's
query id, stable across restarts), ``namespace`` and ``sink`` (the sink's kind); never a
transaction.

=============================================  ==============================================
metric                                         meaning
=============================================  ==============================================
``twophase_batches_decided_total``             decisions written (all their transactions
                                               will commit)
``twophase_batches_committed_total``           decided batches committed and marked done
``twophase_batches_given_up_total``            batches aborted before a decision (nothing
                                               of them visible)
``twophase_batches_expiring_total``            batches not decided because a transaction
                                               might expire before its commit (replayed)
``twophase_rows_committed_total``              rows made visible
``twophase_transactions_committed_total``      sink transactions of committed batches
``twophase_decision_write_duration_seconds``   histogram: writing a decision to the state
``twophase_commit_duration_seconds``           histogram: committing a decided batch
``twophase_commit_wait_duration_seconds``      histogram: a batch's wait, before its
                                               decision, for the batch before it to commit
                                               behind (back-pressure; pipelined queries)
``twophase_batches_pending``                   decided batches not yet committed
``twophase_oldest_pending_batch_age_seconds``  age of the oldest of them (0: none)
``twophase_last_committed_batch``              the last batch id committed
``twophase_last_commit_timestamp_seconds``     when the last batch was done (Unix time)
``twophase_run_epoch``                         the fencing epoch: runs the query has had
``twophase_orphans_found_total``               undecided transactions the sweeps found
``twophase_orphans_aborted_total``             those the sweeps aborted (the rest: later)
``twophase_transactions_lost_total``           commits that found a decided transaction
                                               gone: rows may be lost (page)
``twophase_runs_fenced_total``                 steps refused: a newer run took over
``twophase_state_write_races_total``           state writes that lost a race (S3)
``twophase_retries_total``                     retries of retryable errors, by ``operation``
                                               and ``kind`` (the class of the error)
``twophase_members_lost_total``                a sink group's batches split: ``member`` lost
                                               a decided transaction after an earlier member
                                               committed the batch (page)
``twophase_state_readable``                    1 if the state file could be read, else 0
=============================================  ==============================================
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import REGISTRY, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from twophase import _metrics as counts
from twophase._state import State, StateStore
from twophase.errors import ConfigurationError, TwoPhaseError

__all__ = ["StateCollector", "serve", "watch"]

log = logging.getLogger(__name__)

PREFIX = "twophase_"
LABELS = ("query", "namespace", "sink")
#: Where ``metrics_port=PORT`` listens: every interface, as exporters do (the endpoint shows
#: counts only, no rows and no credentials); pass ``"HOST:PORT"`` to bind one.
DEFAULT_ADDRESS = "0.0.0.0"  # noqa: S104 - an exporter is scraped from another host

#: (state key, exported name without ``_total``, help)
_COUNTERS = (
    (counts.BATCHES_DECIDED, "batches_decided", "Batches decided (written to the state)."),
    (counts.BATCHES_COMMITTED, "batches_committed", "Decided batches committed and done."),
    (counts.BATCHES_GIVEN_UP, "batches_given_up", "Batches aborted before a decision."),
    (counts.BATCHES_EXPIRING, "batches_expiring",
     "Batches not decided: a transaction might expire before its commit."),
    (counts.ROWS_COMMITTED, "rows_committed", "Rows made visible."),
    (counts.TRANSACTIONS_COMMITTED, "transactions_committed",
     "Sink transactions of committed batches."),
    (counts.ORPHANS_FOUND, "orphans_found", "Undecided transactions found by the sweeps."),
    (counts.ORPHANS_ABORTED, "orphans_aborted", "Undecided transactions aborted by the sweeps."),
    (counts.TRANSACTIONS_LOST, "transactions_lost",
     "Commits that found a decided transaction gone: rows may be lost."),
    (counts.RUNS_FENCED, "runs_fenced", "Steps refused because a newer run took over."),
    (counts.STATE_WRITE_RACES, "state_write_races", "State writes that lost a race."),
)
_HISTOGRAMS = (
    (counts.DECISION_SECONDS, "decision_write_duration_seconds",
     "Time to write a batch's decision to the state."),
    (counts.COMMIT_SECONDS, "commit_duration_seconds",
     "Time to commit every transaction of a decided batch."),
    (counts.COMMIT_WAIT_SECONDS, "commit_wait_duration_seconds",
     "Time a batch waited, before its decision, for the batch before it to commit behind."),
)


@dataclass(frozen=True)
class _Watched:
    store: StateStore
    sink: str | None  # the sink's kind, if the watcher knows it (else the state's record)


class StateCollector(Collector):
    """A prometheus_client collector of the queries whose states it watches."""

    def __init__(self, stores: Iterable[StateStore] = ()) -> None:
        self._watched: dict[str, _Watched] = {}
        self._lock = threading.Lock()
        for store in stores:
            self.watch(store)

    def watch(self, store: StateStore, sink: str | None = None) -> None:
        with self._lock:
            self._watched[store.path] = _Watched(store, sink)

    def describe(self) -> list[Metric]:
        return []  # the names are fixed; no need to read every state at registration

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            watched = list(self._watched.values())
        now = time.time()
        families = _Families()
        for item in watched:
            try:
                state = item.store.read()
            except TwoPhaseError as exc:
                log.warning("metrics: cannot read %s: %s", item.store.path, exc)
                families.readable.add_metric([item.store.path], 0)
                continue
            families.readable.add_metric([item.store.path], 1)
            if state is not None:
                families.add(state, item.sink, now)
        yield from families.all()


class _Families:
    """The metric families of one scrape, filled state by state."""

    def __init__(self) -> None:
        self.counters = {name: CounterMetricFamily(PREFIX + exported, doc, labels=LABELS)
                         for name, exported, doc in _COUNTERS}
        self.retries = CounterMetricFamily(PREFIX + "retries", "Retries of retryable errors.",
                                           labels=(*LABELS, "operation", "kind"))
        self.members_lost = CounterMetricFamily(
            PREFIX + "members_lost", "Sink group batches split: a member lost a decided "
            "transaction after an earlier member committed.", labels=(*LABELS, "member"))
        self.histograms = {name: HistogramMetricFamily(PREFIX + exported, doc, labels=LABELS)
                           for name, exported, doc in _HISTOGRAMS}
        self.gauges = {
            "pending": GaugeMetricFamily(PREFIX + "batches_pending",
                                         "Decided batches not yet committed.", labels=LABELS),
            "age": GaugeMetricFamily(PREFIX + "oldest_pending_batch_age_seconds",
                                     "Age of the oldest decided batch not yet committed.",
                                     labels=LABELS),
            "last": GaugeMetricFamily(PREFIX + "last_committed_batch",
                                      "The last batch id committed.", labels=LABELS),
            "when": GaugeMetricFamily(PREFIX + "last_commit_timestamp_seconds",
                                      "When the last batch was marked done.", labels=LABELS),
            "epoch": GaugeMetricFamily(PREFIX + "run_epoch", "The query's fencing epoch.",
                                       labels=LABELS),
        }
        self.readable = GaugeMetricFamily(PREFIX + "state_readable",
                                          "1 if the state file could be read.", labels=["state"])

    def add(self, state: State, sink: str | None, now: float) -> None:
        labels = [state.query_id or "", state.namespace,
                  sink or str(state.settings.get("sink", ""))]
        metrics = state.metrics
        for name, family in self.counters.items():
            family.add_metric(labels, metrics.get(name, 0.0))
        for name, value in sorted(metrics.items()):
            if name.startswith(counts.RETRIES + ":"):
                operation, _, kind = name.removeprefix(counts.RETRIES + ":").partition(":")
                self.retries.add_metric([*labels, operation, kind], value)
            elif name.startswith(counts.MEMBERS_LOST + ":"):
                member = name.removeprefix(counts.MEMBERS_LOST + ":")
                self.members_lost.add_metric([*labels, member], value)
        for name, histogram in self.histograms.items():
            histogram.add_metric(labels, _buckets(metrics, name),
                                 sum_value=metrics.get(counts.key(name, counts.SUM), 0.0))
        oldest = min((decision.decided_at for decision in state.pending), default=now)
        self.gauges["pending"].add_metric(labels, len(state.pending))
        self.gauges["age"].add_metric(labels, max(0.0, now - oldest))
        self.gauges["last"].add_metric(labels, state.last_done_batch)
        self.gauges["epoch"].add_metric(labels, state.epoch)
        if state.history:
            self.gauges["when"].add_metric(labels, state.history[-1].done_at)

    def all(self) -> Iterator[Metric]:
        yield from self.counters.values()
        yield self.retries
        yield self.members_lost
        yield from self.histograms.values()
        yield from self.gauges.values()
        yield self.readable


def _buckets(metrics: Mapping[str, float], name: str) -> list[tuple[str, float]]:
    """Cumulative buckets of histogram ``name`` from the state's per-bucket counts."""
    total, buckets = 0.0, []
    for bound in (*(str(bound) for bound in counts.BUCKETS_S), counts.INF):
        total += metrics.get(counts.key(name, bound), 0.0)
        buckets.append((bound, total))
    return buckets


# -- this process's endpoint -------------------------------------------------------------------

#: This process's collector, in prometheus_client's default registry (empty until watched).
_COLLECTOR = StateCollector()
REGISTRY.register(_COLLECTOR)
_SERVING: set[tuple[str, int]] = set()
_SERVING_LOCK = threading.Lock()


def watch(store: StateStore | str | os.PathLike[str], *, sink: str | None = None) -> None:
    """Report the query whose state is ``store`` (or a state location) in this process's
    metrics: prometheus_client's default registry, which :func:`serve` serves (and so does
    your own ``prometheus_client.start_http_server``)."""
    _COLLECTOR.watch(store if isinstance(store, StateStore) else StateStore(store), sink)


def serve(listen: int | str) -> tuple[str, int]:
    """Serve this process's metrics on ``listen`` (a port, or ``"HOST:PORT"``), once per
    address; return the address."""
    address = parse_listen(listen)
    with _SERVING_LOCK:
        if address in _SERVING:
            return address
        try:
            start_http_server(address[1], addr=address[0], registry=REGISTRY)
        except OSError as exc:
            raise ConfigurationError(
                f"cannot serve metrics on {address[0]}:{address[1]}: {exc.strerror or exc}.",
                fix="pick a free port for metrics_port (one per process; queries of one "
                "process share it)") from exc
        _SERVING.add(address)
    log.info("serving twophase metrics on http://%s:%d/metrics", *address)
    return address


def parse_listen(listen: object) -> tuple[str, int]:
    """(address, port) of ``9464``, ``"9464"``, ``":9464"`` or ``"127.0.0.1:9464"``."""
    host, _, port = str(listen).rpartition(":")
    if isinstance(listen, bool) or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigurationError(f"metrics_port={listen!r} is not a port.",
                                 fix="pass a port number like 9464, or 'HOST:PORT'")
    return host or DEFAULT_ADDRESS, int(port)


def _state_of(location: str) -> StateStore:
    """The state directory ``location``, else the state of the checkpoint ``location`` (which
    may not exist yet: the exporter can start before the query's first run)."""
    direct = StateStore(location)
    return direct if direct.exists() else StateStore.for_checkpoint(location)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m twophase.metrics", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", required=True, help="PORT or HOST:PORT to serve /metrics")
    parser.add_argument("locations", nargs="+",
                        help="checkpoint locations or state directories of the queries")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        for location in args.locations:
            watch(_state_of(location))
        serve(args.listen)
    except ConfigurationError as exc:
        log.error("%s", exc)
        return 2
    threading.Event().wait()  # serve until killed
    return 0


if __name__ == "__main__":
    sys.exit(main())
