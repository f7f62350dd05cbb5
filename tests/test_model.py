"""The protocol model (twophase.testing.model) over every landed sink, and broken protocols caught.

Each sink runs generated crash schedules against its real server, one fresh external system per
example (a new SQLite file, a new MariaDB table, a new S3 prefix). Then four deliberately broken
variants of the protocol, written here by subclassing (the framework is untouched), each run
under the same model over SQLite: the model must find a counterexample within the CI budget.

Budget (profile ``twophase-ci``, derandomized, 25 steps per example): the examples per sink
below; the module ran in 51 s on the two-core machine with its servers (under 3 min bound; about
4x slower while other suites load the machine). ``TWOPHASE_HYPOTHESIS_PROFILE=long`` selects the
long profile (``chaos/model.py`` runs it per sink and prints the counts).
"""

from __future__ import annotations

import io
import itertools
import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from hypothesis import Phase

from sinks.http import HttpSink
from sinks.kafka import KafkaSink
from sinks.mysql import MySQLXASink
from sinks.s3 import S3Sink
from sinks.sqlite import SQLiteSink
from tests.conftest import MYSQL_ORDERS_DDL, ORDERS_DDL
from tests.servers.http_receiver import ReceiverProcess, new_path
from tests.servers.kafka import KafkaBroker, TopicReader
from tests.servers.mariadb import Db, MariaDBServer
from tests.servers.moto import MotoServer
from tests.servers.postgres import PgTarget, PgView
from twophase import Handle
from twophase._coordinator import Coordinator
from twophase._state import Decision, State, StateStore
from twophase.testing.contract import ORDER_COLUMNS
from twophase.testing.model import (
    PROFILE_ENV,
    ExactlyOnceError,
    ModelStats,
    ModelTarget,
    run_model,
)

#: Examples per sink in the CI profile (the long profile ignores these).
CI_EXAMPLES = {"sqlite": 40, "mysql": 12, "s3": 10, "kafka": 10, "http": 30, "postgres": 12}
MEMORY_FS = Path("/dev/shm")
#: The broken variants must be caught within this many examples (over SQLite), found but not
#: shrunk (shrinking a schedule takes minutes; a real failure of the model is shrunk).
BROKEN_BUDGET = 200
FIND_ONLY = (Phase.explicit, Phase.generate)


def ci_examples(sink: str) -> int | None:
    """The sink's CI bound, or None under the long profile (its own count applies)."""
    return None if os.environ.get(PROFILE_ENV) == "long" else CI_EXAMPLES[sink]


# -- targets: a fresh external system per example ----------------------------------------------


class SQLiteTarget:
    def __init__(self, path: Path) -> None:
        self.path = path
        with sqlite3.connect(path) as connection:
            connection.execute(ORDERS_DDL)

    def build(self) -> SQLiteSink:
        return SQLiteSink(self.path, "orders")

    def visible(self) -> list[int]:
        with sqlite3.connect(self.path) as connection:
            return [row[0] for row in connection.execute("SELECT event_id FROM orders")]


class MySQLTarget:
    def __init__(self, server: MariaDBServer, db: Db) -> None:
        self.server, self.db = server, db
        self.table = db.new_table(MYSQL_ORDERS_DDL, prefix="model_")

    def build(self) -> MySQLXASink:
        params = self.server.params
        return MySQLXASink(host=params.host, port=params.port, user=params.user,
                           password=params.password, database=params.database,
                           table=self.table, fencing=True)

    def visible(self) -> list[int]:
        return [row[0] for row in self.db.query(f"SELECT event_id FROM `{self.table}`")]


class S3Target:
    def __init__(self, server: MotoServer, bucket: str, prefix: str) -> None:
        self.server, self.bucket, self.prefix = server, bucket, prefix
        self.client = server.client()
        #: Event ids per (key, ETag): the listing is read every time, an object's body once.
        self.read: dict[tuple[str, str], list[int]] = {}

    def build(self) -> S3Sink:
        return S3Sink(self.bucket, self.prefix, **self.server.options(), format="parquet")

    def visible(self) -> list[int]:
        listing = self.client.list_objects_v2(Bucket=self.bucket, Prefix=f"{self.prefix}/")
        return [event_id for item in listing.get("Contents", ())
                for event_id in self.event_ids(item["Key"], item["ETag"])]

    def event_ids(self, key: str, etag: str) -> list[int]:
        if (key, etag) not in self.read:
            body = self.client.get_object(Bucket=self.bucket, Key=key, IfMatch=etag)["Body"]
            self.read[(key, etag)] = pq.read_table(io.BytesIO(body.read()), columns=[
                "event_id"]).column("event_id").to_pylist()
        return self.read[(key, etag)]


class KafkaTarget:
    """A fresh topic (and pool of transactional ids) per example, read read_committed by the
    run's one ``reader``."""

    def __init__(self, broker: KafkaBroker, reader: TopicReader) -> None:
        self.broker, self.reader, self.topic = broker, reader, broker.new_topic("model")

    def build(self) -> KafkaSink:
        sink = KafkaSink(**self.broker.options(), topic=self.topic, key="order_id",
                         transactional_id_prefix=f"{self.topic}-",
                         transaction_timeout_ms=60_000, min_commit_window_ms=0)
        sink.check_schema(ORDER_COLUMNS)
        return sink

    def visible(self) -> list[int]:
        return self.reader.event_ids(self.topic)


class HttpTarget:
    """A fresh receiver path and staging directory per example, judged by the receiver."""

    def __init__(self, receiver: ReceiverProcess, staging: Path) -> None:
        self.receiver, self.path, self.staging = receiver, new_path(), staging

    def build(self) -> HttpSink:
        return HttpSink(**self.receiver.sink_options(self.path), staging=str(self.staging))

    def visible(self) -> list[int]:
        return self.receiver.event_ids(self.path)


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """A directory in memory (tmpfs) where the machine has one: the model fsyncs a lot."""
    if not MEMORY_FS.is_dir():
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(dir=MEMORY_FS, prefix="twophase-model-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def sqlite_targets(directory: Path) -> Callable[[], ModelTarget]:
    numbers = itertools.count()
    return lambda: SQLiteTarget(directory / f"example-{next(numbers)}.db")


def report(sink: str, stats: ModelStats) -> None:
    print(f"\n{sink}: {stats.examples} examples, {stats.steps} steps, "
          f"{stats.seconds:.0f}s, faults {dict(stats.faults)}, "
          f"examples by batches decided {dict(sorted(stats.decided_batches.items()))}")


# -- the model over every sink ------------------------------------------------------------------


def test_model_over_sqlite(scratch: Path) -> None:
    stats = run_model(sqlite_targets(scratch), max_examples=ci_examples("sqlite"),
                      state_root=str(scratch))
    report("sqlite", stats)
    assert stats.examples >= 1


def test_model_over_mysql_xa(mariadb: MariaDBServer, db: Db, scratch: Path) -> None:
    stats = run_model(lambda: MySQLTarget(mariadb, db), max_examples=ci_examples("mysql"),
                      state_root=str(scratch))
    report("mysql", stats)
    assert stats.examples >= 1


def test_model_over_postgres(pg: PgView, scratch: Path) -> None:
    stats = run_model(lambda: PgTarget.fresh(pg), max_examples=ci_examples("postgres"),
                      state_root=str(scratch))
    report("postgres", stats)
    assert stats.examples >= 1


def test_model_over_s3(moto_server: MotoServer, s3_bucket: str, scratch: Path) -> None:
    prefixes = (f"model-{n}" for n in itertools.count())
    stats = run_model(lambda: S3Target(moto_server, s3_bucket, next(prefixes)),
                      max_examples=ci_examples("s3"), state_root=str(scratch))
    report("s3", stats)
    assert stats.examples >= 1


def test_model_over_kafka(kafka_broker: KafkaBroker, scratch: Path) -> None:
    with kafka_broker.reader() as reader:
        stats = run_model(lambda: KafkaTarget(kafka_broker, reader),
                          max_examples=ci_examples("kafka"), state_root=str(scratch))
    report("kafka", stats)
    assert stats.examples >= 1


def test_model_over_http(http_receiver: ReceiverProcess, scratch: Path) -> None:
    numbers = itertools.count()
    stats = run_model(lambda: HttpTarget(http_receiver, scratch / f"staging-{next(numbers)}"),
                      max_examples=ci_examples("http"), state_root=str(scratch))
    report("http", stats)
    assert stats.examples >= 1


# -- broken protocols: the model must catch each ------------------------------------------------


class CommitsBeforeTheDecisionIsDurable(Coordinator):
    """Makes the batch visible first, then writes the decision."""

    def _decide(self, batch: int, query_id: str, handles: Sequence[Handle]) -> Decision:
        self._commit_all(Decision(batch, self.epoch, time.time(), tuple(handles)))
        return super()._decide(batch, query_id, handles)


class AbortsADecidedBatch(Coordinator):
    """Rolls back what Spark aborts or replays, decided or not."""

    def abort_batch(self, batch: int, query_id: str | None, handles: Sequence[Handle]) -> None:
        self._abort_all(handles)

    def _finish_replay(self, state: State, batch: int, handles: Sequence[Handle]) -> None:
        decision = state.decision(batch)
        self._abort_all([*handles, *(decision.handles if decision else ())])


class ForgetsTheEpoch(StateStore):
    """Lets every run write the state, also a zombie."""

    def check_epoch(self, state: State, epoch: int) -> None:
        return None


class NeverSweepsOrphans(Coordinator):
    """Leaves the transactions of failed attempts and crashed runs in doubt."""

    def _sweep(self, state: State, query_id: str, *, up_to_batch: int,
               keep: Any) -> None:
        return None


@pytest.mark.parametrize("variant", [
    pytest.param({"coordinator_class": CommitsBeforeTheDecisionIsDurable},
                 id="commit-before-the-decision-is-durable"),
    pytest.param({"coordinator_class": AbortsADecidedBatch}, id="abort-a-decided-batch"),
    pytest.param({"store_class": ForgetsTheEpoch}, id="forget-the-epoch-check"),
    pytest.param({"coordinator_class": NeverSweepsOrphans}, id="never-sweep-orphans"),
])
def test_the_model_catches_a_broken_protocol(scratch: Path, variant: dict[str, Any]) -> None:
    with pytest.raises(ExactlyOnceError) as caught:
        run_model(sqlite_targets(scratch), max_examples=BROKEN_BUDGET, derandomize=True,
                  phases=FIND_ONLY, state_root=str(scratch), **variant)
    schedule = "\n".join(getattr(caught.value, "__notes__", ()))
    print(f"\ncaught: {caught.value}\n{schedule}")
