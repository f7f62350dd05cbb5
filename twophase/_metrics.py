"""A query's cumulative counts, kept in its state file: the durable half of the metrics.

Why the state file, and not counters in memory or prometheus_client's multiprocess mode:
Spark runs a stream's ``commit`` in a Python worker it may replace between calls (the Data
Source path), on Spark Connect in the server's processes, and a crash or a restart kills them
all. Counts kept in memory die with those processes; a multiprocess directory must be on the host of
every one of them and resets with every restart. The state file is already written by the
very steps being counted (the decision, the batch marked done), survives restarts and moves
with the checkpoint, and is read by every process that can see the query: the driver (the
user's process, also a Connect client), ``status``, ``cleanup`` and the standalone exporter
(:mod:`twophase.metrics`). So counts ride along those writes: no extra write on the path of a
batch. Rare events (a sweep of a given-up batch, a lost transaction, a fenced run) write once
more, counts only (``epoch=None``: safe from any process, merged by the compare-and-swap).

Counts are a flat mapping ``name -> number``, merged by addition. A counter with labels
keeps each after a colon (``retries:commit:OperationalError``); a histogram keeps per bucket
the count of observations at most its bound (not cumulative; ``+Inf`` for the rest), plus
``:sum`` and ``:count``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

#: The counters (names in the state file; the exported names add ``twophase_`` and ``_total``).
BATCHES_DECIDED = "batches_decided"
BATCHES_COMMITTED = "batches_committed"
BATCHES_GIVEN_UP = "batches_given_up"
#: Batches the deadline gate refused to decide: a transaction might expire before its commit.
BATCHES_EXPIRING = "batches_expiring"
ROWS_COMMITTED = "rows_committed"
TRANSACTIONS_COMMITTED = "transactions_committed"
ORPHANS_FOUND = "orphans_found"
ORPHANS_ABORTED = "orphans_aborted"
TRANSACTIONS_LOST = "transactions_lost"
RUNS_FENCED = "runs_fenced"
STATE_WRITE_RACES = "state_write_races"
#: Labelled by the operation retried and the kind of error: retries:commit:OperationalError.
RETRIES = "retries"
#: A sink group's decided batches found split (a member lost a decided transaction after an
#: earlier member committed), labelled by the member lost: members_lost:events.
MEMBERS_LOST = "members_lost"

#: The histograms, in seconds.
DECISION_SECONDS = "decision_seconds"
COMMIT_SECONDS = "commit_seconds"
#: How long a batch's callback waited for the batch before it to be committed behind it (the
#: back-pressure of ``twophase._pipeline``): near zero while commits keep up with batches.
COMMIT_WAIT_SECONDS = "commit_wait_seconds"
#: Bucket bounds of all three: a decision write takes milliseconds (local) to a second (S3), a
#: commit fan-out up to the retry policy's patience.
BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
INF = "+Inf"
SUM, COUNT = "sum", "count"

Counts = Mapping[str, float]


def key(name: str, label: str) -> str:
    """The key of one labelled value of ``name`` (a retried operation, a histogram bucket)."""
    return f"{name}:{label}"


def retry_key(operation: str, error: BaseException) -> str:
    """The key of one retry of ``operation``: labelled by the error's kind, the class of the
    system's own error behind it (``OperationalError``, ``KafkaTimeoutError``), else of the
    classified error itself. Class names keep the label's values few, as messages would not."""
    cause = error.__cause__ or error
    return key(key(RETRIES, operation), type(cause).__name__)


def merged(first: Counts, second: Counts) -> dict[str, float]:
    """Both counts added up."""
    total = dict(first)
    for name, value in second.items():
        total[name] = total.get(name, 0) + value
    return total


def observation(name: str, seconds: float) -> dict[str, float]:
    """The counts of one observation of histogram ``name``."""
    bucket = next((str(bound) for bound in BUCKETS_S if seconds <= bound), INF)
    return {key(name, bucket): 1, key(name, SUM): seconds, key(name, COUNT): 1}


class Tally:
    """Counts one process gathered and has not written yet (thread-safe: commits run in
    parallel). A write takes a :meth:`snapshot` into the state and then :meth:`settles` it."""

    def __init__(self) -> None:
        self._counts: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, name: str, amount: float = 1) -> None:
        self.add_all({name: amount})

    def add_all(self, counts: Counts) -> None:
        with self._lock:
            self._counts = merged(self._counts, counts)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return dict(self._counts)

    def settle(self, written: Counts) -> None:
        """Forget what a successful write recorded (what came in meanwhile stays)."""
        with self._lock:
            left = merged(self._counts, {name: -value for name, value in written.items()})
            self._counts = {name: value for name, value in left.items() if value}

