"""JetStreamSink against a real, private nats-server: the contract, then what only it needs.

Every assertion about data is made on the test's own view (:class:`setups.servers.nats.NatsView`:
an ephemeral consumer of the subject, never the sink's code).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from setups import NatsSetup, Target
from setups.least_privilege import sink_with_password_file
from setups.nats import SecuredNatsSetup
from setups.servers.local import HOST
from setups.servers.nats import NatsServer
from setups.servers.tls import CertificateAuthority
from sinks.nats import JetStreamSink
from sinks.nats.access import matches
from sinks.nats.errors import classify
from tests.sinks import SettlingInAThread, committed_through_its_pickled_copy, settle
from twophase import (
    AbortOutcome,
    Column,
    CommitOutcome,
    ConfigurationError,
    FatalError,
    Handle,
    RetryableError,
    SchemaMismatchError,
    Secret,
    TransactionLostError,
)
from twophase.kit import TlsMode
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
    purge_commit_records,
    use_query_id,
)


class TestNatsContract(SinkContract):
    """The shared contract over a fresh stream and subject of the private server."""

    setup_fixture = "nats_setup"
    #: A subject has no columns: any row is one message.
    has_schema = False


class TestSecuredNatsContract(SinkContract):
    """The shared contract over verified TLS, each target written by a user holding exactly
    the sink's permissions (sinks.nats.access), its password read from a 0600 file."""

    setup_fixture = "nats_secured_setup"
    has_schema = False


# -- what only NATS needs --------------------------------------------------------------------------

#: A child process that settles a batch (the driver's commit), killed by the test mid-chain.
_SETTLE = """
import pickle, sys
from twophase import Handle
sink = pickle.loads(bytes.fromhex(sys.argv[1]))
handles = tuple(Handle.loads(line) for line in sys.stdin.read().splitlines())
with sink.committer() as committer:
    committer.settle(handles)
"""
#: How often the test looks at the subject while a child commits.
POLL_S = 0.005
KILL_TIMEOUT_S = 60.0


@pytest.fixture(autouse=True)
def _fresh_query() -> Iterator[None]:
    """A query id of the test's own."""
    use_query_id(str(uuid.uuid4()))
    yield
    use_query_id(QUERY_ID)


@pytest.fixture
def target(nats_setup: NatsSetup) -> Target:
    """A fresh stream and subject."""
    return nats_setup.new_target()


def sink_of(target: Target, **options: Any) -> JetStreamSink:
    sink = JetStreamSink(**{**target.options, **options})
    sink.check_schema(ORDER_COLUMNS)
    return sink


def batch(sink: JetStreamSink, partitions: int, rows: int) -> list[Handle]:
    """One batch of ``partitions`` pre-committed transactions of ``rows`` orders each."""
    return [prepare(sink, orders(rows * p, rows), partition=p) for p in range(partitions)]


def staged(nats_setup: NatsSetup, target: Target) -> dict[str, int]:
    return nats_setup.view.subjects(target.options["staging_stream"], "twophase.stage.>")


def held(nats_setup: NatsSetup, target: Target) -> int:
    subject = target.options["subject"]
    return nats_setup.view.subjects(target.options["stream"], subject).get(subject, 0)


def test_committed_messages_carry_their_transaction_and_the_row_as_json(
        nats_setup: NatsSetup, target: Target) -> None:
    sink = sink_of(target)
    moment = dt.datetime(2026, 3, 29, 1, 30, 15, 123456, tzinfo=dt.UTC)
    columns = (Column("event_id", "bigint", False), Column("price", "decimal(12,3)"),
               Column("blob", "binary"), Column("ts", "timestamp"),
               Column("tags", "array<string>"))
    rows = [(1, Decimal("12.340"), b"\x00\xff", moment, ["a"]), (2, None, None, None, [])]
    handle = prepare(sink, rows, columns=columns)
    assert commit(sink, handle) is CommitOutcome.COMMITTED
    messages = nats_setup.view.messages(target.options["stream"], target.options["subject"])
    assert [json.loads(message.data) for message in messages] == [
        {"event_id": 1, "price": "12.340", "blob": "AP8=", "ts": "2026-03-29T01:30:15.123456+00:00",
         "tags": ["a"]},
        {"event_id": 2, "price": None, "blob": None, "ts": None, "tags": []}]
    assert [{name: message.headers[name] for name in
             ("Twophase-Txn", "Twophase-Index", "Twophase-Count")}
            for message in messages] == [
        {"Twophase-Txn": str(handle.txn_id), "Twophase-Index": str(i), "Twophase-Count": "2"}
        for i in range(2)]
    # a pipelined run's first message also names itself for the duplicate window
    assert messages[0].headers["Nats-Msg-Id"] == f"{handle.txn_id}/0"


def test_a_value_column_is_the_payload_as_is_and_must_be_text_or_bytes(
        nats_setup: NatsSetup, target: Target) -> None:
    columns = (Column("event_id", "bigint", False), Column("body", "string"))
    sink = JetStreamSink(**{**target.options, "value": "body"})
    sink.check_schema(columns)
    with pytest.raises(SchemaMismatchError, match=r"value='body' is a bigint column.*Fix: "):
        sink.check_schema((Column("body", "bigint"),))
    assert commit(sink, prepare(sink, [(7, '{"event_id": 7}')], columns=columns)) \
        is CommitOutcome.COMMITTED
    assert target.visible() == [7]


def test_a_batch_is_one_chain_in_partition_order_and_a_replay_after_the_window_adds_nothing(
        nats_setup: NatsSetup) -> None:
    """The duplicate window (1 s here) plays no part: a second settle long after it proves
    every handle committed and publishes nothing."""
    target = nats_setup.new_target(stream_config={"duplicate_window": 1.0})
    sink = sink_of(target)
    handles = batch(sink, 3, 4)
    assert settle(sink, list(reversed(handles))) == [CommitOutcome.COMMITTED] * 3
    assert nats_setup.view.event_ids(target.options["stream"], target.options["subject"]) \
        == list(range(12))
    time.sleep(1.5)
    assert settle(sink, handles) == [CommitOutcome.ALREADY_COMMITTED] * 3
    # the proofs gone too: the tip proves the last, the others are lost, never published again
    purge_commit_records(sink, NAMESPACE, dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    assert commit(sink, handles[-1]) is CommitOutcome.ALREADY_COMMITTED
    with pytest.raises(TransactionLostError, match=r"0 of its 1 chunks of rows are staged.*Fix: "):
        commit(sink, handles[0])
    assert target.visible() == list(range(12))
    assert staged(nats_setup, target) == {}


@pytest.mark.parametrize(("stream_subjects", "partitions", "rows"), [
    pytest.param(1, 3, 5000, id="pipelined"), pytest.param(2, 3, 1500, id="sequential")])
def test_a_commit_killed_mid_chain_is_finished_by_recovery_every_message_once_in_order(
        nats_setup: NatsSetup, stream_subjects: int, partitions: int, rows: int) -> None:
    """A child settling a batch of thousands is SIGKILLed once part of it is in the subject;
    readers see a prefix; after the duplicate window (1 s) recovery publishes the rest once."""
    target = nats_setup.new_target(stream_config={"duplicate_window": 1.0})
    if stream_subjects == 2:  # a foreign subject: the sink does not own the stream
        stream = target.options["stream"]
        nats_setup.view.run(lambda js: js.update_stream(
            name=stream, subjects=[target.options["subject"], f"{stream}.other"],
            storage="file", duplicate_window=1.0))
    sink = sink_of(target)
    handles = batch(sink, partitions, rows)
    total = partitions * rows
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    child = subprocess.Popen([sys.executable, "-c", _SETTLE, pickle.dumps(sink).hex()],
                             stdin=subprocess.PIPE, env=env, text=True)
    assert child.stdin is not None
    child.stdin.write("\n".join(handle.dumps() for handle in handles))
    child.stdin.close()
    deadline = time.monotonic() + KILL_TIMEOUT_S
    while (published := held(nats_setup, target)) < rows // 2 and time.monotonic() < deadline:
        time.sleep(POLL_S)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    seen = target.options["stream"], target.options["subject"]
    prefix = nats_setup.view.event_ids(*seen)
    assert 0 < len(prefix) < total, f"published {published} of {total} before the kill"
    assert prefix == list(range(len(prefix)))  # a prefix, in order
    time.sleep(1.2)  # the duplicate window passes
    outcomes = settle(sink, handles)
    assert CommitOutcome.COMMITTED in outcomes
    assert nats_setup.view.event_ids(*seen) == list(range(total))
    assert settle(sink, handles) == [CommitOutcome.ALREADY_COMMITTED] * partitions
    assert staged(nats_setup, target) == {}
    assert list_in_doubt(sink, NAMESPACE) == []


def test_the_server_killed_with_batches_pre_committed_then_restarted_commits_every_row_once(
        nats_setup: NatsSetup, target: Target) -> None:
    sink = sink_of(target)
    first, second = batch(sink, 2, 50), [prepare(sink, orders(100, 30), batch=1)]
    nats_setup.kill_server()
    nats_setup.start_server()
    assert [h.txn_id for h in list_in_doubt(sink, NAMESPACE)] == \
        [h.txn_id for h in (*first, *second)]
    assert settle(sink, first) == [CommitOutcome.COMMITTED] * 2
    nats_setup.kill_server()
    nats_setup.start_server()
    assert settle(sink, first) == [CommitOutcome.ALREADY_COMMITTED] * 2
    assert settle(sink, second) == [CommitOutcome.COMMITTED]
    assert target.visible() == list(range(130))
    assert staged(nats_setup, target) == {}


@pytest.mark.parametrize(("config", "refused"), [
    ({"retention": "workqueue"}, r"retention=workqueue.*Fix: write into a stream with "
                                 r"retention=limits"),
    ({"retention": "interest"}, r"retention=interest"),
    ({"max_age": 3600.0}, r"max_age=3600s, shorter than the recovery horizon "
                          r"recovery_horizon_s=604800s.*Fix: raise the stream's max_age"),
    ({"max_msgs": 1000}, r"max_msgs=1000 \(discard old\).*Fix: remove the limit"),
    ({"max_msgs_per_subject": 10}, r"max_msgs_per_subject=10"),
])
def test_the_preflight_refuses_a_stream_that_may_drop_the_subjects_last_message(
        nats_setup: NatsSetup, config: dict[str, Any], refused: str) -> None:
    target = nats_setup.new_target(stream_config=config)
    with pytest.raises(ConfigurationError, match=refused):
        JetStreamSink(**target.options).check_schema(ORDER_COLUMNS)


def test_a_max_age_within_the_recovery_horizon_passes(nats_setup: NatsSetup) -> None:
    target = nats_setup.new_target(stream_config={"max_age": 3600.0})
    JetStreamSink(**target.options, recovery_horizon_s=1800).check_schema(ORDER_COLUMNS)


def test_the_preflight_refuses_a_subject_no_stream_captures(nats_setup: NatsSetup,
                                                            target: Target) -> None:
    with pytest.raises(ConfigurationError, match=r"captured by no stream.*Fix: create the "):
        JetStreamSink(**{**target.options, "subject": "nobody.captures.this"}).check_schema(
            ORDER_COLUMNS)


def test_abort_leaves_nothing_staged(nats_setup: NatsSetup, target: Target) -> None:
    sink = sink_of(target)
    handles = batch(sink, 2, 20)
    assert len(staged(nats_setup, target)) == 2
    assert [abort(sink, handle) for handle in handles] == [AbortOutcome.ABORTED] * 2
    assert staged(nats_setup, target) == {}
    assert list_in_doubt(sink, NAMESPACE) == []
    assert target.visible() == []


def test_tls_asked_of_a_plain_server_is_refused_never_plain_text(target: Target) -> None:
    with pytest.raises(ConfigurationError, match=r"does not offer TLS.*Fix: "):
        JetStreamSink(**{**target.options, "tls": "require"}).check_schema(ORDER_COLUMNS)


def test_the_pickled_sink_holds_no_password(target: Target, tmp_path: Path) -> None:
    secret = "s3cret-" + uuid.uuid4().hex  # the server takes any user: it has no accounts
    (tmp_path / "password").write_text(secret)
    sink = sink_of(target, user="orders", password=Secret(file=str(tmp_path / "password")))
    committed_through_its_pickled_copy(sink, secret, orders(0, 3), sink.settings)
    assert target.visible() == [0, 1, 2]


# -- security: TLS before any credential, a least-privileged user ------------------------------

#: A refused permission stops the step this soon (the request's own timeout is 10 s).
REFUSED_AT_ONCE_S = 5.0
#: How long the fake server waits for a client's bytes (its connect, then its silence).
FAKE_SERVER_TIMEOUT_S = 2.0
#: How often the fake server looks whether it was stopped while no client comes.
FAKE_SERVER_POLL_S = 0.02
#: A fake server's INFO: authentication asked, TLS not required (nor offered).
PLAIN_INFO = (b'INFO {"server_id":"FAKE","version":"2.9.10","proto":1,"headers":true,'
              b'"max_payload":1048576,"auth_required":true}\r\n')


class PlainTextServer:
    """A fake NATS server on loopback that takes no TLS: it sends :data:`PLAIN_INFO` to each
    client and records every byte the client sends until it closes or falls silent."""

    def __init__(self) -> None:
        self.listener = socket.create_server((HOST, 0))
        self.listener.settimeout(FAKE_SERVER_POLL_S)
        self.url = f"nats://{HOST}:{self.listener.getsockname()[1]}"
        self.received = bytearray()
        self.clients = 0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.clients += 1
            with client:
                client.settimeout(FAKE_SERVER_TIMEOUT_S)
                client.sendall(PLAIN_INFO)
                while data := _received(client):
                    self.received += data

    def close(self) -> bytes:
        """Stop; everything the clients sent."""
        self._stopped.set()
        self._thread.join()
        self.listener.close()
        return bytes(self.received)


def _received(client: socket.socket) -> bytes:
    """The client's next bytes; none once it closed or fell silent."""
    try:
        return client.recv(4096)
    except OSError:
        return b""


@pytest.fixture
def plain_text_servers() -> Iterator[list[PlainTextServer]]:
    servers = [PlainTextServer(), PlainTextServer()]
    yield servers
    for server in servers:
        server.close()


@pytest.mark.parametrize("tls", ["verify", "require"])
def test_no_credential_is_sent_to_a_server_that_does_not_require_tls(
        plain_text_servers: list[PlainTextServer], tls: TlsMode) -> None:
    """The refusal comes before CONNECT: the servers receive nothing at all, and the
    ConfigurationError (not nats-py's NoServersError) reaches the caller."""
    secret = "s3cret-" + uuid.uuid4().hex
    sink = JetStreamSink([server.url for server in plain_text_servers], stream="ORDERS",
                         subject="orders.live", user="orders", password=secret, tls=tls,
                         connect_timeout_s=FAKE_SERVER_TIMEOUT_S)
    with pytest.raises(ConfigurationError, match=r"does not offer TLS.*nothing was sent.*"
                                                 r"Fix: turn TLS on in nats-server"):
        sink.check_schema(ORDER_COLUMNS)
    sent = [server.close() for server in plain_text_servers]
    assert sum(server.clients for server in plain_text_servers) == 1  # refused at the first
    assert sent == [b"", b""]  # no CONNECT, no password: not a byte


def test_the_fake_server_does_record_a_plain_text_connect(
        plain_text_servers: list[PlainTextServer]) -> None:
    """The counter-proof: with tls='off' the same server receives CONNECT and the password."""
    secret = "s3cret-" + uuid.uuid4().hex
    server = plain_text_servers[0]
    sink = JetStreamSink(server.url, stream="ORDERS", subject="orders.live", user="orders",
                         password=secret, tls="off", connect_timeout_s=0.5)
    with pytest.raises(RetryableError):  # it never answers the PING
        sink.check_schema(ORDER_COLUMNS)
    sent = server.close()
    assert sent.startswith(b"CONNECT ")
    assert secret.encode() in sent


def test_over_verified_tls_as_a_least_privileged_user_with_a_rotated_password(
        secured_nats: NatsServer, nats_secured_setup: SecuredNatsSetup) -> None:
    """Each phase opens a connection of its own and reads the password then: the rotated
    password is used by the next batch, the old one is refused."""
    target = nats_secured_setup.new_target()
    user = target.options["user"]
    password_file = Path(target.options["password_file"])
    assert password_file.stat().st_mode & 0o777 == 0o600
    first = password_file.read_text()
    sink = sink_with_password_file(**target.options)
    assert isinstance(sink, JetStreamSink)
    sink.check_schema(ORDER_COLUMNS)
    assert "tls" not in target.options  # verified, the default, with the run's CA
    committed_through_its_pickled_copy(sink, first, orders(0, 2), sink.settings)
    second = "rotated-" + uuid.uuid4().hex
    secured_nats.set_password(user, second)  # reloaded by SIGHUP
    with pytest.raises(ConfigurationError, match=r"Authorization Violation.*Fix: check user= "
                                                 r"and password="):
        prepare(sink, orders(2, 2), batch=1)  # the file still holds the old one
    password_file.write_text(second)
    assert commit(sink, prepare(sink, orders(2, 2), batch=1)) is CommitOutcome.COMMITTED
    assert target.visible() == [0, 1, 2, 3]


def test_a_certificate_of_another_ca_is_refused_naming_ca_bundle(
        nats_secured_setup: SecuredNatsSetup, tmp_path: Path) -> None:
    target = nats_secured_setup.new_target()
    stranger = CertificateAuthority(tmp_path / "other-ca", name="another CA")
    sink = sink_with_password_file(**{**target.options, "ca_bundle": str(stranger.cafile)})
    with pytest.raises(ConfigurationError, match=r"certificate.*Fix: check tls=, ca_bundle="):
        sink.check_schema(ORDER_COLUMNS)
    assert nats_secured_setup.view.subjects(target.options["staging_stream"], ">") == {}


def test_a_wrong_password_is_refused_naming_user_and_password(
        nats_secured_setup: SecuredNatsSetup, tmp_path: Path) -> None:
    target = nats_secured_setup.new_target()
    (tmp_path / "wrong").write_text("not-" + uuid.uuid4().hex)
    sink = sink_with_password_file(**{**target.options,
                                      "password_file": str(tmp_path / "wrong")})
    with pytest.raises(ConfigurationError, match=r"Authorization Violation.*Fix: check user= "
                                                 r"and password="):
        sink.check_schema(ORDER_COLUMNS)


def test_a_missing_permission_is_refused_at_once_naming_the_permission_to_grant(
        nats_secured_setup: SecuredNatsSetup) -> None:
    """A user that may not publish to the staging subjects: the server's refusal (which
    nats-py only reports) stops the write at once, as a ConfigurationError naming what to
    grant; nothing is staged."""
    target = nats_secured_setup.new_target()
    stream, subject = target.options["stream"], target.options["subject"]
    needed = SecuredNatsSetup.sink_permissions(target.options)
    stage_filter = f"twophase.stage.{stream}.*"
    user, password_file = nats_secured_setup.new_user(needed.without(stage_filter))
    sink = sink_with_password_file(**{**target.options, "user": user.name,
                                      "password_file": str(password_file)})
    sink.check_schema(ORDER_COLUMNS)  # the preflight needs no publish to twophase.>
    started = time.monotonic()
    refused = (rf"refused the sink's user to publish to twophase\.stage\.{stream.lower()}\..*"
               rf"Fix: grant the sink's user publish on {re.escape(stage_filter)} .*"
               rf"everything the sink needs: publish on {re.escape(subject)}, ")
    with pytest.raises(ConfigurationError, match=refused):
        prepare(sink, orders(0, 3))
    assert time.monotonic() - started < REFUSED_AT_ONCE_S  # not after the request's timeout
    assert staged(nats_secured_setup, target) == {}


def test_the_servers_words_are_classified() -> None:
    import nats.errors  # noqa: PLC0415

    wrong_password = classify(nats.errors.Error("nats: 'Authorization Violation'"), "x")
    assert isinstance(wrong_password, ConfigurationError)
    assert "check user= and password=" in str(wrong_password)
    denied = classify(nats.errors.Error('nats: permissions violation for publish to "a.b"'), "x")
    assert isinstance(denied, ConfigurationError)
    assert isinstance(classify(nats.errors.Error("nats: something else"), "x"), FatalError)


@pytest.mark.parametrize(("pattern", "subject", "expected"), [
    ("a.b", "a.b", True), ("a.*", "a.b", True), ("a.*", "a.b.c", False), ("a.>", "a.b.c", True),
    ("a.>", "a", False), ("$JS.FC.S.>", "$JS.FC.S.x.y", True), ("a.b", "a.c", False),
    ("a.*.c", "a.b.c", True), ("*", "a", True), (">", "a.b", True)])
def test_subject_patterns_match_as_nats_server_does(pattern: str, subject: str,
                                                    expected: bool) -> None:
    assert matches(pattern, subject) is expected


# -- the server killed mid-chain ----------------------------------------------------------------

KILLED_PARTITIONS, KILLED_ROWS = 3, 5_000
#: How long the test waits for the chain to begin before it gives up.
CHAIN_START_TIMEOUT_S = 60.0


def test_the_server_killed_mid_chain_then_restarted_commits_every_row_once_in_order(
        nats_setup: NatsSetup) -> None:
    target = nats_setup.new_target()
    sink = JetStreamSink(**target.options)
    sink.check_schema(ORDER_COLUMNS)
    handles = tuple(prepare(sink, orders(KILLED_ROWS * part, KILLED_ROWS), partition=part)
                    for part in range(KILLED_PARTITIONS))
    stream, subject = target.options["stream"], target.options["subject"]
    commit = SettlingInAThread(sink, handles)
    deadline = time.monotonic() + CHAIN_START_TIMEOUT_S
    while not nats_setup.view.subjects(stream, subject) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    nats_setup.kill_server()
    commit.thread.join()
    nats_setup.start_server()
    prefix = nats_setup.view.event_ids(stream, subject)
    total = KILLED_PARTITIONS * KILLED_ROWS
    assert commit.failed and 0 < len(prefix) < total, (len(commit.failed), len(prefix))
    assert prefix == list(range(len(prefix)))  # a prefix, in order
    assert CommitOutcome.COMMITTED in settle(sink, handles)
    assert nats_setup.view.event_ids(stream, subject) == list(range(total))
    assert list_in_doubt(sink, NAMESPACE) == []
    assert nats_setup.in_doubt(target) == []
