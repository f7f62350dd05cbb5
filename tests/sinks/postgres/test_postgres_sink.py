"""PostgresSink against a real, private PostgreSQL: the contract, then what only it needs.

Every assertion about data is made on PostgreSQL's own view (SELECT, pg_prepared_xacts), and
every test ends with no prepared transaction left (checked by the ``pg`` fixture).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from setups import PostgresSetup, Target
from setups.servers.postgres import PgView, PostgresServer
from sinks.postgres import PostgresSink
from sinks.postgres.errors import ERRORS
from tests.sinks import as_connection_url, committed_through_its_pickled_copy
from twophase import (
    Column,
    CommitOutcome,
    ConfigurationError,
    FatalError,
    RetryableError,
    SchemaMismatchError,
    Secret,
)
from twophase.testing.contract import (
    NAMESPACE,
    ORDER_COLUMNS,
    QUERY_ID,
    SinkContract,
    commit,
    list_in_doubt,
    orders,
    prepare,
    purge_commit_records,
    use_query_id,
)


class TestPostgresContract(SinkContract):
    """The shared contract over a fresh table of the private server."""

    setup_fixture = "postgres_setup"


@pytest.fixture
def target(postgres_setup: PostgresSetup) -> Iterator[Target]:
    """A fresh table, under a query id of the test's own (gids are unique per cluster)."""
    use_query_id(str(uuid.uuid4()))
    yield postgres_setup.new_target()
    use_query_id(QUERY_ID)


def table_of(target: Target) -> str:
    return str(target.options["table"])


def sink_of(target: Target, **options: Any) -> PostgresSink:
    sink = PostgresSink(**{**target.options, **options})
    sink.check_schema(ORDER_COLUMNS)
    return sink


def test_instants_are_stored_as_instants_and_arrow_values_as_rows_values(
        target: Target, pg: PgView) -> None:
    """The same rows through write and write_arrow (COPY as CSV) read back the same."""
    sink = sink_of(target)
    weird = [(1, 1001, "", dt.datetime(2026, 3, 29, 1, 30, tzinfo=dt.UTC)),
             (2, 1002, 'a,"b"\nc\\d', None),
             (3, 1003, "ünï", dt.datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC))]
    by_rows = prepare(sink, weird, partition=0)
    by_arrow = prepare(sink, [(10 + i, *rest) for i, *rest in weird], arrow=True, partition=1)
    assert [commit(sink, h) for h in (by_rows, by_arrow)] == [CommitOutcome.COMMITTED] * 2
    stored = pg.query(f"SELECT event_id, status, ts FROM {table_of(target)} ORDER BY 1")
    assert [row[1:] for row in stored[:3]] == [row[1:] for row in stored[3:]]
    assert [row[1:] for row in stored[:3]] == [(s, t) for _e, _o, s, t in weird]


def test_upsert_updates_rows_by_key_on_both_paths(target: Target, pg: PgView) -> None:
    pg.query(f"INSERT INTO {table_of(target)} VALUES (1, 1, 'old', NULL), (2, 2, 'keep', NULL)")
    sink = sink_of(target, mode="upsert", key=("event_id",))
    first = prepare(sink, [(1, 1, "new", None), (3, 3, "added", None)], partition=0)
    assert pg.query(f"SELECT status FROM {table_of(target)} WHERE event_id = 1") == [("old",)]
    commit(sink, first)  # a prepared transaction holds its rows' locks until then
    commit(sink, prepare(sink, [(1, 1, "newer", None)], arrow=True, batch=1))
    assert pg.query(f"SELECT event_id, status FROM {table_of(target)} ORDER BY 1") == [
        (1, "newer"), (2, "keep"), (3, "added")]


def test_check_schema_refuses_what_cannot_fit(target: Target, pg: PgView) -> None:
    sink = PostgresSink(**target.options)
    with pytest.raises(SchemaMismatchError, match="requires column 'order_id'"):
        sink.check_schema([ORDER_COLUMNS[0], ORDER_COLUMNS[2]])
    with pytest.raises(SchemaMismatchError, match="does not exist"):
        PostgresSink(**{**target.options, "table": "no_such_table"}).check_schema(ORDER_COLUMNS)
    with pytest.raises(SchemaMismatchError, match=r"upsert key \['order_id'\] is not a PRIMARY"):
        sink_of(target, mode="upsert", key=("order_id",))
    naive = pg.new_table("CREATE TABLE {table} (event_id bigint, order_id bigint, "
                         "status text, ts timestamp)")
    with pytest.raises(SchemaMismatchError, match=r"'ts' keeps no time zone.*timestamptz"):
        PostgresSink(**{**target.options, "table": naive}).check_schema(ORDER_COLUMNS)
    wall_clock = [*ORDER_COLUMNS[:3], Column("ts", "timestamp_ntz")]
    PostgresSink(**{**target.options, "table": naive}).check_schema(wall_clock)


def test_a_user_without_rights_is_told_what_to_grant(
        target: Target, postgres: PostgresServer) -> None:
    with postgres.superuser(postgres.params.database) as admin:
        admin.execute("DROP ROLE IF EXISTS reader")
        admin.execute("CREATE ROLE reader LOGIN PASSWORD 'reader'")
        admin.execute(f"GRANT SELECT ON {table_of(target)} TO reader")
    try:
        sink = PostgresSink(**{**target.options, "user": "reader", "password": "reader"})
        with pytest.raises(ConfigurationError, match=r"lacks INSERT ON .*Fix: GRANT INSERT"):
            sink.check_schema(ORDER_COLUMNS)
    finally:
        with postgres.superuser(postgres.params.database) as admin:
            admin.execute("DROP OWNED BY reader")
            admin.execute("DROP ROLE reader")


def test_a_wrong_password_is_a_configuration_error(target: Target) -> None:
    sink = PostgresSink(**{**target.options, "password": "wrong"})
    with pytest.raises(ConfigurationError, match=r"password authentication failed.*Fix: check"):
        sink.check_schema(ORDER_COLUMNS)


def test_a_connection_url_in_a_secret_writes_and_commits(
        target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    """``connection=Secret(env=...)`` holding the whole URL: the executors' copy of the sink
    (pickled, without the password) writes, the driver's commits, the rows are there."""
    url, options = as_connection_url("postgresql", target.options)
    password = target.options["password"]
    monkeypatch.setenv("TWOPHASE_TEST_PG_URL", url)
    sink = PostgresSink(connection=Secret(env="TWOPHASE_TEST_PG_URL"), **options)
    sink.check_schema(ORDER_COLUMNS)
    committed_through_its_pickled_copy(sink, password, orders(0, 5))
    assert target.visible() == [0, 1, 2, 3, 4]


def test_a_duplicate_key_fails_the_partition_and_leaves_nothing(
        target: Target, pg: PgView) -> None:
    sink = sink_of(target)
    with pytest.raises(SchemaMismatchError, match=r"(?s)\[23505\].*Fix: the rows repeat a key"):
        prepare(sink, [*orders(0, 2), *orders(1, 1)])
    assert (pg.event_ids(table_of(target)), pg.prepared()) == ([], [])


def test_a_server_killed_with_transactions_prepared_loses_nothing(
        target: Target, pg: PgView, postgres: PostgresServer) -> None:
    sink = sink_of(target)
    first, second = prepare(sink, orders(0, 3), partition=0), prepare(sink, orders(3, 2),
                                                                        partition=1)
    assert commit(sink, first) is CommitOutcome.COMMITTED
    postgres.kill()
    postgres.start()
    assert sorted(h.txn_id for h in list_in_doubt(sink, NAMESPACE)) == [second.txn_id]
    assert [commit(sink, h) for h in (first, second)] == [CommitOutcome.ALREADY_COMMITTED,
                                                           CommitOutcome.COMMITTED]
    assert pg.event_ids(table_of(target)) == [0, 1, 2, 3, 4]


def test_purge_keeps_a_proof_committed_long_after_it_was_prepared(
        target: Target, pg: PgView) -> None:
    """The marker is written at pre-commit; its age for the purge runs from the commit."""
    sink = sink_of(target)
    handle = prepare(sink, orders(0, 1))
    pg.query(f"UPDATE {sink.markers.table} SET prepared_at = now() - interval '2 days'")
    assert commit(sink, handle) is CommitOutcome.COMMITTED
    assert purge_commit_records(sink, NAMESPACE,
                                dt.datetime.now(dt.UTC) - dt.timedelta(days=1)) == 0
    assert commit(sink, handle) is CommitOutcome.ALREADY_COMMITTED


@pytest.mark.parametrize(("code", "message", "kind"), [
    ("55000", "prepared transactions are disabled", ConfigurationError),
    ("55000", 'prepared transaction with identifier "tph.x" is busy', RetryableError),
    ("53200", "maximum number of prepared transactions reached", ConfigurationError),
    ("53200", "out of memory", RetryableError),
    ("23514", "new row violates check constraint", SchemaMismatchError),
    ("08006", "connection failure", RetryableError),
    ("XX000", "internal error", FatalError),
])
def test_errors_are_classified_by_condition_code_and_class(
        code: str, message: str, kind: type[Exception]) -> None:
    verdict, _fix = ERRORS.verdict(code, message)
    assert verdict is kind


@pytest.mark.server  # it starts a server of its own (tests/markers.py cannot see it)
def test_prepared_transactions_disabled_is_named_by_its_setting(tmp_path: Path) -> None:
    """A server with max_prepared_transactions = 0: refused at the start, and a PREPARE that
    reaches it anyway (the check skipped) is a configuration error too, naming the setting."""
    with PostgresSetup.started(tmp_path, settings={"max_prepared_transactions": "0"}) as setup:
        view = setup.view
        sink = setup.new_target().build()
        assert isinstance(sink, PostgresSink)
        with pytest.raises(ConfigurationError, match=r"max_prepared_transactions = 0.*Fix: set"):
            sink.check_schema(ORDER_COLUMNS)
        sink.create_tables()
        with pytest.raises(ConfigurationError, match=r"(?s)55000.*Fix: set max_prepared"):
            prepare(sink, orders(0, 1))
        assert view.prepared() == []
