"""IcebergSink: the contract suite on the embedded SQL catalog (SQLite) and on PostgreSQL's,
and what is Iceberg's own: one snapshot per batch, the proof, racing committers, rewrites,
lost files, refusals. Every table is read back by DuckDB's Iceberg reader."""

from __future__ import annotations

import secrets
import threading
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import NestedField, StringType

from setups import IcebergSetup, Target
from setups.iceberg import CATALOG_NAME, iceberg_scan
from setups.lake import commit_batch
from setups.servers.local import free_port
from setups.servers.postgres import PostgresServer
from sinks.iceberg import IcebergSink
from sinks.iceberg.schema import SPARK_TO_ICEBERG
from sinks.iceberg.snapshots import SUMMARY_BATCH, app_id_of, batch_property
from twophase import (
    Column,
    CommitOutcome,
    ConfigurationError,
    FatalError,
    Handle,
    RetryableError,
    SchemaMismatchError,
    TransactionLostError,
)
from twophase.testing.contract import (
    NAMESPACE,
    ORDER_COLUMNS,
    SinkContract,
    list_in_doubt,
    orders,
    prepare,
)

#: Racing committers: trials in CI and under -m long.
RACE_TRIALS, RACE_TRIALS_LONG = 20, 100


class TestIcebergContract(SinkContract):
    setup_fixture = "iceberg_setup"
    purges_commit_records = False  # the proof is the table's own metadata


class TestIcebergOnPostgresCatalogContract(TestIcebergContract):
    """The SQL catalog in a PostgreSQL database (the catalog a team runs)."""

    setup_fixture = "iceberg_pg_setup"


@pytest.mark.long
class TestIcebergOnS3Contract(TestIcebergContract):
    """The table's files (data, intents, metadata) on the S3 lab's bucket: the data files by
    conditional put through twophase's S3 client, the metadata through pyiceberg's FileIO."""

    setup_fixture = "iceberg_s3_setup"


@pytest.mark.long
class TestIcebergOnRestCatalogContract(TestIcebergContract):
    """Iceberg's own REST catalog server (its JDBC catalog behind HTTP, compare-and-swap)."""

    setup_fixture = "iceberg_rest_setup"


# -- helpers -------------------------------------------------------------------------------------

def built(target: Target) -> IcebergSink:
    sink = target.build()
    assert isinstance(sink, IcebergSink)
    sink.check_schema(ORDER_COLUMNS)
    return sink


def batches_of(setup: IcebergSetup, target: Target) -> list[str | None]:
    table = setup.table(target)
    assert table is not None
    return [snapshot.summary[SUMMARY_BATCH] if snapshot.summary else None
            for snapshot in table.metadata.snapshots]


@pytest.fixture
def target(iceberg_setup: IcebergSetup) -> Target:
    return iceberg_setup.new_target()


@pytest.fixture
def sink(target: Target) -> IcebergSink:
    return built(target)


# -- one snapshot per batch, the proof ------------------------------------------------------------

def test_a_batch_of_many_partitions_is_one_snapshot_and_its_recommit_is_proven(
        iceberg_setup: IcebergSetup, target: Target, sink: IcebergSink) -> None:
    handles = [prepare(sink, orders(10 * p, 3), batch=0, partition=p) for p in range(4)]
    assert commit_batch(sink, handles) == [CommitOutcome.COMMITTED] * 4
    assert commit_batch(sink, handles) == [CommitOutcome.ALREADY_COMMITTED] * 4
    assert batches_of(iceberg_setup, target) == ["0"]
    assert sorted(iceberg_setup.visible(target)) == sorted(
        10 * p + i for p in range(4) for i in range(3))
    assert iceberg_setup.in_doubt(target) == []
    table = iceberg_setup.table(target)
    assert table is not None
    assert table.properties[batch_property(app_id_of(handles[0].txn_id))] == "0"


@pytest.mark.parametrize(("where", "trials"), [
    ("iceberg_setup", RACE_TRIALS), ("iceberg_pg_setup", RACE_TRIALS),
    ("iceberg_rest_setup", RACE_TRIALS),
    pytest.param("iceberg_setup", RACE_TRIALS_LONG, marks=pytest.mark.long),
    pytest.param("iceberg_pg_setup", RACE_TRIALS_LONG, marks=pytest.mark.long),
    pytest.param("iceberg_rest_setup", RACE_TRIALS_LONG, marks=pytest.mark.long)])
def test_two_committers_racing_on_one_decided_batch_land_one_snapshot(
        where: str, trials: int, request: pytest.FixtureRequest) -> None:
    """Two drivers (a zombie and its successor) commit the same decided batch at once: with
    pyiceberg's own retry both would land (measured); here exactly one snapshot does."""
    setup: IcebergSetup = request.getfixturevalue(where)
    target = setup.new_target()
    sink = built(target)
    expected: list[int] = []
    lost_races: list[RetryableError] = []
    for batch in range(trials):
        handles = [prepare(sink, orders(100 * batch + 10 * p, 2), batch=batch, partition=p)
                   for p in range(2)]
        start = threading.Barrier(2)

        def drive(handles: Sequence[Handle] = handles,
                  start: threading.Barrier = start) -> list[CommitOutcome]:
            with sink.committer() as committer:
                start.wait()
                return commit_batch(sink, handles, committer=committer, retried=lost_races)

        with ThreadPoolExecutor(max_workers=2) as pool:
            outcomes = [future.result() for future in [pool.submit(drive) for _ in range(2)]]
        assert sorted(o.value for outcome in outcomes for o in outcome).count("committed") == 2
        expected += [100 * batch + 10 * p + i for p in range(2) for i in range(2)]
    assert batches_of(setup, target) == [str(batch) for batch in range(trials)]
    assert sorted(setup.visible(target)) == sorted(expected)
    assert setup.in_doubt(target) == []
    assert lost_races, "the committers never raced"


def test_a_committed_batch_survives_a_rewrite_and_the_sweeps_of_later_batches(
        iceberg_setup: IcebergSetup, target: Target, sink: IcebergSink) -> None:
    """After a rewrite (overwrite of the table's rows by new files) a committed file leaves
    the current snapshot: the sweep and cleanup must not take it for an orphan."""
    first = [prepare(sink, orders(0, 3), batch=0, partition=p) for p in range(1)]
    commit_batch(sink, first)
    table = iceberg_setup.table(target)
    assert table is not None
    rows = table.scan().to_arrow()
    table.overwrite(rows)  # the rewrite: same rows, new files, the old ones deleted
    for batch in (1, 2):
        commit_batch(sink, [prepare(sink, orders(10 * batch, 2), batch=batch)])
        assert list_in_doubt(sink, NAMESPACE) == []
    assert sorted(iceberg_setup.visible(target)) == [0, 1, 2, 10, 11, 20, 21]
    # The first batch's files are referenced by history, so none is in doubt.
    assert iceberg_setup.in_doubt(target) == []
    assert commit_batch(sink, first) == [CommitOutcome.ALREADY_COMMITTED]


def test_a_decided_file_gone_is_a_lost_transaction_and_nothing_is_added(
        iceberg_setup: IcebergSetup, target: Target, sink: IcebergSink) -> None:
    handles = [prepare(sink, orders(10 * p, 2), partition=p) for p in range(2)]
    sink.storage.delete([handles[1].data["files"][0]["path"]])
    with pytest.raises(TransactionLostError, match="is gone"):
        commit_batch(sink, handles)
    assert iceberg_setup.visible(target) == []


def test_a_file_older_than_the_orphan_age_is_never_committed(
        iceberg_setup: IcebergSetup) -> None:
    target = iceberg_setup.new_target(orphan_age_s=1)
    sink = built(target)
    handle = prepare(sink, orders(0, 2))
    handle.data["files"][0]["created"] -= 5_000
    with pytest.raises(TransactionLostError, match="orphan_age"):
        commit_batch(sink, [handle])
    with sink.committer() as committer:
        deadline = committer.commit_deadline(handle)
    assert deadline is not None and deadline == handle.data["files"][0]["created"] / 1000 + 1
    assert iceberg_setup.visible(target) == []


def test_a_checkpoint_reset_gets_a_new_app_id_and_its_batch_0_lands(
        iceberg_setup: IcebergSetup, target: Target, sink: IcebergSink) -> None:
    old = prepare(sink, orders(0, 2), batch=5)
    commit_batch(sink, [old])
    reset = prepare(sink, orders(2, 2), batch=0, query_id=str(uuid.uuid4()))
    assert commit_batch(sink, [reset]) == [CommitOutcome.COMMITTED]
    assert sorted(iceberg_setup.visible(target)) == [0, 1, 2, 3]


def test_a_partitioned_table_gets_files_per_partition_read_back_whole(
        iceberg_setup: IcebergSetup) -> None:
    target = iceberg_setup.new_target(partition_by=("status",), max_file_bytes=1)
    sink = built(target)
    rows = orders(0, 4, "paid") + orders(4, 2, "sent out") + orders(6, 3, "paid")
    handle = prepare(sink, rows, arrow=True)
    assert {f["path"].rsplit("/", 1)[0] for f in handle.data["files"]} == {
        "data/status=paid", "data/status=sent+out"}
    assert len(handle.data["files"]) > 2  # max_file_bytes=1: a new file every row group
    commit_batch(sink, [handle])
    assert sorted(iceberg_setup.visible(target)) == list(range(9))
    assert sorted(iceberg_setup.query(
        "SELECT status, count(*) FROM " + iceberg_scan(iceberg_setup.table(target))
        + " GROUP BY status")) == [("paid", 7), ("sent out", 2)]


# -- refusals ------------------------------------------------------------------------------------

def test_a_missing_table_without_create_names_the_fix(iceberg_setup: IcebergSetup) -> None:
    sink = iceberg_setup.new_target(create=False).build()
    with pytest.raises(ConfigurationError, match=r"Fix: .*create=True.*catalog_name="):
        sink.check_schema(ORDER_COLUMNS)


@pytest.mark.parametrize("setup", ["iceberg_setup", "iceberg_pg_setup"],
                         ids=["sqlite-catalog", "postgres-catalog"])
def test_create_without_a_warehouse_names_warehouse_and_the_fix(
        request: pytest.FixtureRequest, setup: str) -> None:
    """pyiceberg's bare ``ValueError: No default path is set`` becomes a ConfigurationError."""
    iceberg: IcebergSetup = request.getfixturevalue(setup)
    properties = iceberg.catalog_properties()
    del properties["warehouse"]
    sink = IcebergSink(str(iceberg.new_target().options["table"]), catalog=properties,
                       catalog_name=CATALOG_NAME, create=True)
    with pytest.raises(ConfigurationError,
                       match=r'catalog= has no "warehouse".*Fix: add "warehouse" to catalog='):
        sink.check_schema(ORDER_COLUMNS)


@pytest.mark.parametrize("setup", ["iceberg_setup", "iceberg_pg_setup"],
                         ids=["sqlite-catalog", "postgres-catalog"])
@pytest.mark.parametrize("create", [False, True])
def test_a_table_of_another_catalog_name_is_refused_naming_catalog_name(
        request: pytest.FixtureRequest, setup: str, *, create: bool) -> None:
    """The readers' catalog ("lake", as ``load_catalog("lake", ...)`` names it) holds the
    table; a sink left at the default catalog_name cannot see it: refused naming
    ``catalog_name='lake'``, and never a second, invisible table of the same name."""
    iceberg: IcebergSetup = request.getfixturevalue(setup)
    target = iceberg.new_target()
    built(target)  # created by the readers' catalog, "lake"
    table = str(target.options["table"])
    default = IcebergSink(table, catalog=iceberg.catalog_properties(), create=create)
    with pytest.raises(ConfigurationError, match=(
            rf"{table} under the catalog name '{CATALOG_NAME}'.*Fix: pass "
            rf"catalog_name='{CATALOG_NAME}'")):
        default.check_schema(ORDER_COLUMNS)
    assert not default.catalog().table_exists(table)  # nothing made under "default"


def test_the_deprecated_orphan_age_still_works_with_a_warning(
        iceberg_setup: IcebergSetup) -> None:
    with pytest.warns(DeprecationWarning, match=r"orphan_age=\) is deprecated.*orphan_age_s="):
        sink = iceberg_setup.new_target(orphan_age=60).build()
    assert isinstance(sink, IcebergSink) and sink.orphan_age_s == 60


def test_refused_table_settings_are_named(iceberg_setup: IcebergSetup) -> None:
    for properties, named in (({"write.format.default": "orc"}, "write.format.default=orc"),
                              ({"write.object-storage.enabled": "true"},
                               "write.object-storage.enabled")):
        sink = iceberg_setup.new_target(properties=properties).build()
        with pytest.raises(ConfigurationError, match=named):
            sink.check_schema(ORDER_COLUMNS)


def test_a_column_of_another_type_is_refused_before_anything_is_written(
        iceberg_setup: IcebergSetup, target: Target, sink: IcebergSink) -> None:
    other = iceberg_setup.new_target(table=target.options["table"], create=False).build()
    wrong = [Column(c.name, "string" if c.name == "event_id" else c.type, c.nullable)
             for c in ORDER_COLUMNS]
    with pytest.raises(SchemaMismatchError, match="event_id"):
        other.check_schema(wrong)


def test_a_bad_option_is_refused_naming_it(iceberg_setup: IcebergSetup) -> None:
    with pytest.raises(ConfigurationError, match="orphan_age_s"):
        iceberg_setup.new_target(orphan_age_s=0).build()
    with pytest.raises(ConfigurationError, match="namespace"):
        IcebergSink("orders", catalog=iceberg_setup.catalog_properties())


def test_a_transaction_id_used_twice_never_overwrites_the_committed_file(
        iceberg_setup: IcebergSetup, target: Target, sink: IcebergSink) -> None:
    commit_batch(sink, [prepare(sink, orders(0, 2))])
    with pytest.raises(FatalError, match=r"already committed once.*Fix: "):
        prepare(sink, orders(10, 2))
    assert sorted(iceberg_setup.visible(target)) == [0, 1]


def test_after_snapshot_expiry_the_table_property_proves_a_committed_batch(
        iceberg_setup: IcebergSetup, target: Target, sink: IcebergSink,
        caplog: pytest.LogCaptureFixture) -> None:
    """Expiry removed the snapshots the walk goes through: the property (kept by expiry)
    decides, with a warning; a batch never committed is still not proven."""
    committed = []
    for batch in range(4):
        committed.append([prepare(sink, orders(10 * batch, 2), batch=batch)])
        commit_batch(sink, committed[-1])
    table = iceberg_setup.table(target)
    assert table is not None
    current = table.current_snapshot()
    assert current is not None
    table.maintenance.expire_snapshots().by_ids(
        [snapshot.snapshot_id for snapshot in table.metadata.snapshots
         if snapshot.snapshot_id != current.snapshot_id]).commit()
    with caplog.at_level("WARNING", logger="sinks.iceberg.snapshots"):
        assert commit_batch(sink, committed[1]) == [CommitOutcome.ALREADY_COMMITTED]
    assert "expired snapshot" in caplog.text
    assert commit_batch(sink, committed[3]) == [CommitOutcome.ALREADY_COMMITTED]
    assert sorted(iceberg_setup.visible(target)) == [0, 1, 10, 11, 20, 21, 30, 31]
    late = prepare(sink, orders(40, 2), batch=4)
    assert commit_batch(sink, [late]) == [CommitOutcome.COMMITTED]


def test_a_required_column_the_rows_lack_is_refused_naming_it(
        iceberg_setup: IcebergSetup) -> None:
    target = iceberg_setup.new_target()
    catalog = iceberg_setup.catalog()
    catalog.create_namespace_if_not_exists("db")
    catalog.create_table(target.options["table"], Schema(
        *(NestedField(i, column.name, SPARK_TO_ICEBERG[column.type], required=False)
          for i, column in enumerate(ORDER_COLUMNS, start=1)),
        NestedField(len(ORDER_COLUMNS) + 1, "region", StringType(), required=True)))
    with pytest.raises(SchemaMismatchError, match="requires column 'region'"):
        target.build().check_schema(ORDER_COLUMNS)


def test_a_wrong_catalog_or_an_unreachable_one_is_named_and_writes_nothing(
        iceberg_setup: IcebergSetup) -> None:
    closed_port = free_port()
    wrong = IcebergSink("db.orders", catalog={"type": "hive-ish", "uri": "thrift://x"})
    with pytest.raises(ConfigurationError, match=r"catalog of type 'hive-ish'.*Fix: "):
        wrong.check_schema(ORDER_COLUMNS)
    secret = "s3cret-pw"
    down = IcebergSink("db.orders", catalog={
        "type": "sql", "uri": f"postgresql+psycopg://etl:{secret}@127.0.0.1:{closed_port}/x",
        "warehouse": "file:///nowhere"})
    with pytest.raises(RetryableError, match=r"Connection refused.*Fix: ") as raised:
        down.check_schema(ORDER_COLUMNS)
    assert secret not in str(raised.value) and secret not in repr(down)


@pytest.mark.parametrize("warehouse", ["lake+house", "lake house", "lake%2Bhouse"])
def test_a_warehouse_path_with_characters_a_uri_escapes_keeps_data_and_metadata_together(
        warehouse: str, tmp_path: Path) -> None:
    """The data files land where the table's metadata says they are, however the location is
    spelled: pyiceberg reads a file URI's path as written (no percent-decoding)."""
    root = tmp_path / warehouse
    setup = IcebergSetup(tmp_path / "setup", catalog={
        "type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{root}"})
    target = setup.new_target()
    sink = built(target)
    commit_batch(sink, [prepare(sink, orders(0, 3), partition=p) for p in range(1)])
    assert sorted(setup.visible(target)) == [0, 1, 2]
    assert setup.in_doubt(target) == []
    assert list(root.rglob("*.parquet")), "the data files are under the warehouse as named"


# -- grants on the catalog's database --------------------------------------------------------------

CATALOG_GRANTS = ["SELECT, INSERT, UPDATE ON iceberg_tables",
                  "SELECT, INSERT ON iceberg_namespace_properties"]


def test_the_readme_grants_on_the_catalog_database_are_enough(
        postgres: PostgresServer, tmp_path: Path) -> None:
    """A role holding exactly the README's grants on the SQL catalog's tables (created once
    by another role) creates a table, commits, lists in doubt and aborts; without UPDATE its
    commit is refused naming the catalog's grants."""
    admin = IcebergSetup.on_postgres(tmp_path / "admin", postgres)
    admin.catalog().create_namespace_if_not_exists("db")  # the catalog's tables, made once
    password = secrets.token_hex(8)
    for name, grants in (("ice_catalog_user", CATALOG_GRANTS),
                         ("ice_no_update", ["SELECT, INSERT ON iceberg_tables",
                                            CATALOG_GRANTS[1]])):
        postgres.create_user(name, password, grants)
        params = postgres.params
        catalog = {**admin.catalog_properties(), "uri": (
            f"postgresql+psycopg://{name}:{password}@{params.host}:{params.port}/"
            f"{params.database}")}
        sink = IcebergSink(f"db.orders_{name}", catalog=catalog, catalog_name=CATALOG_NAME,
                           create=True)
        sink.check_schema(ORDER_COLUMNS)
        handles = [prepare(sink, orders(10 * p, 2), partition=p) for p in range(2)]
        if name == "ice_no_update":
            with pytest.raises(ConfigurationError, match=r"permission denied.*Fix: .*grants"):
                commit_batch(sink, handles[:1])
            continue
        commit_batch(sink, handles[:1])
        assert [h.txn_id for h in list_in_doubt(sink, NAMESPACE)] == [handles[1].txn_id]
        with sink.committer() as committer:
            committer.abort(handles[1])
        target = admin.new_target(table=f"db.orders_{name}")
        assert sorted(admin.visible(target)) == [0, 1]
        assert admin.in_doubt(target) == []
