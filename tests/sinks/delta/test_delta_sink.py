"""sinks.delta at the sink level, on a local table read back by DuckDB's Delta reader: the
shared contract suite, and what only this sink does (one commit per batch, its proof after an
OPTIMIZE, a file vacuumed before its commit, the sweep after an OPTIMIZE, racing committers, a
checkpoint reset, exact statistics, refusals)."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import deltalake.exceptions
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from setups.delta import DeltaSetup, data_files, delta_scan, reader, s3_storage_options
from setups.lake import commit_batch
from setups.s3 import MOTO_HEAD_BUCKET
from setups.servers.moto import MotoServer
from setups.sqlite import SQLiteSetup
from sinks.delta import DeltaSink
from sinks.delta.errors import classify, iam_policy
from sinks.delta.schema import RETENTION_PROPERTY
from sinks.delta.snapshot import app_id_of
from sinks.delta.stats import FileStats
from tests import REPO
from twophase import (
    AbortOutcome,
    Column,
    CommitOutcome,
    ConfigurationError,
    FatalError,
    Handle,
    RetryableError,
    RetryPolicy,
    SchemaMismatchError,
    StageCommits,
    TransactionLostError,
)
from twophase._coordinator import Coordinator
from twophase._state import StateStore
from twophase.testing import GroupTarget
from twophase.testing.contract import (
    NAMESPACE,
    ORDER_COLUMNS,
    QUERY_ID,
    SinkContract,
    list_in_doubt,
    orders,
    prepare,
)

#: Racing committers: trials in CI (on S3: fewer), under -m long, and how often a committer
#: retries a lost race.
RACE_TRIALS, RACE_TRIALS_S3, RACE_TRIALS_LONG = 20, 10, 100
#: Examples of the filtered DuckDB read (CI time: 20, from 40 before issue 48; each a new table).
STATS_EXAMPLES = 20
FAST_RETRY = RetryPolicy(max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02)


class TestDeltaContract(SinkContract):
    setup_fixture = "delta_setup"
    purges_commit_records = False  # the proof is the table's own log


class TestDeltaOnS3Contract(TestDeltaContract):
    """The table under an S3 prefix (moto, conditional puts): the data files and the intents
    through twophase's S3 client, the log through deltalake's."""

    setup_fixture = "delta_s3_setup"


# -- helpers -------------------------------------------------------------------------------------

def table_version(sink: DeltaSink) -> int:
    return int(DeltaTable(sink.table_uri, storage_options=sink.storage_options or None).version())


def files_on_disk(sink: DeltaSink) -> set[str]:
    return data_files(Path(sink.table_uri))


def live_files(sink: DeltaSink) -> set[str]:
    table = pa.table(DeltaTable(sink.table_uri).get_add_actions(flatten=True))
    return set(table.column("path").to_pylist())


@pytest.fixture
def sink(delta_setup: DeltaSetup) -> DeltaSink:
    built = delta_setup.new_target().build()
    assert isinstance(built, DeltaSink)
    built.check_schema(ORDER_COLUMNS)
    return built


@pytest.fixture
def target_of(delta_setup: DeltaSetup) -> Callable[[DeltaSink], list[int]]:
    def visible(sink: DeltaSink) -> list[int]:
        return sorted(delta_setup.visible(delta_setup.new_target(table_uri=sink.table_uri)))
    return visible


# -- one commit per batch, and its proof ---------------------------------------------------------

def test_a_batch_is_one_delta_commit_and_finishing_it_again_adds_nothing(
        sink: DeltaSink, target_of: Callable[[DeltaSink], list[int]]) -> None:
    handles = [prepare(sink, orders(10 * p, 3), partition=p) for p in range(4)]
    before = table_version(sink)
    assert commit_batch(sink, handles) == [CommitOutcome.COMMITTED] * 4
    assert table_version(sink) == before + 1
    history = DeltaTable(sink.table_uri).history(1)[0]
    assert history["twophase.batch"] == 0 and len(history["twophase.transactions"]) == 4
    assert commit_batch(sink, handles) == [CommitOutcome.ALREADY_COMMITTED] * 4
    assert table_version(sink) == before + 1
    assert target_of(sink) == sorted(10 * p + i for p in range(4) for i in range(3))


def test_a_repeated_commit_after_a_compaction_adds_nothing(
        sink: DeltaSink, target_of: Callable[[DeltaSink], list[int]]) -> None:
    first = [prepare(sink, orders(0, 5), batch=0, partition=p) for p in range(1)]
    second = [prepare(sink, orders(5, 5), batch=1, partition=p) for p in range(1)]
    commit_batch(sink, first)
    commit_batch(sink, second)
    DeltaTable(sink.table_uri).optimize.compact()
    assert not live_files(sink) & {f["path"] for h in first for f in h.data["files"]}
    assert commit_batch(sink, first) == [CommitOutcome.ALREADY_COMMITTED]
    assert commit_batch(sink, second) == [CommitOutcome.ALREADY_COMMITTED]
    assert target_of(sink) == list(range(10))  # no file resurrected: 10 rows, not 15 or 20


def test_a_decided_batch_whose_file_was_vacuumed_is_lost_and_nothing_is_added(
        sink: DeltaSink, target_of: Callable[[DeltaSink], list[int]]) -> None:
    kept, gone = (prepare(sink, orders(0, 3), partition=0),
                  prepare(sink, orders(3, 3), partition=1))
    DeltaTable(sink.table_uri).vacuum(retention_hours=0, dry_run=False,
                                      enforce_retention_duration=False, full=True)
    assert files_on_disk(sink) == set()  # VACUUM (full) deleted the unreferenced files
    before = table_version(sink)
    with pytest.raises(TransactionLostError, match=r"batch 0.*part-.*gone.*Fix: "):
        commit_batch(sink, [kept, gone])
    assert table_version(sink) == before
    assert target_of(sink) == []


def test_a_file_past_the_vacuum_retention_is_never_added(
        delta_setup: DeltaSetup, target_of: Callable[[DeltaSink], list[int]]) -> None:
    sink = delta_setup.new_target(
        configuration={RETENTION_PROPERTY: "interval 1 second"}).build()
    assert isinstance(sink, DeltaSink)
    sink.check_schema(ORDER_COLUMNS)
    handle = prepare(sink, orders(0, 2))
    with sink.committer() as committer:
        deadline = committer.commit_deadline(handle)
    assert deadline == handle.data["files"][0]["modification_time"] / 1000 + 1
    time.sleep(1.2)
    with pytest.raises(TransactionLostError, match=r"deletedFileRetentionDuration"):
        commit_batch(sink, [handle])
    assert target_of(sink) == []


def test_the_commit_deadline_is_the_oldest_file_plus_the_default_seven_days(
        sink: DeltaSink) -> None:
    handle, empty = prepare(sink, orders(0, 2), partition=0), prepare(sink, [], partition=1)
    with sink.committer() as committer:
        assert committer.commit_deadline(handle) == pytest.approx(
            handle.data["files"][0]["modification_time"] / 1000 + 7 * 86400)
        assert committer.commit_deadline(empty) is None


def test_a_batch_that_could_outlive_the_vacuum_retention_is_not_decided(
        delta_setup: DeltaSetup, tmp_path: Path) -> None:
    """A table whose VACUUM may take an unreferenced file after 10 seconds: inside the gate's
    margin, so the coordinator refuses to decide the batch and aborts it; nothing is added."""
    target = delta_setup.new_target(configuration={RETENTION_PROPERTY: "interval 10 seconds"})
    sink = target.build()
    assert isinstance(sink, DeltaSink)
    sink.check_schema(ORDER_COLUMNS)
    store = StateStore(tmp_path / "state")
    run = Coordinator(sink, store, namespace=NAMESPACE,
                      epoch=store.start_run(NAMESPACE, {}).epoch, retry=FAST_RETRY)
    handles = [prepare(sink, orders(10 * p, 2), batch=0, partition=p) for p in range(2)]
    with pytest.raises(RetryableError, match="may expire"):
        run.commit_batch(0, QUERY_ID, handles)
    assert store.read_existing().pending == ()
    assert delta_setup.visible(target) == []
    assert list_in_doubt(sink, NAMESPACE) == [] and delta_setup.in_doubt(target) == []


# -- orphans: what no commit references ----------------------------------------------------------

def test_a_committed_batch_survives_an_optimize_and_the_sweeps_after_it(
        sink: DeltaSink, target_of: Callable[[DeltaSink], list[int]]) -> None:
    committed = [prepare(sink, orders(10 * p, 2), partition=p) for p in range(3)]
    orphan = prepare(sink, orders(100, 2), partition=0, attempt=1)  # a failed attempt's
    commit_batch(sink, committed)
    DeltaTable(sink.table_uri).optimize.compact()
    later = prepare(sink, orders(200, 2), batch=1)  # pre-committed, not yet decided
    for _sweep in range(3):  # every batch's sweep, as the coordinator runs it
        listed = list_in_doubt(sink, NAMESPACE)
        assert {h.txn_id for h in listed} == {orphan.txn_id, later.txn_id}
    with sink.committer() as committer:
        assert committer.abort(listed[0]) is AbortOutcome.ABORTED
        for handle in committed:  # never deleted: a commit references them (tombstones)
            assert committer.abort(handle) is AbortOutcome.NOT_FOUND
    assert target_of(sink) == [0, 1, 10, 11, 20, 21]
    for handle in committed:
        for data_file in handle.data["files"]:
            assert (Path(sink.table_uri) / data_file["path"]).exists()


def test_a_transaction_id_used_twice_never_overwrites_the_committed_file(
        sink: DeltaSink, target_of: Callable[[DeltaSink], list[int]]) -> None:
    commit_batch(sink, [prepare(sink, orders(0, 2))])
    with pytest.raises(FatalError, match=r"already committed once.*Fix: "):
        prepare(sink, orders(10, 2))
    assert target_of(sink) == [0, 1]


# -- racing committers, checkpoint resets ---------------------------------------------------------

@pytest.mark.parametrize(("where", "trials"), [
    ("delta_setup", RACE_TRIALS), ("delta_s3_setup", RACE_TRIALS_S3),
    pytest.param("delta_setup", RACE_TRIALS_LONG, marks=pytest.mark.long),
    pytest.param("delta_s3_setup", RACE_TRIALS_LONG, marks=pytest.mark.long)])
def test_two_committers_racing_on_one_decided_batch_land_one_commit(
        where: str, trials: int, request: pytest.FixtureRequest) -> None:
    """Two drivers (a zombie and its successor) commit the same decided batch at once."""
    setup: DeltaSetup = request.getfixturevalue(where)
    target = setup.new_target()
    sink = target.build()
    assert isinstance(sink, DeltaSink)
    sink.check_schema(ORDER_COLUMNS)
    expected: list[int] = []
    lost_races: list[RetryableError] = []
    for batch in range(trials):
        handles = [prepare(sink, orders(100 * batch + 10 * p, 2), batch=batch, partition=p)
                   for p in range(2)]
        before, start = table_version(sink), threading.Barrier(2)

        def drive(handles: Sequence[Handle] = handles,
                  start: threading.Barrier = start) -> list[CommitOutcome]:
            with sink.committer() as committer:
                start.wait()
                return commit_batch(sink, handles, committer=committer, retried=lost_races)

        with ThreadPoolExecutor(max_workers=2) as pool:
            outcomes = [future.result() for future in [pool.submit(drive) for _ in range(2)]]
        assert table_version(sink) == before + 1, f"batch {batch}: not one commit"
        assert sorted(o.value for outcome in outcomes for o in outcome).count("committed") == 2
        expected += [100 * batch + 10 * p + i for p in range(2) for i in range(2)]
    assert sorted(setup.visible(target)) == sorted(expected)
    assert setup.in_doubt(target) == []
    assert lost_races, "the committers never raced"
    assert all("Concurrent transaction" in str(race) or "already exists" in str(race)
               for race in lost_races)


def test_a_checkpoint_reset_gets_a_new_app_id_and_its_batch_0_lands(
        sink: DeltaSink, target_of: Callable[[DeltaSink], list[int]]) -> None:
    old = prepare(sink, orders(0, 2), batch=5)
    commit_batch(sink, [old])
    reset = prepare(sink, orders(2, 2), batch=0, query_id=str(uuid.uuid4()))
    assert app_id_of(reset.txn_id) != app_id_of(old.txn_id)
    assert commit_batch(sink, [reset]) == [CommitOutcome.COMMITTED]
    assert target_of(sink) == [0, 1, 2, 3]
    table = DeltaTable(sink.table_uri)
    assert (table.transaction_version(app_id_of(old.txn_id)),
            table.transaction_version(app_id_of(reset.txn_id))) == (5, 0)


# -- files, partitions, refusals -----------------------------------------------------------------

def test_a_checkpoint_reset_under_an_explicit_app_id_is_refused_naming_the_fix(
        delta_setup: DeltaSetup) -> None:
    """Delta's own trap, with app_id= given: the reset query's batch 0 would be dropped as one
    the table holds; it is refused before it is decided, and a new app id delivers it."""
    target = delta_setup.new_target(app_id="orders-job")
    sink = target.build()
    assert isinstance(sink, DeltaSink)
    sink.check_schema(ORDER_COLUMNS)
    old = prepare(sink, orders(0, 2), batch=5)
    with sink.committer() as committer:
        committer.check_committable([old])
        commit_batch(sink, [old], committer=committer)
    reset = prepare(sink, orders(2, 2), batch=0, query_id=str(uuid.uuid4()))
    with sink.committer() as committer, pytest.raises(
            ConfigurationError, match=r"holds app id 'orders-job' at version 5.*Fix: give this "
                                      r"checkpoint a new app_id="):
        committer.check_committable([reset])
    renamed = DeltaSink(sink.table_uri, app_id="orders-job-2")
    renamed.check_schema(ORDER_COLUMNS)
    with renamed.committer() as committer:
        committer.check_committable([reset])
        assert commit_batch(renamed, [reset], committer=committer) == [CommitOutcome.COMMITTED]
    assert sorted(delta_setup.visible(target)) == [0, 1, 2, 3]
    assert DeltaTable(sink.table_uri).transaction_version("orders-job-2") == 0


def test_an_empty_app_id_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"app_id=.*non-empty"):
        DeltaSink("/tmp/never", app_id=" ")


def test_a_partitioned_table_gets_its_files_in_partition_directories_and_duckdb_prunes(
        delta_setup: DeltaSetup) -> None:
    sink = delta_setup.new_target(partition_by=("status",), max_file_bytes=1).build()
    assert isinstance(sink, DeltaSink)
    sink.check_schema(ORDER_COLUMNS)
    rows = orders(0, 4, "paid") + orders(4, 2, "sent out") + orders(6, 3, "paid")
    handle = prepare(sink, rows, arrow=True)
    assert {f["partition_values"]["status"] for f in handle.data["files"]} == {"paid",
                                                                             "sent out"}
    assert len(handle.data["files"]) > 2  # max_file_bytes=1: a new file every row group
    assert all(f["path"].startswith(("status=paid/", "status=sent%20out/"))
               for f in handle.data["files"])
    commit_batch(sink, [handle])
    with contextlib.closing(reader()) as connection:
        scan = delta_scan(sink.table_uri)
        assert connection.execute(
            f"SELECT status, count(*) FROM {scan} GROUP BY ALL ORDER BY 1").fetchall() == [
            ("paid", 7), ("sent out", 2)]
        plan = connection.execute(
            f"EXPLAIN ANALYZE SELECT * FROM {scan} WHERE status = 'sent out'").fetchall()
    sent_out = sum(f["partition_values"]["status"] == "sent out" for f in handle.data["files"])
    assert f"Scanning Files: {sent_out}/{len(handle.data['files'])}" in plan[0][1]
    assert list_in_doubt(sink, NAMESPACE) == []


def test_a_column_of_another_type_is_refused_naming_the_column_and_the_fix(
        sink: DeltaSink) -> None:
    wrong = [Column("event_id", "int", False), *ORDER_COLUMNS[1:]]
    with pytest.raises(SchemaMismatchError, match=r"'event_id' is long.*Fix: cast"):
        sink.check_schema(wrong)


def test_a_missing_table_is_refused_unless_asked_to_create_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"create=True"):
        DeltaSink(str(tmp_path / "none")).check_schema(ORDER_COLUMNS)


@pytest.mark.parametrize(("configuration", "named"), [
    ({"delta.enableDeletionVectors": "true"}, "deletion vectors"),
    ({"delta.columnMapping.mode": "name"}, "column mapping"),
    ({"delta.setTransactionRetentionDuration": "interval 1 days"},
     "delta.setTransactionRetentionDuration"),
])
def test_a_feature_the_sink_cannot_honour_is_refused_at_the_start(
        tmp_path: Path, configuration: dict[str, str], named: str) -> None:
    uri = str(tmp_path / "table")
    DeltaTable.create(uri, schema=pa.schema([("event_id", pa.int64())]),
                      configuration=configuration)
    with pytest.raises(ConfigurationError, match=re.escape(named)):
        DeltaSink(uri).check_schema(ORDER_COLUMNS[:1])


def test_errors_are_classified_once() -> None:
    race = deltalake.exceptions.CommitFailedError(
        "Failed to commit transaction: Concurrent transaction failed.")
    assert isinstance(classify(race, "a commit"), RetryableError)
    assert isinstance(classify(deltalake.exceptions.CommitFailedError("other"), "a commit"),
                      FatalError)
    assert isinstance(classify(OSError("No space left on device"), "a write"),
                      ConfigurationError)
    assert isinstance(classify(pa.ArrowInvalid("bad"), "a write"), SchemaMismatchError)


# -- statistics: exact, or none --------------------------------------------------------------------

STATS_COLUMNS = (Column("id", "bigint", False), Column("i", "int"), Column("f", "double"),
                 Column("s", "string"), Column("d", "date"), Column("ts", "timestamp"))
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"),
               max_size=6)
MOMENTS = st.datetimes(min_value=dt.datetime(1970, 1, 2), max_value=dt.datetime(2100, 1, 1),
                       timezones=st.just(dt.UTC))
VALUES: dict[str, st.SearchStrategy[Any]] = {
    "i": st.integers(-(2**31), 2**31 - 1),
    "f": st.floats(allow_nan=True, allow_infinity=True, width=64),
    "s": TEXT,
    "d": st.dates(min_value=dt.date(1, 1, 1)),
    "ts": MOMENTS,
}
ROW = st.fixed_dictionaries({name: st.none() | values for name, values in VALUES.items()})
FILTER = st.sampled_from(["i", "f", "s", "d", "ts"]).flatmap(
    lambda name: st.tuples(st.just(name), st.sampled_from(["<", "<=", "=", ">=", ">"]),
                           VALUES[name]))


def literal(name: str, value: Any) -> str:
    if name == "f":
        return f"'{value!r}'::DOUBLE" if math.isnan(value) or math.isinf(value) else repr(value)
    if name == "s":
        return "'" + str(value).replace("'", "''") + "'"
    if name == "d":
        return f"DATE '{value.isoformat()}'"
    if name == "ts":
        return f"TIMESTAMPTZ '{value.isoformat()}'"
    return str(value)


@settings(max_examples=STATS_EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.lists(st.lists(ROW, min_size=1, max_size=6), min_size=1, max_size=4),
       where=FILTER)
def test_a_filtered_read_by_duckdb_returns_exactly_the_full_read_filtered(
        delta_setup: DeltaSetup, files: list[list[dict[str, Any]]],
        where: tuple[str, str, Any]) -> None:
    sink = delta_setup.new_target().build()
    assert isinstance(sink, DeltaSink)
    sink.check_schema(STATS_COLUMNS)
    handles, number = [], 0
    for partition, rows in enumerate(files):
        values = [(number + n, *(row[name] for name in VALUES)) for n, row in enumerate(rows)]
        number += len(rows)
        handles.append(prepare(sink, values, partition=partition, columns=STATS_COLUMNS))
    commit_batch(sink, handles)
    name, operator, value = where
    predicate = f"{name} {operator} {literal(name, value)}"
    with contextlib.closing(reader()) as connection:
        connection.execute(f"CREATE TABLE everything AS SELECT * FROM {delta_scan(sink.table_uri)}")
        filtered = connection.execute(f"SELECT id FROM {delta_scan(sink.table_uri)} "
                                      f"WHERE {predicate} ORDER BY id").fetchall()
        afterwards = connection.execute(
            f"SELECT id FROM everything WHERE {predicate} ORDER BY id").fetchall()
        assert connection.execute("SELECT count(*) FROM everything").fetchone() == (number,)
    assert filtered == afterwards, predicate


def test_in_a_group_the_delta_member_commits_each_batch_once_at_its_place_in_the_order(
        delta_setup: DeltaSetup, sqlite_setup: SQLiteSetup) -> None:
    lake = delta_setup.new_target()
    group = GroupTarget.of({"orders": sqlite_setup.new_target(), "lake": lake},
                           commit_order=["lake", "orders"])
    sink = group.build()
    sink.check_schema(ORDER_COLUMNS)
    handles = [prepare(sink, orders(10 * p, 2), partition=p) for p in range(3)]
    table_uri = lake.options["table_uri"]
    before = int(DeltaTable(table_uri).version())
    with sink.committer() as committer:
        stages = committer.commit_stages(handles)
        assert [stage.label for stage in stages] == ["lake", "orders"]
        lake_stage, orders_stage = stages
        assert lake_stage.committer.commit_handles(
            lake_stage.handles, StageCommits(lake_stage.committer)
        ) == [CommitOutcome.COMMITTED] * 3
        # the member's stage made its whole batch visible in one commit, before the next member
        assert int(DeltaTable(table_uri).version()) == before + 1
        assert lake.visible() == [0, 1, 10, 11, 20, 21]
        assert group.members["orders"].visible() == []
        # committed again (a recovery), the stage is proven, not committed twice
        assert lake_stage.committer.commit_handles(
            lake_stage.handles, StageCommits(lake_stage.committer)
        ) == [CommitOutcome.ALREADY_COMMITTED] * 3
        orders_stage.committer.commit_handles(orders_stage.handles,
                                              StageCommits(orders_stage.committer))
        committer.finish_batch(NAMESPACE, 0, handles)
    assert int(DeltaTable(table_uri).version()) == before + 1
    assert group.visible() == [0, 1, 10, 11, 20, 21]


def test_statistics_widen_timestamps_to_the_millisecond_and_drop_bounds_a_nan_breaks() -> None:
    schema = pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("f", pa.float64()),
                        ("b", pa.bool_())])
    first = dt.datetime(2026, 11, 1, 12, 0, 0, 123456, tzinfo=dt.UTC)
    stats = FileStats(schema)
    stats.add(pa.record_batch([pa.array([first, first + dt.timedelta(microseconds=1)],
                                        schema.field("ts").type),
                               pa.array([1.5, None]), pa.array([True, None])], schema=schema))
    stats.add(pa.record_batch([pa.array([None], schema.field("ts").type),
                               pa.array([math.nan]), pa.array([False])], schema=schema))
    assert json.loads(stats.to_json()) == {
        "numRecords": 3,
        "minValues": {"ts": "2026-11-01T12:00:00.123Z"},
        "maxValues": {"ts": "2026-11-01T12:00:00.124Z"},
        "nullCount": {"ts": 1, "f": 1, "b": 1}}


def test_through_the_coordinator_each_batch_is_one_commit_and_orphans_are_swept(
        sink: DeltaSink, target_of: Callable[[DeltaSink], list[int]], tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    run = Coordinator(sink, store, namespace=NAMESPACE,
                      epoch=store.start_run(NAMESPACE, {}).epoch, retry=FAST_RETRY)
    before = table_version(sink)
    for batch in range(3):
        orphan = prepare(sink, orders(1000 + batch, 1), batch=batch, attempt=9)  # failed try
        handles = [prepare(sink, orders(100 * batch + 10 * p, 2), batch=batch, partition=p)
                   for p in range(3)]
        run.commit_batch(batch, QUERY_ID, handles)
        assert not any((Path(sink.table_uri) / f["path"]).exists()
                       for f in orphan.data["files"])
    assert table_version(sink) == before + 3
    carried = [commit["twophase.batch"] for commit in DeltaTable(sink.table_uri).history()
               if "twophase.batch" in commit]
    assert sorted(carried) == [0, 1, 2]
    assert target_of(sink) == sorted(100 * b + 10 * p + i for b in range(3) for p in range(3)
                                     for i in range(2))
    state = store.read()
    assert state is not None and [record.already_committed for record in state.history] == [
        0, 0, 0]
    assert list_in_doubt(sink, NAMESPACE) == []


# -- S3 grants -----------------------------------------------------------------------------------

MOTO_DELETE_OBJECTS = "s3:DeleteObject"

def least_privileged_sink(server: MotoServer, *, without: str | None = None
                          ) -> tuple[DeltaSink, str]:
    """A sink on a fresh table of ``server``, as a user holding the README's policy (less the
    action ``without``), and the table's bucket."""
    bucket = server.new_bucket("lake")
    policy = iam_policy(bucket, "orders")
    # moto's names: HeadBucket's action, and DeleteObjects authorised on the bucket (AWS
    # authorises each key's s3:DeleteObject on the object).
    policy["Statement"][0]["Action"] += [MOTO_HEAD_BUCKET, MOTO_DELETE_OBJECTS]
    for statement in policy["Statement"]:
        statement["Action"] = [action for action in statement["Action"] if action != without]
    key_id, secret = server.add_user_with_policy(f"delta-{bucket}", policy)
    options = {**s3_storage_options(server), "AWS_ACCESS_KEY_ID": key_id,
               "AWS_SECRET_ACCESS_KEY": secret}
    return DeltaSink(f"s3://{bucket}/orders", storage_options=options, create=True), bucket


def test_the_readme_policy_is_enough_for_every_call_of_the_sink(
        moto_checking_credentials: MotoServer) -> None:
    page = (REPO / "docs" / "sinks" / "delta.md").read_text()
    section = page.split("\n## Grants (S3)\n", 1)[1].split("\n## ", 1)[0]
    assert json.loads(section.split("```json", 1)[1].split("```", 1)[0]) == iam_policy(
        "my-bucket", "lake/orders")
    sink, _ = least_privileged_sink(moto_checking_credentials)
    sink.check_schema(ORDER_COLUMNS)
    committed = prepare(sink, orders(0, 3), batch=0)
    orphan = prepare(sink, orders(3, 1), batch=0, attempt=1)
    assert commit_batch(sink, [committed]) == [CommitOutcome.COMMITTED]
    with sink.committer() as committer:
        assert [h.txn_id for h in committer.list_in_doubt(NAMESPACE)] == [orphan.txn_id]
        assert committer.abort(orphan) == AbortOutcome.ABORTED
        assert committer.list_in_doubt(NAMESPACE) == []
    table = DeltaTable(sink.table_uri, storage_options=sink.storage_options)
    assert sorted(table.to_pyarrow_table().column("event_id").to_pylist()) == [0, 1, 2]


def test_a_policy_without_delete_fails_the_abort_naming_the_permission(
        moto_checking_credentials: MotoServer) -> None:
    sink, _ = least_privileged_sink(moto_checking_credentials, without="s3:DeleteObject")
    sink.check_schema(ORDER_COLUMNS)
    orphan = prepare(sink, orders(0, 1))
    with sink.committer() as committer, pytest.raises(
            ConfigurationError,
            match=r"DeleteObjects of s3://.*AccessDenied.*Fix: DeleteObjects needs "
                  r"s3:DeleteObject"):
        committer.abort(orphan)
