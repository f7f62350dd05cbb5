"""Sink groups: one decision for several sinks, committed member by member in a declared order.

The group passes the shared suites as a sink of its own (contract; crash with the driver
SIGKILLed at every point, also between two members' commits), and the protocol's group rules
hold: no member commits before the previous one is complete, a crash between members is
finished in order, a member lost after the decision is reported as a split batch, a member
that may expire is not decided, and one member's failure leaves nothing of any member.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from setups.sqlite import SQLiteSetup, orders_database
from sinks.sqlite import SQLiteCommitter, SQLiteSink, SQLiteTransaction
from tests.unit.test_user_sink import JsonLinesTarget
from tests.user_sink import JsonLinesSink
from twophase import (
    CommitOutcome,
    ConfigurationError,
    Handle,
    RetryableError,
    SchemaMismatchError,
    SinkGroup,
    TransactionLostError,
    cleanup,
    status,
)
from twophase._coordinator import Coordinator
from twophase._crash import BETWEEN_MEMBERS, GROUP_CRASH_POINTS
from twophase._handle import NAMESPACE_MAX_LENGTH, fitted_namespace, validate_namespace
from twophase._state import StateStore
from twophase.group import fan_out
from twophase.spark import as_sink, write, write_stream
from twophase.testing import GroupTarget
from twophase.testing.contract import (
    NAMESPACE,
    ORDER_COLUMNS,
    QUERY_ID,
    SinkContract,
    abort,
    list_in_doubt,
    orders,
    prepare,
)
from twophase.testing.crash import CrashSuite
from twophase.testing.driver import FEED_SCHEMA, generate_feed, read_feed

#: The order in which member transactions committed, across the members of a test.
COMMITS: list[str] = []


def table_and_files(tmp_path: Path) -> GroupTarget:
    """An SQLite table committed before a directory of JSON-lines files (the outbox shape)."""
    return GroupTarget.of({"table": SQLiteSetup(tmp_path / "sqlite").new_target(),
                           "files": JsonLinesTarget.in_directory(tmp_path / "events")},
                          columns={"files": ["event_id", "status"]})


class TestGroupContract(SinkContract):
    purges_commit_records = True

    @pytest.fixture
    def target(self, tmp_path: Path) -> GroupTarget:
        return table_and_files(tmp_path)


@pytest.mark.long  # CI time: the group crash points run in CI over MySQL and Kafka
class TestGroupCrashes(CrashSuite):  # (tests/spark/test_group_crash.py)
    crash_points = GROUP_CRASH_POINTS

    @pytest.fixture
    def target(self, tmp_path: Path) -> GroupTarget:
        return table_and_files(tmp_path)


# -- the protocol's group rules, driven without Spark ---------------------------------------

class RecordingCommitter(SQLiteCommitter):
    def commit(self, handle: Handle) -> CommitOutcome:
        outcome = super().commit(handle)
        if outcome is CommitOutcome.COMMITTED:
            COMMITS.append(f"{self.sink.table}:{handle.txn_id.partition}")
        return outcome


class RecordingSink(SQLiteSink):
    def committer(self) -> SQLiteCommitter:
        return RecordingCommitter(self)


class FencingCommitter(SQLiteCommitter):
    """Commits only what it claimed an epoch for, as MySQL's committer with fencing=True."""

    def __init__(self, sink: SQLiteSink) -> None:
        super().__init__(sink)
        self.claimed: set[str] = set()

    def fence(self, namespace: str, query_id: str, epoch: int) -> None:
        self.claimed.add(namespace)

    def commit(self, handle: Handle) -> CommitOutcome:
        if handle.txn_id.namespace not in self.claimed:
            raise ConfigurationError(f"{handle.txn_id}: this committer never claimed an epoch",
                                     fix="fence first")
        return super().commit(handle)


class FencingSink(SQLiteSink):
    def committer(self) -> SQLiteCommitter:
        return FencingCommitter(self)


class ExpiringSink(SQLiteSink):
    """Its transactions may expire ``lifetime_s`` after they were opened."""

    lifetime_s: ClassVar[float] = 3600.0

    def commit_deadline(self, handle: Handle) -> float | None:
        return handle.txn_id.created + self.lifetime_s


class FailingPreCommit(SQLiteSink):
    def pre_commit(self, txn: SQLiteTransaction) -> Handle:
        raise RetryableError("the server went away (on purpose).", fix="none: a test")


class FailingWrite(SQLiteSink):
    def write_arrow(self, txn: SQLiteTransaction, batches: Iterable[pa.RecordBatch]) -> None:
        for number, _batch in enumerate(batches):
            if number == 1:
                raise SchemaMismatchError("a row is refused (on purpose).", fix="none: a test")


@pytest.fixture(autouse=True)
def _fresh_commits() -> None:
    COMMITS.clear()


def two_tables(tmp_path: Path, first: type[SQLiteSink] = RecordingSink,
               second: type[SQLiteSink] = RecordingSink) -> SinkGroup:
    database = orders_database(tmp_path / "orders.db")
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE changes (event_id INTEGER NOT NULL, status TEXT)")
    return SinkGroup({"orders": first(database, "orders"), "changes": second(database, "changes")},
                     columns={"changes": ["event_id", "status"]})


def rows_in(group: SinkGroup, member: str) -> list[int]:
    sink = group.members[member]
    assert isinstance(sink, SQLiteSink)
    with sqlite3.connect(sink.path) as connection:
        return sorted(row[0] for row in connection.execute(
            f"SELECT event_id FROM {sink.table}"))


def run(group: SinkGroup, tmp_path: Path, **options: Any) -> Coordinator:
    store = StateStore(tmp_path / "state")
    epoch = store.start_run(NAMESPACE, {}).epoch
    return Coordinator(group, store, namespace=NAMESPACE, epoch=epoch, **options)


def partitions(group: SinkGroup, count: int, *, batch: int = 0) -> list[Handle]:
    return [prepare(group, orders(10 * p, 3), batch=batch, partition=p, arrow=True)
            for p in range(count)]


def dies_between_members(point: str, batch: int) -> None:
    if point == BETWEEN_MEMBERS:
        raise SystemExit("the driver dies between the members' commits")


def crash_between_members(group: SinkGroup, tmp_path: Path) -> None:
    """Batch 0 of two partitions decided, its first member committed, then the driver dies."""
    with run(group, tmp_path, crash_point=dies_between_members) as coordinator, \
            pytest.raises(SystemExit):
        coordinator.commit_batch(0, QUERY_ID, partitions(group, 2))


def test_every_transaction_of_a_member_commits_before_any_of_the_next(tmp_path: Path) -> None:
    group = two_tables(tmp_path)
    with run(group, tmp_path) as coordinator:
        coordinator.commit_batch(0, QUERY_ID, partitions(group, 3))
    assert COMMITS[:3] == [f"orders:{p}" for p in range(3)] or sorted(COMMITS[:3]) == [
        "orders:0", "orders:1", "orders:2"]
    assert sorted(COMMITS[3:]) == ["changes:0", "changes:1", "changes:2"]
    assert rows_in(group, "orders") == rows_in(group, "changes") == sorted(
        10 * p + i for p in range(3) for i in range(3))
    assert list_in_doubt(group, NAMESPACE) == []
    record = StateStore(tmp_path / "state").read_existing().history[-1]
    assert (record.rows, record.txns, record.already_committed) == (9, 6, 0)


def test_members_commit_through_the_committers_the_group_fenced(tmp_path: Path) -> None:
    group = two_tables(tmp_path, first=FencingSink, second=FencingSink)
    with run(group, tmp_path) as coordinator:
        coordinator.commit_batch(0, QUERY_ID, partitions(group, 2))
    assert rows_in(group, "orders") == rows_in(group, "changes") == [0, 1, 2, 10, 11, 12]


def test_the_decision_lists_each_member_transaction_and_recovery_finishes_in_order(
        tmp_path: Path) -> None:
    group = two_tables(tmp_path)

    crash_between_members(group, tmp_path)
    pending = StateStore(tmp_path / "state").read_existing().pending
    assert [sorted(h.data["members"]) for h in pending[0].handles] == [
        ["changes", "orders"]] * 2, "the decision lists every member's transaction"
    assert [sorted(group.member_handles(h)[0][0] for h in list_in_doubt(group, NAMESPACE))] == [
        ["changes", "changes"]], "the first member committed, the second not"
    assert rows_in(group, "orders") != [] and rows_in(group, "changes") == []
    COMMITS.clear()
    with run(group, tmp_path) as coordinator:  # the next run's start recovers
        coordinator.start(QUERY_ID)
    assert sorted(COMMITS) == ["changes:0", "changes:1"]  # "orders" proved ALREADY_COMMITTED
    assert rows_in(group, "orders") == rows_in(group, "changes") == [0, 1, 2, 10, 11, 12]


def test_a_member_transaction_lost_after_the_decision_reports_the_split_batch(
        tmp_path: Path) -> None:
    group = two_tables(tmp_path)

    def lose_the_second_member(point: str, batch: int) -> None:
        if point == BETWEEN_MEMBERS:
            for handle in list_in_doubt(group, NAMESPACE):  # what "changes" holds of it
                for name, member in group.member_handles(handle):
                    abort(group.members[name], member)
            raise SystemExit("and the driver dies")

    with run(group, tmp_path, crash_point=lose_the_second_member) as coordinator, \
            pytest.raises(SystemExit):
        coordinator.commit_batch(0, QUERY_ID, partitions(group, 2))
    with run(group, tmp_path) as coordinator, \
            pytest.raises(TransactionLostError) as lost:
        coordinator.start(QUERY_ID)
    message = str(lost.value)
    assert "batch 0 is split" in message and "'orders' committed it" in message
    assert "member 'changes' lost" in message
    metrics = StateStore(tmp_path / "state").read_existing().metrics
    assert metrics.get("members_lost:changes") == metrics.get("transactions_lost") == 1


def test_a_member_that_may_expire_before_its_commit_is_not_decided(tmp_path: Path) -> None:
    group = two_tables(tmp_path, second=ExpiringSink)
    handles = partitions(group, 2)
    ExpiringSink.lifetime_s = 10.0  # opened just now: expires within the gate's margin
    try:
        with run(group, tmp_path) as coordinator, \
                pytest.raises(RetryableError, match="may expire"):
            coordinator.commit_batch(0, QUERY_ID, handles)
    finally:
        ExpiringSink.lifetime_s = 3600.0
    state = StateStore(tmp_path / "state").read_existing()
    assert state.pending == () and state.metrics.get("batches_expiring") == 1
    assert rows_in(group, "orders") == rows_in(group, "changes") == []
    assert list_in_doubt(group, NAMESPACE) == [], "the refused batch's transactions are aborted"


@pytest.mark.parametrize("failing", [FailingPreCommit, FailingWrite])
def test_one_member_failing_leaves_nothing_of_any_member(
        tmp_path: Path, failing: type[SQLiteSink]) -> None:
    group = two_tables(tmp_path, second=failing)
    with pytest.raises((RetryableError, SchemaMismatchError),
                       match=r"^sink group member 'changes': .* \(on purpose\)"):
        prepare(group, orders(0, 6), arrow=True)
    assert list_in_doubt(group, NAMESPACE) == []
    assert rows_in(group, "orders") == rows_in(group, "changes") == []


def test_each_member_takes_its_columns_checked_before_the_start(tmp_path: Path) -> None:
    group = two_tables(tmp_path)
    group.check_schema(ORDER_COLUMNS)
    wrong = SinkGroup(dict(group.members), columns={"changes": ["event_id", "state"]})
    with pytest.raises(SchemaMismatchError, match=r"member 'changes'.*'state'"):
        wrong.check_schema(ORDER_COLUMNS)
    with pytest.raises(SchemaMismatchError, match="no column 'order_id'"):
        SinkGroup(dict(group.members)).check_schema(ORDER_COLUMNS)  # "changes" takes all


@pytest.mark.parametrize(("options", "message"), [
    ({"commit_order": ["orders"]}, "must name every member"),
    ({"commit_order": ["orders", "orders", "changes"]}, "must name every member"),
    ({"columns": {"other": ["event_id"]}}, "names no member"),
    ({"columns": {"orders": []}}, "would write no column"),
    ({"namespaces": {"changes": "same", "orders": "same"}}, "would both name their"),
    ({"namespaces": {"changes": "not valid!"}}, "not usable in transaction ids"),
])
def test_a_wrong_group_option_is_refused_with_its_fix(
        tmp_path: Path, options: dict[str, Any], message: str) -> None:
    database = orders_database(tmp_path / "orders.db")
    members = {"orders": SQLiteSink(database, "orders"), "changes": SQLiteSink(database, "changes")}
    with pytest.raises(ConfigurationError, match=message):
        SinkGroup(members, **options)


def test_members_built_from_a_config_and_their_namespaces(tmp_path: Path) -> None:
    database = str(orders_database(tmp_path / "orders.db"))
    group = SinkGroup({"orders": {"sink": "sinks.sqlite:SQLiteSink",
                                  "options": {"path": database, "table": "orders"}},
                       "files": JsonLinesSink(tmp_path / "events")},
                      commit_order=["files", "orders"])
    assert group.commit_order == ["files", "orders"]
    assert group.default_namespace() == "events"  # the first member's, as if alone
    assert group.member_namespaces("shop") == {"files": "shop-files", "orders": "shop-orders"}
    long = group.member_namespaces("a_namespace_of_20_ch")  # 26 characters: shortened
    assert long == {"files": fitted_namespace("a_namespace_of_20_ch-files"),
                    "orders": fitted_namespace("a_namespace_of_20_ch-orders")}
    assert all(validate_namespace(name) for name in long.values())
    assert len(set(long.values())) == 2 and long == group.member_namespaces("a_namespace_of_20_ch")
    renamed = SinkGroup(dict(group.members), namespaces={"orders": "orders_v2"})
    assert renamed.member_namespaces("shop") == {"files": "shop-files", "orders": "orders_v2"}
    with pytest.raises(ConfigurationError, match="not a sink"):
        SinkGroup({"orders": {"table": "orders"}})
    with pytest.raises(ConfigurationError, match="not usable in transaction ids"):
        SinkGroup(dict(group.members), namespaces={"orders": "a_namespace_the_user_gave"})


def test_a_derived_namespace_always_fits_and_a_usable_one_never_changes() -> None:
    """A default is never refused: only the names refused before are shortened, each by a
    stable hash (the same name every run, distinct names apart)."""
    assert fitted_namespace("shop-orders") == "shop-orders"
    assert fitted_namespace("x" * 24) == "x" * 24
    table = "customer_orders_by_region_2026"  # a 30-character table name, 40 with "-changes"
    fitted = {name: fitted_namespace(f"{table}-{name}") for name in ("orders", "changes")}
    for derived in fitted.values():
        assert validate_namespace(derived) and len(derived) == NAMESPACE_MAX_LENGTH
    assert fitted["orders"] != fitted["changes"]
    assert fitted_namespace("my.lake-events") == fitted_namespace("my.lake-events")
    assert validate_namespace(fitted_namespace("my.lake-events"))


def test_fan_out_feeds_every_writer_and_stops_all_at_the_first_failure() -> None:
    received: dict[str, list[int]] = {"a": [], "b": []}

    def collect(name: str) -> Any:
        return received[name].extend

    fan_out(range(100), {"a": collect("a"), "b": collect("b")})
    assert received == {"a": list(range(100)), "b": list(range(100))}

    stopped = threading.Event()

    def failing(items: Iterator[int]) -> None:
        for item in items:
            if item == 3:
                raise ValueError("refused")

    def patient(items: Iterator[int]) -> None:
        try:
            for _item in items:
                time.sleep(0.001)
        finally:
            stopped.set()

    with pytest.raises(ValueError, match="refused"):
        fan_out(range(10_000), {"failing": failing, "patient": patient})
    assert stopped.is_set()

    def source() -> Iterator[int]:
        yield 1
        raise OSError("the source broke")

    with pytest.raises(OSError, match="source broke"):
        fan_out(source(), {"a": collect("a")})


def test_a_group_of_columns_given_as_arrow_writes_only_each_members_columns(
        tmp_path: Path) -> None:
    group = two_tables(tmp_path)
    with run(group, tmp_path) as coordinator:
        coordinator.commit_batch(0, QUERY_ID, partitions(group, 1))
    sink = group.members["changes"]
    assert isinstance(sink, SQLiteSink)
    with sqlite3.connect(sink.path) as connection:
        assert list(connection.execute("SELECT * FROM changes ORDER BY event_id")) == [
            (0, "paid"), (1, "paid"), (2, "paid")]


def test_status_shows_and_cleanup_finishes_a_group_from_its_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    database = orders_database(tmp_path / "orders.db")
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE changes (event_id INTEGER NOT NULL, status TEXT)")
    monkeypatch.setenv("ORDERS_DB", str(database))
    entry = {"sink": "twophase:SinkGroup", "states": [str(tmp_path / "state")], "options": {
        "members": {"orders": {"sink": "sinks.sqlite:SQLiteSink",
                               "options": {"path": {"env": "ORDERS_DB"}, "table": "orders"}},
                    "changes": {"sink": "sinks.sqlite:SQLiteSink",
                                "options": {"path": str(database), "table": "changes"}}},
        "commit_order": ["orders", "changes"], "columns": {"changes": ["event_id", "status"]}}}
    target = cleanup.target_from(entry)
    group = target.sink
    assert isinstance(group, SinkGroup)

    crash_between_members(group, tmp_path)
    store = StateStore(tmp_path / "state")
    shown = status.describe(store, store.read_existing(), time.time())
    assert shown.count("member orders: orders-orders.") == 2
    assert shown.count("member changes: orders-changes.") == 2
    report = cleanup.Report()
    cleanup.clean(target, report, dry_run=False)
    assert report.exit_code == cleanup.EXIT_OK, report.actions
    assert rows_in(group, "orders") == rows_in(group, "changes") == [0, 1, 2, 10, 11, 12]
    assert store.read_existing().pending == () and list_in_doubt(group, NAMESPACE) == []


# -- through Spark: the job names its sinks, the adapters make the group ----------------------

@pytest.mark.spark
@pytest.mark.parametrize("foreach_batch", [False, True], ids=["data-source", "foreach-batch"])
def test_a_stream_into_named_sinks_delivers_every_row_once_to_each(
        spark: SparkSession, tmp_path: Path, foreach_batch: bool) -> None:
    files, rows_per_file = 3, 40
    generate_feed(tmp_path / "feed", files=files, rows_per_file=rows_per_file)
    table = SQLiteSink(orders_database(tmp_path / "orders.db"), "orders")
    events = JsonLinesSink(tmp_path / "events")
    group = SinkGroup({"table": table, "events": events}, commit_order=["table", "events"],
                      columns={"events": ["event_id", "order_id", "status"]})
    query = write_stream(read_feed(spark, tmp_path / "feed"), group,
                         checkpoint_location=str(tmp_path / "ckpt"),
                         trigger={"availableNow": True}, foreach_batch=foreach_batch)
    query.awaitTermination()
    expected = list(range(files * rows_per_file))
    with sqlite3.connect(table.path) as connection:
        assert sorted(r[0] for r in connection.execute("SELECT event_id FROM orders")) == expected
    rows = events.rows()
    assert sorted(row["event_id"] for row in rows) == expected
    assert set(rows[0]) == {"event_id", "order_id", "status"}
    state = StateStore(tmp_path / "ckpt" / "twophase").read_existing()
    assert (state.last_done_batch, state.pending) == (files - 1, ())
    assert [record.rows for record in state.history] == [rows_per_file] * files


@pytest.mark.spark
def test_the_deprecated_group_options_of_write_still_make_the_group_with_a_warning(
        spark: SparkSession, tmp_path: Path) -> None:
    """``write(df, {...}, commit_order=..., columns=...)`` (deprecated in 0.5.0): the group is
    made as before, each option warned about with ``SinkGroup`` as the replacement."""
    table = SQLiteSink(orders_database(tmp_path / "orders.db"), "orders")
    events = JsonLinesSink(tmp_path / "events")
    generate_feed(tmp_path / "feed", files=1, rows_per_file=5)
    with pytest.warns(DeprecationWarning, match=r"write\(\.\.\., (commit_order|columns)=\) "
                      r"is deprecated .*pass SinkGroup\(") as warned:
        write(
            spark.read.schema(FEED_SCHEMA).json(str(tmp_path / "feed")),
            {"table": table, "events": events}, state_location=str(tmp_path / "state"),
            commit_order=["events", "table"], columns={"events": ["event_id", "status"]})
    assert sorted(str(w.message).split("=")[0] for w in warned
                  if w.category is DeprecationWarning) == ["write(..., columns",
                                                           "write(..., commit_order"]
    assert sorted(row["event_id"] for row in events.rows()) == list(range(5))
    assert set(events.rows()[0]) == {"event_id", "status"}
    with pytest.raises(TypeError, match="unexpected keyword argument 'comit_order'"):
        write(spark.range(1), table, state_location=str(tmp_path / "state"),
              comit_order=["a"])


def test_the_adapters_make_a_group_of_named_sinks_and_refuse_group_options_for_one(
        tmp_path: Path) -> None:
    database = orders_database(tmp_path / "orders.db")
    group = as_sink({"a": SQLiteSink(database, "orders"), "b": JsonLinesSink(tmp_path / "b")},
                    commit_order=["b", "a"])
    assert isinstance(group, SinkGroup) and group.commit_order == ["b", "a"]
    with pytest.raises(ConfigurationError, match="commit_order and columns are for several"):
        as_sink(SQLiteSink(database, "orders"), commit_order=["a"])
    with pytest.raises(ConfigurationError, match="is not a TwoPhaseCommitSink"):
        as_sink("sinks.sqlite:SQLiteSink")


def test_a_group_over_a_40_character_table_starts_with_its_default_namespace(
        tmp_path: Path) -> None:
    """The group's namespace is the first member's default (the table's name, shortened, and
    a digest of where it is); its members' ``<namespace>-<member>`` are longer and are
    shortened, not refused."""
    table = "customer_orders_by_region_and_day_2026"
    database = orders_database(tmp_path / "orders.db")
    with sqlite3.connect(database) as connection:
        connection.execute(f'ALTER TABLE orders RENAME TO "{table}"')
        connection.execute("CREATE TABLE changes (event_id INTEGER NOT NULL, status TEXT)")
    group = SinkGroup({"orders": SQLiteSink(database, table),
                       "changes": SQLiteSink(database, "changes")},
                      columns={"changes": ["event_id", "status"]})
    namespace = fitted_namespace(group.default_namespace())
    assert namespace == group.default_namespace()  # a usable default stays as it was
    assert namespace.startswith(table[:15]) and len(namespace) == NAMESPACE_MAX_LENGTH
    store = StateStore(tmp_path / "state")
    epoch = store.start_run(namespace, {}).epoch
    handles = [prepare(group, orders(10 * p, 3), partition=p, epoch=epoch, namespace=namespace)
               for p in range(2)]
    with Coordinator(group, store, namespace=namespace, epoch=epoch) as coordinator:
        coordinator.commit_batch(0, QUERY_ID, handles)
    assert store.read_existing().last_done_batch == 0
    assert rows_in(group, "orders") == rows_in(group, "changes") == [0, 1, 2, 10, 11, 12]
    assert all(len(member) <= NAMESPACE_MAX_LENGTH
               for member in group.member_namespaces(namespace).values())
