"""RedisStreamSink against a real, private redis-server: the contract, then what only it
needs. Every assertion about data is made on the server's own view, read by ``redis-cli``
(:func:`setups.redis.entries`), never by the sink's code."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from setups import RedisSetup, Target
from setups.redis import entries
from setups.servers.redis import RedisServer, private_cluster, private_server
from setups.servers.tls import CertificateAuthority
from sinks.redis import RedisStreamSink
from sinks.redis.errors import classify
from sinks.redis.keys import StreamKeys, hash_tag
from tests.sinks import SettlingInAThread, committed_through_its_pickled_copy, settle
from tests.sinks.redis import LengthReader
from twophase import (
    AbortOutcome,
    Column,
    CommitOutcome,
    ConfigurationError,
    FatalError,
    RetryableError,
    Secret,
    TransactionLostError,
)
from twophase.testing.contract import (
    NAMESPACE,
    ORDER_COLUMNS,
    QUERY_ID,
    SinkContract,
    abort,
    commit,
    list_in_doubt,
    orders,
    prepare,
    use_query_id,
)


class TestRedisContract(SinkContract):
    """The shared contract over a fresh stream of the private durable server."""

    setup_fixture = "redis_setup"
    has_schema = False  # a stream entry takes any fields


@pytest.fixture
def target(redis_setup: RedisSetup) -> Iterator[Target]:
    """A fresh stream, under a query id of the test's own."""
    use_query_id(str(uuid.uuid4()))
    yield redis_setup.new_target()
    use_query_id(QUERY_ID)


#: Rows per partition of the batch whose commit script the server is killed in (~0.3 s).
BIG = 40_000
#: How long a probe waits for an answer before it counts the server as busy.
PROBE_TIMEOUT_S = 0.05


def sink_of(target: Target, **overrides: Any) -> RedisStreamSink:
    sink = RedisStreamSink(**{**target.options, **overrides})
    sink.check_schema(ORDER_COLUMNS)
    return sink


def event_ids(server: RedisServer, stream: str) -> list[int]:
    """The event ids of the stream's entries, in the stream's order."""
    return [int(entry["event_id"]) for entry in entries(server, stream)]


# -- a batch is one script: whole to readers, exactly once through crashes of the server ----------

def test_a_batch_of_several_partitions_commits_in_one_script(
        target: Target, redis_node: RedisServer) -> None:
    sink = sink_of(target, chunk_size=3)
    handles = [prepare(sink, orders(10 * part, 7), partition=part) for part in range(3)]
    assert event_ids(redis_node, sink.stream) == []
    assert settle(sink, handles) == [CommitOutcome.COMMITTED] * 3
    assert event_ids(redis_node, sink.stream) == [*range(7), *range(10, 17), *range(20, 27)]
    assert settle(sink, handles) == [CommitOutcome.ALREADY_COMMITTED] * 3
    assert target.in_doubt() == []


def test_the_server_killed_while_batches_are_staged_loses_nothing(
        target: Target, redis_node: RedisServer) -> None:
    sink = sink_of(target)
    first, second = prepare(sink, orders(0, 3), partition=0), prepare(sink, orders(3, 2),
                                                                        partition=1)
    assert commit(sink, first) is CommitOutcome.COMMITTED
    redis_node.kill()
    redis_node.start()
    assert [h.txn_id for h in list_in_doubt(sink, NAMESPACE)] == [second.txn_id]
    assert settle(sink, [first, second]) == [CommitOutcome.ALREADY_COMMITTED,
                                           CommitOutcome.COMMITTED]
    assert event_ids(redis_node, sink.stream) == [0, 1, 2, 3, 4]
    assert target.in_doubt() == []


def test_the_server_killed_while_a_commit_script_runs_leaves_none_of_the_batch(
        target: Target, redis_node: RedisServer) -> None:
    """Killed once a second client finds the server busy (a script runs alone): the AOF has
    no block of it, so none of the batch is there after the restart; the recommit adds it."""
    sink = sink_of(target)
    handles = [prepare(sink, orders(BIG * part, BIG), partition=part) for part in range(2)]
    probe = redis.Redis(host=redis_node.sink_options()["host"], port=redis_node.port,
                        socket_timeout=PROBE_TIMEOUT_S, retry=Retry(NoBackoff(), 0))
    commit = SettlingInAThread(sink, handles)
    busy_while_committing(probe, commit.thread)
    redis_node.kill()
    commit.thread.join()
    redis_node.start()
    assert commit.failed, "the commit ended before the server was killed"
    assert int(redis_node.cli("XLEN", sink.stream)) == 0
    assert settle(sink, handles) == [CommitOutcome.COMMITTED] * 2
    assert event_ids(redis_node, sink.stream) == list(range(2 * BIG))


def busy_while_committing(probe: redis.Redis, committer: threading.Thread) -> None:
    """Return once a PING from another connection goes unanswered (a script is running)."""
    while committer.is_alive():
        try:
            probe.ping()
        except redis.exceptions.TimeoutError:
            return
        time.sleep(0.001)
    raise AssertionError("the commit ended before its script was seen running")


def test_a_batch_larger_than_a_script_resumes_after_the_server_is_killed_between_scripts(
        target: Target, redis_node: RedisServer) -> None:
    """40 rows a partition, 10 a chunk, 50 a script: the first script moves the first
    partition and one chunk of the second; the server is killed there (its AOF holds that
    script's block); recovery moves the rest, each row once and in order."""
    sink = sink_of(target, chunk_size=10, max_rows_per_script=50)
    handles = [prepare(sink, orders(100 * part, 40), partition=part) for part in range(3)]
    with sink.committer() as committer:
        assert committer.commit_step(handles) == [b"committed", b"pending", b"pending"]
    assert event_ids(redis_node, sink.stream) == [*range(40), *range(100, 110)]
    with pytest.raises(FatalError, match="its commit has begun"):
        abort(sink, handles[1])
    redis_node.kill()
    redis_node.start()
    assert settle(sink, handles) == [CommitOutcome.ALREADY_COMMITTED,
                                      CommitOutcome.COMMITTED, CommitOutcome.COMMITTED]
    assert event_ids(redis_node, sink.stream) == [*range(40), *range(100, 140),
                                                  *range(200, 240)]
    assert target.in_doubt() == []


def test_a_lost_staged_chunk_is_a_lost_transaction_and_nothing_of_the_batch_is_written(
        target: Target, redis_node: RedisServer) -> None:
    sink = sink_of(target, chunk_size=2)
    whole, cut = prepare(sink, orders(0, 4), partition=0), prepare(sink, orders(4, 4),
                                                                    partition=1)
    stage = StreamKeys(sink.stream).stage(cut.txn_id)
    first_chunk = redis_node.cli("XRANGE", stage, "-", "+", "COUNT", "1").split()[0]
    redis_node.cli("XDEL", stage, first_chunk)
    with pytest.raises(TransactionLostError, match="staging holds 1 chunks where its handle "
                       "names 2"):
        settle(sink, [whole, cut])
    assert event_ids(redis_node, sink.stream) == []
    assert settle(sink, [whole]) == [CommitOutcome.COMMITTED]
    assert abort(sink, cut) is AbortOutcome.ABORTED


def test_readers_see_each_batch_whole(target: Target, redis_node: RedisServer) -> None:
    """Lengths seen by a reader polling from another connection while batches of different
    sizes commit: only the batches' boundaries."""
    sink = sink_of(target, chunk_size=50)
    sizes = [300, 1, 700, 250, 999]
    batches = [[prepare(sink, orders(1000 * batch + 10 * part, size // 2 + part * (size % 2)),
                        batch=batch, partition=part) for part in range(2)]
               for batch, size in enumerate(sizes)]
    reader = LengthReader(redis_node, sink.stream)
    with reader.polling():
        for handles in batches:
            settle(sink, handles)
    boundaries = {0}
    for size in sizes:
        boundaries.add(max(boundaries) + size)
    assert reader.seen <= boundaries, sorted(reader.seen - boundaries)
    assert int(redis_node.cli("XLEN", sink.stream)) == sum(sizes)


# -- what the preflight refuses --------------------------------------------------------------------

@pytest.mark.parametrize(("settings", "named"), [
    ({"appendfsync": "everysec"}, "appendfsync is 'everysec'"),
    ({"appendonly": "no"}, "the AOF is off"),
    ({"maxmemory-policy": "allkeys-lru"}, "maxmemory-policy is 'allkeys-lru'"),
])
def test_a_server_that_could_lose_a_proof_or_a_staged_batch_is_refused(
        settings: dict[str, str], named: str) -> None:
    with private_server(settings) as server:
        sink = RedisStreamSink("orders", **server.sink_options())
        with pytest.raises(ConfigurationError, match=named) as refused:
            sink.check_schema(ORDER_COLUMNS)
        assert "Fix:" in str(refused.value)


def test_an_accepted_loss_window_takes_appendfsync_everysec_but_not_the_aof_off() -> None:
    with private_server({"appendfsync": "everysec"}) as server:
        RedisStreamSink("orders", **server.sink_options(),
                        accept_loss_window_s=1).check_schema(ORDER_COLUMNS)
        server.cli("CONFIG", "SET", "appendonly", "no")
        with pytest.raises(ConfigurationError, match="the AOF is off"):
            RedisStreamSink("orders", **server.sink_options(),
                            accept_loss_window_s=1).check_schema(ORDER_COLUMNS)


def test_a_user_refused_config_get_is_refused_unless_a_loss_window_is_accepted(
        redis_node: RedisServer, target: Target, caplog: pytest.LogCaptureFixture) -> None:
    stream = target.options["stream"]
    rules = [rule for rule in RedisSetup.sink_rules(stream) if rule != "+config|get"]
    user = redis_node.create_user(f"u{uuid.uuid4().hex[:8]}", "pw", rules)
    options = {**target.options, "username": user.name, "password": user.password}
    with pytest.raises(ConfigurationError, match=r"CONFIG GET appendfsync is refused.*"
                       r"\+config\|get.*accept_loss_window_s"):
        RedisStreamSink(**options).check_schema(ORDER_COLUMNS)
    with caplog.at_level(logging.WARNING, logger="sinks.redis.durability"):
        RedisStreamSink(**options, accept_loss_window_s=1).check_schema(ORDER_COLUMNS)
    assert "trusting accept_loss_window_s=1" in caplog.text


def test_a_key_of_another_type_and_an_unreachable_server_are_named(
        target: Target, redis_node: RedisServer) -> None:
    redis_node.cli("SET", target.options["stream"], "not a stream")
    with pytest.raises(ConfigurationError, match="the key holds a string, not a stream"):
        RedisStreamSink(**target.options).check_schema(ORDER_COLUMNS)
    closed = RedisStreamSink("orders", host="127.0.0.1", port=1, tls="off",
                             connect_timeout_s=1)
    with pytest.raises(RetryableError, match=r"ConnectionError.*Fix: retried automatically"):
        closed.check_schema(ORDER_COLUMNS)


def test_a_missing_acl_rule_is_named_with_the_rules_to_grant(
        target: Target, redis_node: RedisServer) -> None:
    stream = target.options["stream"]
    rules = [rule for rule in RedisSetup.sink_rules(stream) if rule != "+xadd"]
    user = redis_node.create_user(f"u{uuid.uuid4().hex[:8]}", "pw", rules)
    sink = RedisStreamSink(**target.options, username=user.name, password=user.password)
    with pytest.raises(ConfigurationError, match=r"no permissions.*Fix: grant .*\+xadd"):
        prepare(sink, orders(0, 1))


# -- what the entries hold ----------------------------------------------------------------------

TYPED_COLUMNS = (Column("event_id", "bigint"), Column("flag", "boolean"),
                 Column("price", "decimal(12,3)"), Column("ratio", "double"),
                 Column("day", "date"), Column("at", "timestamp"),
                 Column("wall", "timestamp_ntz"), Column("blob", "binary"),
                 Column("note", "string"))
TYPED_ROW = (7, True, Decimal("12.300"), 0.1, dt.date(2026, 1, 2),
             dt.datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=dt.UTC),
             dt.datetime(2026, 1, 2, 3, 4, 5), b"\x00\xff", None)
TYPED_FIELDS = {"event_id": "7", "flag": "true", "price": "12.300", "ratio": "0.1",
                "day": "2026-01-02", "at": "2026-01-02T03:04:05.006000Z",
                "wall": "2026-01-02T03:04:05.000000",
                "blob": b"\x00\xff".decode("utf-8", "surrogateescape")}  # the bytes as they are


@pytest.mark.parametrize("arrow", [False, True], ids=["rows", "arrow"])
def test_each_type_is_written_as_the_same_text_on_both_paths(
        target: Target, redis_node: RedisServer, *, arrow: bool) -> None:
    sink = RedisStreamSink(**target.options)
    handle = prepare(sink, [TYPED_ROW], arrow=arrow, columns=TYPED_COLUMNS)
    assert commit(sink, handle) is CommitOutcome.COMMITTED
    assert entries(redis_node, sink.stream) == [TYPED_FIELDS]  # note (NULL) left out


# -- security: TLS verified, least privilege, a rotated password ----------------------------------

def test_over_verified_tls_as_a_least_privileged_user_with_a_rotated_password(
        secured_redis: RedisServer, tmp_path: Path) -> None:
    stream = f"orders-{uuid.uuid4().hex[:8]}"
    user = secured_redis.create_user("sink", "first", RedisSetup.sink_rules(stream))
    password_file = tmp_path / "password"
    password_file.write_text("first")
    sink = RedisStreamSink(stream, **secured_redis.sink_options(), username=user.name,
                           password=Secret(file=str(password_file)))
    sink.check_schema(ORDER_COLUMNS)
    committed_through_its_pickled_copy(sink, "first", orders(0, 2), sink.settings)
    secured_redis.cli("ACL", "SETUSER", "sink", "resetpass", ">second")
    password_file.write_text("second")
    secured_redis.cli("CLIENT", "KILL", "USER", "sink")  # its connections log in again
    assert commit(sink, prepare(sink, orders(2, 2), batch=1)) is CommitOutcome.COMMITTED
    assert event_ids(secured_redis, stream) == [0, 1, 2, 3]


def test_a_certificate_of_another_ca_is_refused_naming_ca_bundle(
        secured_redis: RedisServer, tmp_path: Path) -> None:
    stranger = CertificateAuthority(tmp_path / "other-ca", name="another CA")
    options = {**secured_redis.sink_options(), "ca_bundle": str(stranger.cafile)}
    with pytest.raises(ConfigurationError, match=r"certificate.*Fix: check ca_bundle="):
        RedisStreamSink("orders", **options).check_schema(ORDER_COLUMNS)


# -- a cluster ------------------------------------------------------------------------------------

def test_on_a_cluster_the_sinks_keys_share_the_streams_slot_and_a_batch_commits_whole() -> None:
    with private_cluster() as cluster:
        stream = "events{eu}"
        sink = RedisStreamSink(stream, **cluster.sink_options(), chunk_size=2)
        sink.check_schema(ORDER_COLUMNS)
        handles = [prepare(sink, orders(10 * part, 3), partition=part) for part in range(2)]
        assert [h.txn_id for h in list_in_doubt(sink, NAMESPACE)] == [h.txn_id
                                                                        for h in handles]
        assert settle(sink, handles) == [CommitOutcome.COMMITTED] * 2
        node = cluster.node_of(stream)
        assert event_ids(node, stream) == [0, 1, 2, 10, 11, 12]
        assert node.cli("KEYS", "{eu}:twophase:*").split() == [StreamKeys(stream).proofs]
        assert settle(sink, handles) == [CommitOutcome.ALREADY_COMMITTED] * 2


@pytest.mark.parametrize(("stream", "tag"), [("orders", "orders"), ("events{eu}", "eu"),
                                             ("x{y}z{w}", "y"), ("a{b", "a{b")])
def test_the_hash_tag_is_the_clusters(stream: str, tag: str) -> None:
    from redis.crc import key_slot  # noqa: PLC0415 - the cluster's own hash

    keys = StreamKeys(stream)
    assert hash_tag(stream) == tag
    assert {key_slot(key.encode()) for key in [*keys.bookkeeping(), keys.stages]} == {
        key_slot(stream.encode())}


@pytest.mark.parametrize("stream", ["a{}b", "a}b", "{}x}"])
def test_a_brace_that_is_no_hash_tag_is_refused(stream: str) -> None:
    with pytest.raises(ConfigurationError, match="holds a brace that is no hash tag"):
        RedisStreamSink(stream)


def test_classify_takes_the_servers_code_word() -> None:
    import redis.exceptions as rexc  # noqa: PLC0415

    assert isinstance(classify(rexc.ResponseError("BUSY Redis is busy"), "x"), RetryableError)
    assert isinstance(classify(rexc.ResponseError("OOM command not allowed"), "x"),
                      RetryableError)
    assert isinstance(classify(rexc.ResponseError("WRONGTYPE Operation"), "x"),
                      ConfigurationError)
    assert isinstance(classify(rexc.ResponseError("ERR something"), "x"), FatalError)
