"""MySQLXASink against a real, private MariaDB: the contract, XA outcomes and recovery, crashes,
connections, fencing, the committer, error classification.

Every assertion about data is made on MariaDB's own view (SELECT, XA RECOVER), and every test
ends with no prepared XA branch left on the server (checked by the ``db`` fixture). What the
rows become in the table (values, encodings, time zones, refused rows and schemas):
tests/sinks/mysql/test_mysql_values.py; the crash tests' child processes:
tests/sinks/mysql/mysql_children.py.
"""

from __future__ import annotations

import datetime as dt
import pickle
import socket
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import pymysql
import pytest

from setups import MySQLSetup
from setups.servers.mariadb import Db, MariaDBServer
from sinks.mysql import MARKER_TABLE_DDL, MySQLXASink, xa
from sinks.mysql.connection import WRITER_IDLE_TIMEOUT_S, Server
from sinks.mysql.errors import classify
from tests.sinks import as_connection_url, committed_through_its_pickled_copy
from tests.sinks.mysql.mysql_children import run_killed
from tests.sinks.mysql.mysql_table import (
    COLUMNS,
    FAST_RETRY,
    checked_sink,  # noqa: F401 - the sink fixture
    fresh_table,  # noqa: F401 - the table fixture
    ids_of,
    make_sink,
    new_query_id,
    prepare,
    prepare_batch,
    rows_for,
    start_run,
)
from twophase import (
    AbortOutcome,
    CommitOutcome,
    ConfigurationError,
    FatalError,
    FencedError,
    Handle,
    RetryableError,
    Secret,
)
from twophase._handle import NAMESPACE_MAX_LENGTH, query_key
from twophase._state import StateStore
from twophase.testing.contract import (
    NAMESPACE,
    ORDER_COLUMNS,
    QUERY_ID,
    SinkContract,
    abort,
    commit,
    context,
    list_in_doubt,
    orders,
    purge_commit_records,
    use_query_id,
)

# -- the shared contract (commit, abort, loss, empty, reuse, namespaces, processes, purge) ----

class TestMySQLContract(SinkContract):
    setup_fixture = "mysql_setup"
    target_options: ClassVar[Mapping[str, Any]] = {"fencing": False}


# -- visibility, listing, purge ----------------------------------------------------------------

def test_prepared_rows_invisible_to_read_committed(sink: MySQLXASink, db: Db, table: str) -> None:
    reader = db.server.connect()
    try:
        with reader.cursor() as cursor:
            cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            handle = prepare(sink, new_query_id(), rows_for(0, 0, 100))
            cursor.execute(f"SELECT COUNT(*) FROM `{table}`")
            assert cursor.fetchone() == (0,)
            commit(sink, handle)
            cursor.execute(f"SELECT COUNT(*) FROM `{table}`")
            assert cursor.fetchone() == (100,)
    finally:
        reader.close()


def test_list_in_doubt_filters_by_namespace(sink: MySQLXASink, db: Db) -> None:
    query = new_query_id()
    mine = {prepare(sink, query, rows_for(0, p, 2), partition=p).txn_id for p in range(2)}
    other = prepare(sink, query, rows_for(1, 0, 2), batch=1, namespace="orders-eu")
    prefix_only = prepare(sink, query, rows_for(2, 0, 2), batch=2, namespace="orders_x")
    foreign = ["'tph.orders.not-a-twophase-id','x'",  # our prefix, not our id format
               "X'00ff7470682e','b',7"]  # another application's binary xid
    for xid in foreign:
        db.prepare_foreign(xid)

    in_doubt = list_in_doubt(sink, NAMESPACE)
    assert {h.txn_id for h in in_doubt} == mine  # round trip of every TxnId field
    assert all(h.sink == "mysql" and h.data["gtrid"].startswith("tph.orders.") for h in in_doubt)
    assert [h.txn_id for h in list_in_doubt(sink, "orders-eu")] == [other.txn_id]
    assert [h.txn_id for h in list_in_doubt(sink, "orders_x")] == [prefix_only.txn_id]

    for handle in [*in_doubt, other, prefix_only]:
        assert abort(sink, handle) is AbortOutcome.ABORTED
    for xid in foreign:
        db.query(f"XA ROLLBACK {xid}")


def test_purge_commit_records(sink: MySQLXASink, db: Db) -> None:
    query, namespace = new_query_id(), "purged"
    old, recent = (prepare(sink, query, rows_for(b, 0, 1), batch=b, namespace=namespace)
                   for b in (0, 1))
    commit(sink, old)
    commit(sink, recent)
    db.query("UPDATE _twophase_xa_markers SET committed_at = UTC_TIMESTAMP(6) - INTERVAL 2 DAY "
             "WHERE txn_id = %s", (str(old.txn_id),))
    pending = prepare(sink, query, rows_for(2, 0, 1), batch=2, namespace=namespace)
    now = dt.datetime.now(dt.UTC)

    assert purge_commit_records(sink, namespace, now - dt.timedelta(days=1)) == 1
    assert db.marker(old) is None and db.marker(recent) is not None
    started = time.monotonic()
    assert purge_commit_records(sink, namespace, now + dt.timedelta(days=1)) == 1
    assert time.monotonic() - started < 2  # never waits for the prepared marker's row lock
    assert purge_commit_records(sink, "other", now + dt.timedelta(days=1)) == 0

    assert commit(sink, pending) is CommitOutcome.COMMITTED
    assert db.marker(pending) is not None


# -- crashes -----------------------------------------------------------------------------------

def test_prepared_branches_survive_writer_and_server_kill(
        mariadb: MariaDBServer, sink: MySQLXASink, db: Db, table: str) -> None:
    query = new_query_id()
    out = run_killed(mariadb.params, table, role="writer", query=query, partitions=3, rows=200)
    handles = [Handle.loads(line) for line in out.splitlines()]
    assert len(handles) == 3 and sorted(db.xa_recover()) == sorted(
        (h.data["gtrid"], h.data["bqual"]) for h in handles)  # not the unfinished 4th

    mariadb.restart_after_kill()
    assert len(db.xa_recover()) == 3 and db.ids(table) == []

    assert [commit(sink, h) for h in handles] == [CommitOutcome.COMMITTED] * 3
    assert [commit(sink, h) for h in handles] == [CommitOutcome.ALREADY_COMMITTED] * 3
    assert db.ids(table) == ids_of(*(rows_for(0, p, 200) for p in range(3)))
    assert db.xa_recover() == []
    assert mariadb.root_sql("SELECT COUNT(*) FROM information_schema.INNODB_TRX").strip() == "0"


@pytest.mark.parametrize("crash_at", ["after_decision", "mid_commit"])
def test_coordinator_recovers_across_driver_and_server_kill(
        mariadb: MariaDBServer, sink: MySQLXASink, db: Db, table: str, tmp_path: Path,
        crash_at: str) -> None:
    """Run 1 commits batch 0, decides batch 1 and dies (driver and server, kill -9).

    Run 2 recovers batch 1, then batch 2 sweeps the orphans of run 1: a failed attempt of
    batch 1 (aborted by run 1 before it died) and a batch-2 branch of run 1.
    """
    query = new_query_id()
    run_killed(mariadb.params, table, crash_at=f"{crash_at}@1", role="driver", query=query,
               state=str(tmp_path))
    store = StateStore(tmp_path)
    crashed = store.read()
    assert crashed is not None and [d.batch for d in crashed.pending] == [1]
    committed_by_run_1 = ids_of(rows_for(0, 0, 30), rows_for(0, 1, 30))
    if crash_at == "mid_commit":
        committed_by_run_1 += ids_of(rows_for(1, 0, 30))
    assert db.ids(table) == sorted(committed_by_run_1)
    assert len(db.xa_recover()) == (3 if crash_at == "after_decision" else 2)

    mariadb.restart_after_kill()
    with start_run(sink, tmp_path) as coordinator:
        coordinator.recover()
        coordinator.commit_batch(2, query, prepare_batch(sink, query, 2, coordinator.epoch))

    assert db.ids(table) == ids_of(*(rows_for(b, p, 30) for b in range(3) for p in range(2)))
    assert db.xa_recover() == []
    final = store.read()
    assert final is not None and final.pending == () and final.last_done_batch == 2
    recovered = next(r for r in final.history if r.batch == 1)
    assert recovered.already_committed == (1 if crash_at == "mid_commit" else 0)


def test_a_writer_session_ends_on_the_server_after_its_idle_timeout(
        sink: MySQLXASink, db: Db) -> None:
    """A writer whose host vanished leaves a half-open connection the server never hears
    closed: the session's own wait_timeout ends it (and rolls its branch back)."""
    txn = sink.begin_transaction(context(query_id=new_query_id(), columns=COLUMNS))
    try:
        assert txn.conn is not None
        with txn.conn.cursor() as cursor:
            cursor.execute("SELECT @@SESSION.wait_timeout")
            assert cursor.fetchone() == (WRITER_IDLE_TIMEOUT_S,)
    finally:
        sink.discard(txn)
    assert db.xa_recover() == []


def test_lost_connection_before_prepare_is_retryable_and_leaves_nothing(
        mariadb: MariaDBServer, sink: MySQLXASink, db: Db, table: str) -> None:
    txn = sink.begin_transaction(context(query_id=new_query_id(), columns=COLUMNS))
    sink.write(txn, rows_for(0, 0, 20))
    mariadb.restart_after_kill()

    with pytest.raises(RetryableError) as lost:
        sink.write(txn, rows_for(0, 1, 20))
    assert mariadb.params.host in str(lost.value) and str(mariadb.port) in str(lost.value)
    assert "never committed" in str(lost.value)
    with pytest.raises(FatalError, match="already prepared or discarded"):
        sink.pre_commit(txn)
    assert db.ids(table) == [] and db.xa_recover() == []


def test_wrong_password_is_a_clear_configuration_error(mariadb: MariaDBServer, db: Db,
                                                       table: str) -> None:
    params = mariadb.params
    wrong = MySQLXASink(host=params.host, port=params.port, user=params.user,
                        password="not-the-password", database=params.database, table=table,
                        tls=params.tls)
    with pytest.raises(ConfigurationError) as denied:
        wrong.begin_transaction(context(query_id=new_query_id(), columns=COLUMNS))
    message = str(denied.value)
    assert "1045" in message and f"{params.host}:{params.port}" in message
    assert "not-the-password" not in message and "password" in message.lower()
    assert db.xa_recover() == []


def test_unreachable_server_names_host_and_port(table: str) -> None:
    with socket.socket() as probe:  # a port with nothing listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    nowhere = MySQLXASink(host="127.0.0.1", port=port, user="u", password="secret-pw",
                          database="d", table=table, connect_timeout_s=2)
    with pytest.raises(RetryableError) as unreachable:
        nowhere.begin_transaction(context(query_id=new_query_id(), columns=COLUMNS))
    assert f"127.0.0.1:{port}" in str(unreachable.value) and "2003" in str(unreachable.value)
    assert "secret-pw" not in str(unreachable.value)


def test_lock_wait_on_prepared_rows_is_retryable(mariadb: MariaDBServer, sink: MySQLXASink,
                                                 db: Db, table: str) -> None:
    query = new_query_id()
    holder = prepare(sink, query, [(7, "held", 1.0)])
    impatient = make_sink(mariadb.params, table, mode="upsert", lock_wait_timeout_s=1)
    with pytest.raises(RetryableError, match=r"\[1205\].*XA RECOVER"):
        prepare(impatient, query, [(7, "other", 2.0)], attempt=1)
    assert commit(sink, holder) is CommitOutcome.COMMITTED
    assert db.query(f"SELECT name FROM `{table}`") == [("held",)]


def test_branch_still_attached_to_its_writer_is_retryable(sink: MySQLXASink, db: Db) -> None:
    """MariaDB cannot resolve a prepared branch from elsewhere while its session lives."""
    txn_id = context(query_id=new_query_id(), columns=COLUMNS).txn_id
    handle = sink.handle(txn_id, rows=1)
    xid = f"'tph.{txn_id.global_part}','{txn_id.branch_part}'"
    writer = db.server.connect()  # a writer that did not close its connection after PREPARE
    with writer.cursor() as cursor:
        for statement in (f"XA START {xid}", "INSERT INTO _twophase_xa_markers VALUES "
                          f"('{txn_id}', 'orders', 't', 1, NOW(), NOW(), NULL)",
                          f"XA END {xid}", f"XA PREPARE {xid}"):
            cursor.execute(statement)
    with pytest.raises(RetryableError, match="still attached"):
        commit(sink, handle)
    writer.close()
    assert commit(sink, handle) is CommitOutcome.COMMITTED
    assert db.marker(handle) is not None


def test_configuration_and_repr(mariadb: MariaDBServer) -> None:
    params = mariadb.params
    sink = make_sink(params, "My Orders.2024`table")
    assert params.password not in repr(sink) and "password='***'" in repr(sink)
    assert sink.default_namespace().startswith("My_Orders_2024_")
    assert sink.former_default_namespaces() == ("My_Orders_2024_table",)
    assert len(make_sink(params, "x" * 40).default_namespace()) == NAMESPACE_MAX_LENGTH
    other_database = make_sink(replace(params, database="elsewhere"), "My Orders.2024`table")
    assert other_database.default_namespace() != sink.default_namespace()
    with pytest.raises(ConfigurationError, match="LOAD DATA cannot update"):
        make_sink(params, "t", mode="upsert", bulk="load_data")
    with pytest.raises(ConfigurationError, match="connect_args"):
        make_sink(params, "t", connect_args={"autocommit": False})
    with pytest.raises(ConfigurationError, match="chunk_size=0"):
        make_sink(params, "t", chunk_size=0)
    with pytest.raises(TypeError, match="batch_size"):  # renamed: a batch is a micro-batch
        make_sink(params, "t", batch_size=10)
    assert "CREATE TABLE IF NOT EXISTS" in MARKER_TABLE_DDL
    shipped = pickle.loads(pickle.dumps(sink))  # what Spark does to send it to executors
    assert repr(shipped) == repr(sink) and shipped.server == sink.server


def test_a_connection_url_in_a_secret_writes_and_commits(
        mysql_setup: MySQLSetup, monkeypatch: pytest.MonkeyPatch) -> None:
    """``connection=Secret(env=...)`` holding the whole URL: the executors' copy of the sink
    (pickled, without the password) writes, the driver's commits, the rows are there."""
    target = mysql_setup.new_target()
    url, options = as_connection_url("mariadb", target.options)
    password = target.options["password"]
    monkeypatch.setenv("TWOPHASE_TEST_MYSQL_URL", url)
    sink = MySQLXASink(connection=Secret(env="TWOPHASE_TEST_MYSQL_URL"), **options)
    sink.check_schema(ORDER_COLUMNS)
    use_query_id(new_query_id())
    try:
        committed_through_its_pickled_copy(sink, password, orders(0, 5))
    finally:
        use_query_id(QUERY_ID)
    assert target.visible() == [0, 1, 2, 3, 4]


# -- fencing -----------------------------------------------------------------------------------

def test_fencing_stops_a_zombie_run(mariadb: MariaDBServer, db: Db, table: str) -> None:
    """Fencing goes through committers: the epoch a committer claimed guards its commits."""
    query = new_query_id()
    zombie_sink = make_sink(mariadb.params, table, fencing=True)
    zombie_sink.check_schema(COLUMNS)
    newer_sink = make_sink(mariadb.params, table, fencing=True)
    with zombie_sink.committer() as zombie, newer_sink.committer() as newer:
        zombie.fence(NAMESPACE, query, 1)
        handle = prepare(zombie_sink, query, rows_for(0, 0, 10))

        newer.fence(NAMESPACE, query, 2)
        with pytest.raises(FencedError, match=r"epoch 1 .* is at epoch 2"):
            zombie.commit(handle)
        with pytest.raises(FencedError):
            zombie.abort(handle)
        with pytest.raises(FencedError):
            zombie.fence(NAMESPACE, query, 1)
        assert db.ids(table) == [] and len(db.xa_recover()) == 1

        assert newer.commit(handle) is CommitOutcome.COMMITTED  # the newer run finishes it
        assert db.ids(table) == ids_of(rows_for(0, 0, 10))
        newer.fence(NAMESPACE, query, 2)  # the same epoch again (cleanup joining) is fine
        assert newer.commit(handle) is CommitOutcome.ALREADY_COMMITTED

    orphan = prepare(zombie_sink, query, rows_for(1, 0, 3), batch=1)
    with newer_sink.committer() as unclaimed:
        with pytest.raises(ConfigurationError, match=r"never claimed an epoch"):
            unclaimed.commit(orphan)  # committing needs a claimed epoch
        assert unclaimed.abort(orphan) is AbortOutcome.ABORTED  # cleanup may abort orphans
    assert db.ids(table) == ids_of(rows_for(0, 0, 10))


def test_a_fence_claim_lives_in_its_committer_only(mariadb: MariaDBServer, db: Db,
                                                   table: str) -> None:
    """A fence claims the epoch on the server and keeps the claim in its committer only: the
    pickled sink holds no per-process state, so a committer that claimed nothing (a
    short-lived one, as the deprecated sink.commit opens) is refused with fencing on."""
    query = new_query_id()
    sink = make_sink(mariadb.params, table, fencing=True)
    sink.check_schema(COLUMNS)
    with pytest.warns(DeprecationWarning, match=r"sink.committer\(\)"):
        sink.fence(NAMESPACE, query, 3)  # the 0.2.0 way, until 0.6.0: a committer of its own
    assert db.query("SELECT epoch FROM _twophase_xa_fence WHERE query = %s",
                    (query_key(query),)) == [(3,)]
    handle = prepare(sink, query, rows_for(0, 0, 2), epoch=3)
    with pytest.raises(ConfigurationError, match=r"never claimed.*Fix: commit through "
                                                 r"sink.committer\(\) after committer.fence"), \
            sink.committer() as short_lived:
        short_lived.commit(handle)
    shipped = pickle.dumps(sink)
    with sink.committer() as committer:
        with pytest.raises(FencedError):
            committer.fence(NAMESPACE, query, 2)
        committer.fence(NAMESPACE, query, 3)
        assert committer.commit(handle) is CommitOutcome.COMMITTED
    assert pickle.dumps(sink) == shipped  # the claim lived in the committer only
    assert db.ids(table) == ids_of(rows_for(0, 0, 2))


def test_fence_waits_for_a_commit_past_its_check(mariadb: MariaDBServer, db: Db,
                                                 table: str) -> None:
    """A zombie between its fence check and XA COMMIT holds the row: the takeover waits."""
    query = new_query_id()
    old = make_sink(mariadb.params, table, fencing=True)
    old.check_schema(COLUMNS)
    with old.committer() as committer:
        committer.fence(NAMESPACE, query, 1)
    holder = mariadb.connect(autocommit=False)  # what _fenced holds during XA COMMIT
    with holder.cursor() as cursor:
        cursor.execute("SELECT epoch FROM _twophase_xa_fence WHERE namespace = %s "
                       "AND query = %s LOCK IN SHARE MODE", (NAMESPACE, query_key(query)))
    newer = make_sink(mariadb.params, table, fencing=True, lock_wait_timeout_s=1)
    with pytest.raises(RetryableError, match="1205"), newer.committer() as committer:
        committer.fence(NAMESPACE, query, 2)

    release = threading.Timer(0.5, holder.commit)
    release.start()
    patient = make_sink(mariadb.params, table, fencing=True, lock_wait_timeout_s=10)
    with patient.committer() as committer:
        committer.fence(NAMESPACE, query, 2)  # returns once the "commit" released the row
    release.join()
    holder.close()
    assert db.query("SELECT epoch FROM _twophase_xa_fence WHERE query = %s",
                    (query_key(query),)) == [(2,)]


# -- the committer -----------------------------------------------------------------------------

@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every connection the sink opens from now on, in order."""
    connections: list[Any] = []
    connect = Server.connect

    def counted(server: Server, **options: Any) -> Any:
        connections.append(connect(server, **options))
        return connections[-1]

    monkeypatch.setattr(Server, "connect", counted)
    return connections


def test_a_committer_reuses_its_connections_across_handles_and_threads(
        sink: MySQLXASink, db: Db, table: str, opened: list[Any]) -> None:
    parts = [rows_for(0, p, 4) for p in range(12)]
    handles = [prepare(sink, new_query_id(), rows, partition=p) for p, rows in enumerate(parts)]
    opened.clear()
    with sink.committer() as committer, ThreadPoolExecutor(max_workers=3) as threads:
        assert list(threads.map(committer.commit, handles)) == [CommitOutcome.COMMITTED] * 12
        assert list(threads.map(committer.commit, handles)) == [
            CommitOutcome.ALREADY_COMMITTED] * 12
        assert 1 <= len(opened) <= 3 and all(conn.open for conn in opened)  # one per thread
    assert not any(conn.open for conn in opened)  # close() closed them
    assert db.ids(table) == ids_of(*parts) and db.xa_recover() == []


def test_a_committer_replaces_a_connection_the_server_ended(
        sink: MySQLXASink, db: Db, opened: list[Any]) -> None:
    query = new_query_id()
    first, second = (prepare(sink, query, rows_for(0, p, 3), partition=p) for p in range(2))
    opened.clear()
    with sink.committer() as committer:
        assert committer.commit(first) is CommitOutcome.COMMITTED
        [pooled] = opened
        db.query(f"KILL CONNECTION {pooled.thread_id()}")
        with pytest.raises(RetryableError):  # the statement died with the connection
            committer.commit(second)
        assert committer.commit(second) is CommitOutcome.COMMITTED  # the retry: a new one
    assert len(opened) == 2 and not opened[1].open


# -- errors without an error code --------------------------------------------------------------

@pytest.mark.parametrize(("error", "kind"), [
    (pymysql.err.InterfaceError(0, ""), RetryableError),
    (pymysql.err.InternalError("Packet sequence number wrong - got 5 expected 1"), FatalError),
    (pymysql.err.OperationalError("received unknown auth switch request"), FatalError),
    (pymysql.err.ProgrammingError("Cursor closed"), FatalError),
    (pymysql.err.Error("Already closed"), FatalError),
], ids=["closed", "out-of-sync", "auth-packet", "cursor-closed", "already-closed"])
def test_an_error_without_a_code_is_classified_by_its_type(error: Exception,
                                                           kind: type[Exception]) -> None:
    classified = classify(error, "commit of x on MySQL server db:3306")
    assert type(classified) is kind
    message = str(classified)
    assert "commit of x on MySQL server db:3306" in message and "[0]" not in message
    if kind is RetryableError:
        assert "never sent" in message
    else:
        assert "without an error code" in message and "not retried" in message


@pytest.mark.parametrize("step", ["write", "pre_commit"])
def test_a_writer_connection_closed_before_prepare_is_retryable(sink: MySQLXASink, db: Db,
                                                                table: str, step: str) -> None:
    """PyMySQL raises InterfaceError(0, '') on a closed connection: nothing was sent, and the
    server rolled the unprepared branch back with its session, so the task may run again."""
    txn = sink.begin_transaction(context(query_id=new_query_id(), columns=COLUMNS))
    sink.write(txn, rows_for(0, 0, 5))
    assert txn.conn is not None
    txn.conn.close()
    with pytest.raises(RetryableError) as closed:
        if step == "write":
            sink.write(txn, rows_for(0, 1, 5))
        else:
            sink.pre_commit(txn)
    assert "never sent" in str(closed.value) and "never committed" in str(closed.value)
    assert txn.conn is None and db.ids(table) == [] and db.xa_recover() == []


def test_a_commit_error_without_a_code_is_not_retried_blindly(
        sink: MySQLXASink, db: Db, table: str, monkeypatch: pytest.MonkeyPatch) -> None:
    handle = prepare(sink, new_query_id(), rows_for(0, 0, 3))
    attempts: list[str] = []

    def failing(error: Exception) -> Any:
        def resolve(conn: Any, verb: str, xid: Any, *, where: str) -> bool:
            attempts.append(verb)
            if len(attempts) == 1:
                raise error
            return xa.resolve(conn, verb, xid, where=where)
        return resolve

    monkeypatch.setattr("sinks.mysql.committer.resolve", failing(
        pymysql.err.InternalError("Packet sequence number wrong - got 7 expected 1")))
    with sink.committer() as committer, pytest.raises(FatalError) as fatal:
        FAST_RETRY.call(lambda: committer.commit(handle), what="commit")
    assert attempts == ["COMMIT"] and "without an error code" in str(fatal.value)
    assert len(db.xa_recover()) == 1  # still prepared: recovery decides, not a blind retry

    attempts.clear()
    monkeypatch.setattr("sinks.mysql.committer.resolve",
                        failing(pymysql.err.InterfaceError(0, "")))
    with sink.committer() as committer:
        outcome = FAST_RETRY.call(lambda: committer.commit(handle), what="commit")
    assert outcome is CommitOutcome.COMMITTED and attempts == ["COMMIT", "COMMIT"]
    assert db.ids(table) == ids_of(rows_for(0, 0, 3))

