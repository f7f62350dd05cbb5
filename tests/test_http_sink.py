"""sinks.http against the reference receiver running as a separate process on loopback: the
shared contract suite, the receiver's answers (400/401/409/413/422, replays, expiry), and the
sink's reaction to each, with the receiver SIGKILLed and restarted between requests."""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import sqlite3
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import requests

from setups.http import s3_staging
from setups.servers.http_receiver import (
    SIGNING_SECRET,
    TOKEN,
    ReceiverProcess,
    new_path,
)
from setups.servers.moto import MotoServer
from sinks.http import HttpSink
from sinks.http.committer import HttpCommitter
from sinks.http.encoding import encode_record
from sinks.http.protocol import IDEMPOTENCY_KEY, REPLAYED, SIGNATURE, WELL_KNOWN, key_header
from sinks.http.signing import refusal, sign
from tests.on_setup import HttpTarget
from twophase import (
    AbortOutcome,
    Column,
    CommitOutcome,
    ConfigurationError,
    FatalError,
    RetryableError,
    TransactionLostError,
)
from twophase.testing.contract import NAMESPACE, SinkContract, commit, context, orders, prepare

Receivers = Callable[..., ReceiverProcess]
JSON_TYPE = "application/json"


#: The tests' sinks: small requests, quick retries.
CONTRACT_OPTIONS = {"max_records_per_request": 3, "initial_backoff_s": 0.02,
                    "max_backoff_s": 0.1}


def make_sink(receiver: ReceiverProcess, path: str, staging: Path | str,
              **options: Any) -> HttpSink:
    return HttpSink(**{**receiver.sink_options(path), "staging": str(staging),
                       **CONTRACT_OPTIONS, **options})


def post(receiver: ReceiverProcess, path: str, records: Any = None, *, key: str | None = "k-1",
         body: bytes | None = None, headers: dict[str, str] | None = None,
         token: str | None = TOKEN, secret: str | None = SIGNING_SECRET,
         signed_at: float | None = None) -> requests.Response:
    """A request as any client would send it, signed unless told otherwise."""
    if body is None:
        body = json.dumps(records if records is not None else [{"event_id": 1}]).encode()
    sent = {"Content-Type": JSON_TYPE, **(headers or {})}
    if key is not None:
        sent[IDEMPOTENCY_KEY] = key_header(key)
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    if secret is not None:
        sent[SIGNATURE] = sign(secret.encode(), body,
                               time.time() if signed_at is None else signed_at)
    return requests.post(receiver.url(path), data=body, headers=sent, timeout=30)


# -- the contract suite -------------------------------------------------------------------------

class TestHttpJsonContract(HttpTarget, SinkContract):
    has_schema = False  # a request body takes any columns
    target_options: ClassVar[Mapping[str, Any]] = {**CONTRACT_OPTIONS, "encoding": "json",
                                                "compression": None}


class TestHttpJsonLinesGzipContract(TestHttpJsonContract):
    target_options: ClassVar[Mapping[str, Any]] = {**CONTRACT_OPTIONS, "encoding": "jsonl",
                                                "compression": "gzip"}


class TestHttpS3StagingContract(TestHttpJsonLinesGzipContract):
    """The contract once more, staging on S3 (moto_server) instead of a directory."""

    @pytest.fixture
    def target_overrides(self, moto_server: MotoServer, s3_bucket: str) -> Mapping[str, Any]:
        return {**self.target_options, **s3_staging(moto_server, s3_bucket)}


# -- a downstream webhook with no idempotency of its own ------------------------------------------

class Downstream:
    """A webhook in this process: counts what reaches it, can hold requests or refuse them."""

    def __init__(self) -> None:
        self.hits: list[bytes] = []
        self.arrived = threading.Event()
        self.gate = threading.Event()
        self.gate.set()
        self.answers: list[tuple[int, bytes]] = []  # answered first, then 200
        self.headers: dict[str, str] = {}  # sent with every answer
        downstream = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                downstream.arrived.set()
                downstream.gate.wait(30)
                status, answer = (downstream.answers.pop(0) if downstream.answers
                                  else (200, b'{"ok": true}'))
                if status < 300:
                    downstream.hits.append(body)
                self.send_response(status)
                self.send_header("Content-Type", JSON_TYPE)
                self.send_header("Content-Length", str(len(answer)))
                for name, value in downstream.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/webhook"

    def records(self) -> list[int]:
        return sorted(record["event_id"] for body in self.hits for record in json.loads(body))

    def close(self) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def downstream() -> Iterator[Downstream]:
    webhook = Downstream()
    yield webhook
    webhook.close()


@pytest.fixture
def forwarding(private_receiver: Receivers, downstream: Downstream) -> ReceiverProcess:
    return private_receiver(options=["--forward", downstream.url])


# -- the receiver, spoken to directly --------------------------------------------------------------

def test_a_first_request_is_stored_and_its_retries_replayed(http_receiver: ReceiverProcess,
                                                            receiver_path: str) -> None:
    first = post(http_receiver, receiver_path, [{"event_id": 1}, {"event_id": 2}])
    assert (first.status_code, first.json(), first.headers.get(REPLAYED)) == (
        200, {"accepted": 2}, None)
    for _ in range(2):
        again = post(http_receiver, receiver_path, [{"event_id": 1}, {"event_id": 2}])
        assert (again.status_code, again.json(), again.headers[REPLAYED]) == (
            200, {"accepted": 2}, "true")
    assert http_receiver.event_ids(receiver_path) == [1, 2]


def test_the_policy_is_published(http_receiver: ReceiverProcess) -> None:
    policy = requests.get(http_receiver.url(WELL_KNOWN), timeout=10).json()
    assert policy["key_expiry_s"] == 86400 and policy["max_body_bytes"] > 0
    assert policy["signature_header"] == SIGNATURE and policy["bearer_token"] is True


def test_a_request_without_a_key_is_400_and_stores_nothing(http_receiver: ReceiverProcess,
                                                           receiver_path: str) -> None:
    for key in (None, "", "bad key with spaces"):
        refused = post(http_receiver, receiver_path, key=key)
        assert refused.status_code == 400 and IDEMPOTENCY_KEY in refused.json()["error"]
    assert http_receiver.records(receiver_path) == []


@pytest.mark.parametrize(("token", "secret", "signed_ago"), [
    (None, SIGNING_SECRET, 0), ("wrong-token", SIGNING_SECRET, 0),  # the bearer token
    (TOKEN, None, 0), (TOKEN, "forged-secret", 0),  # no signature, a forged one
    (TOKEN, SIGNING_SECRET, 301), (TOKEN, SIGNING_SECRET, -301),  # replayed outside the window
])
def test_a_missing_forged_or_out_of_window_credential_is_401_and_stores_nothing(
        http_receiver: ReceiverProcess, token: str | None, secret: str | None,
        signed_ago: float) -> None:
    path, key = new_path(), f"k-auth-{uuid.uuid4()}"
    refused = post(http_receiver, path, key=key, token=token, secret=secret,
                   signed_at=time.time() - signed_ago)
    assert refused.status_code == 401 and refused.headers["WWW-Authenticate"] == "Bearer"
    assert http_receiver.records(path) == [] and key not in http_receiver.key_states()
    assert post(http_receiver, path, key=key).status_code == 200  # nothing was stored for it


def test_a_signature_over_another_body_is_401(http_receiver: ReceiverProcess,
                                              receiver_path: str) -> None:
    body = b'[{"event_id": 1}]'
    headers = {SIGNATURE: sign(SIGNING_SECRET.encode(), b'[{"event_id": 2}]', time.time())}
    assert post(http_receiver, receiver_path, body=body, headers=headers,
                secret=None).status_code == 401
    assert http_receiver.records(receiver_path) == []


def test_a_key_reused_with_another_payload_is_422_with_both_fingerprints(
        http_receiver: ReceiverProcess, receiver_path: str) -> None:
    assert post(http_receiver, receiver_path, [{"event_id": 1}]).status_code == 200
    refused = post(http_receiver, receiver_path, [{"event_id": 9}])
    answer = refused.json()
    assert refused.status_code == 422
    assert answer["stored_fingerprint"] != answer["request_fingerprint"]
    assert answer["stored_fingerprint"] in answer["error"]
    assert http_receiver.event_ids(receiver_path) == [1]


def test_gzip_and_json_lines_bodies_are_read_and_bad_ones_refused(
        http_receiver: ReceiverProcess, receiver_path: str) -> None:
    lines = b'{"event_id": 1}\n{"event_id": 2}\n'
    assert post(http_receiver, receiver_path, key="gz", body=gzip.compress(lines), headers={
        "Content-Type": "application/x-ndjson", "Content-Encoding": "gzip"}).status_code == 200
    for key, body, headers, status in [
        ("bad-json", b"[{", {}, 400), ("not-objects", b"[1, 2]", {}, 400),
        ("bad-gzip", b"xx", {"Content-Encoding": "gzip"}, 400),
        ("br", b"[]", {"Content-Encoding": "br"}, 415),
        ("xml", b"<a/>", {"Content-Type": "application/xml"}, 415)]:
        assert post(http_receiver, receiver_path, key=key, body=body,
                    headers=headers).status_code == status, key
    assert http_receiver.event_ids(receiver_path) == [1, 2]
    stored = http_receiver.key_states()
    assert "gz" in stored and "bad-json" not in stored


def test_a_body_over_the_limit_is_413_and_stores_nothing(private_receiver: Receivers) -> None:
    receiver = private_receiver(options=["--max-body", "1000"])
    path = new_path()
    big = [{"event_id": i, "pad": "x" * 50} for i in range(40)]
    assert post(receiver, path, big).status_code == 413
    bomb = gzip.compress(json.dumps([{"pad": "x" * 20_000}]).encode())  # < 1000 bytes sent
    assert len(bomb) < 1000
    assert post(receiver, path, key="bomb", body=bomb,
                headers={"Content-Encoding": "gzip"}).status_code == 413
    assert receiver.records() == [] and receiver.key_states() == {}


def test_an_expired_key_is_a_new_request(private_receiver: Receivers) -> None:
    receiver = private_receiver(options=["--key-expiry", "1"])
    path = new_path()
    assert requests.get(receiver.url(WELL_KNOWN), timeout=10).json()["key_expiry_s"] == 1
    assert post(receiver, path).status_code == 200
    assert post(receiver, path).headers[REPLAYED] == "true"
    time.sleep(1.2)
    again = post(receiver, path)
    assert (again.status_code, again.headers.get(REPLAYED)) == (200, None)
    assert receiver.event_ids(path) == [1, 1]  # what the sink's expiry check prevents


def test_a_concurrent_duplicate_in_flight_is_409_and_executes_once(
        forwarding: ReceiverProcess, downstream: Downstream) -> None:
    path = new_path()
    downstream.gate.clear()
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(post, forwarding, path, [{"event_id": 7}])
        assert downstream.arrived.wait(10)
        duplicate = post(forwarding, path, [{"event_id": 7}])
        assert (duplicate.status_code, duplicate.headers["Retry-After"]) == (409, "1")
        downstream.gate.set()
        assert first.result().status_code == 200
    assert post(forwarding, path, [{"event_id": 7}]).headers[REPLAYED] == "true"
    assert downstream.records() == [7] and forwarding.event_ids(path) == [7]


def test_a_key_left_in_flight_by_a_killed_receiver_is_released_at_its_restart(
        private_receiver: Receivers) -> None:
    receiver = private_receiver()
    path = new_path()
    assert post(receiver, path, key="done").status_code == 200
    receiver.kill()
    with contextlib.closing(sqlite3.connect(receiver.db)) as db, db:  # as a crash leaves it
        db.execute("INSERT INTO idempotency_keys (scope, key, fingerprint, state, owner, "
                   "created) VALUES (?, 'stuck', 'f', 'in-flight', 'dead-process', ?)",
                   (path, time.time()))
    receiver.restart()
    assert "released 1 key(s) left in flight" in receiver.log.read_text()
    assert post(receiver, path, key="stuck").status_code == 200  # executed now, once
    assert post(receiver, path, key="done").headers[REPLAYED] == "true"
    assert receiver.event_ids(path) == [1, 1]


def test_concurrent_duplicates_execute_once(forwarding: ReceiverProcess,
                                            downstream: Downstream) -> None:
    path = new_path()
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: post(forwarding, path, [{"event_id": 3}]).status_code,
                                range(16)))
    assert set(answers) <= {200, 409} and 200 in answers
    assert downstream.records() == [3]


# -- the sink ------------------------------------------------------------------------------------

def test_a_slice_is_split_into_requests_each_with_its_own_stable_key(
        http_receiver: ReceiverProcess, receiver_path: str, tmp_path: Path) -> None:
    sink = make_sink(http_receiver, receiver_path, tmp_path, max_records_per_request=1000,
                     max_bytes_per_request=1000)
    handle = prepare(sink, orders(0, 40))
    again = prepare(make_sink(http_receiver, receiver_path, tmp_path / "other",
                              max_records_per_request=1000, max_bytes_per_request=1000),
                    orders(0, 40))
    assert handle.data["requests"] == len(handle.data["keys"]) >= 4
    assert handle.data["keys"] == again.data["keys"]  # derived from the transaction id
    assert len(set(handle.data["keys"])) == len(handle.data["keys"])
    assert commit(sink, handle) is CommitOutcome.COMMITTED
    assert http_receiver.event_ids(receiver_path) == list(range(40))


def test_staging_is_owner_only_and_gone_after_commit(http_receiver: ReceiverProcess,
                                                     receiver_path: str,
                                                     tmp_path: Path) -> None:
    os.umask(0o022)
    sink = make_sink(http_receiver, receiver_path, tmp_path / "staging")
    handle = prepare(sink, orders(0, 7))
    staged = Path(handle.data["staged"])
    assert stat.S_IMODE(staged.stat().st_mode) == 0o700
    assert {stat.S_IMODE(f.stat().st_mode) for f in staged.iterdir()} == {0o600}
    assert len(list(staged.glob("*.body"))) == 3
    assert commit(sink, handle) is CommitOutcome.COMMITTED
    assert not staged.exists()


def test_a_task_that_never_pre_committed_is_listed_and_the_sweep_removes_it(
        http_receiver: ReceiverProcess, receiver_path: str, tmp_path: Path) -> None:
    sink = make_sink(http_receiver, receiver_path, tmp_path)
    txn = sink.begin_transaction(context(batch=3))
    sink.write(txn, orders(0, 10))  # three full requests written, no pre-commit
    listed = sink.list_in_doubt(NAMESPACE)
    assert [h.txn_id for h in listed] == [txn.txn_id]
    assert sink.abort(listed[0]) is AbortOutcome.ABORTED
    assert sink.list_in_doubt(NAMESPACE) == [] and list(tmp_path.iterdir()) == []
    assert http_receiver.records(receiver_path) == []


def test_a_401_is_a_configuration_error_and_after_the_fix_everything_arrives(
        http_receiver: ReceiverProcess, receiver_path: str, tmp_path: Path) -> None:
    handle = prepare(make_sink(http_receiver, receiver_path, tmp_path), orders(0, 5))
    for wrong in ({"token": "wrong"}, {"signing_secret": "wrong"}):
        sink = make_sink(http_receiver, receiver_path, tmp_path, **wrong)
        with pytest.raises(ConfigurationError,
                           match=r"POST http://127.*/hooks/.* 401 .*Fix: fix token= / "
                           r"signing_secret="):
            commit(sink, handle)
        assert http_receiver.records(receiver_path) == []
    fixed = make_sink(http_receiver, receiver_path, tmp_path)
    assert commit(fixed, handle) is CommitOutcome.COMMITTED
    assert http_receiver.event_ids(receiver_path) == [0, 1, 2, 3, 4]


def test_an_unreachable_url_is_retryable_naming_it_and_after_the_fix_everything_arrives(
        http_receiver: ReceiverProcess, receiver_path: str, tmp_path: Path) -> None:
    options = {**http_receiver.sink_options(receiver_path), "url": f"http://127.0.0.1:9"
               f"{receiver_path}"}
    sink = HttpSink(**options, staging=str(tmp_path), max_attempts=2,
                    initial_backoff_s=0.01)
    handle = prepare(sink, orders(0, 4))
    with pytest.raises(RetryableError, match=r"127\.0\.0\.1:9/hooks.*ConnectionError.*"
                       r"Fix: .*check url="):
        commit(sink, handle)
    assert http_receiver.records(receiver_path) == []
    assert commit(make_sink(http_receiver, receiver_path, tmp_path),
                  handle) is CommitOutcome.COMMITTED
    assert http_receiver.event_ids(receiver_path) == [0, 1, 2, 3]


def test_a_body_over_the_receivers_limit_fails_with_the_fix_and_arrives_after_a_restart(
        private_receiver: Receivers, tmp_path: Path) -> None:
    receiver = private_receiver(options=["--max-body", "200"])
    path = new_path()
    sink = make_sink(receiver, path, tmp_path / "staging", max_records_per_request=10)
    handle = prepare(sink, orders(0, 10))
    with pytest.raises(ConfigurationError, match=r"413 .*limit of 200 bytes.*Fix: lower "
                       r"max_bytes_per_request="):
        commit(sink, handle)
    assert receiver.records() == []
    receiver.restart(options=["--max-body", "100000"])
    assert commit(sink, handle) is CommitOutcome.COMMITTED
    assert receiver.event_ids(path) == list(range(10))


def test_a_payload_the_downstream_rejects_is_fatal_with_its_words_and_arrives_after_the_fix(
        forwarding: ReceiverProcess, downstream: Downstream, tmp_path: Path) -> None:
    path = new_path()
    sink = make_sink(forwarding, path, tmp_path)
    handle = prepare(sink, orders(0, 3))
    downstream.answers = [(400, b'{"error": "status \'paid\' is not allowed here"}')]
    with pytest.raises(FatalError, match=r"400 Bad Request: status 'paid' is not allowed.*"
                       r"Fix: the receiver refused the payload"):
        commit(sink, handle)
    assert downstream.hits == [] and forwarding.records() == []
    assert commit(sink, handle) is CommitOutcome.COMMITTED  # the downstream accepts it now
    assert downstream.records() == [0, 1, 2] == forwarding.event_ids(path)


def test_429_and_5xx_answers_are_retried_with_backoff_and_delivered_once(
        forwarding: ReceiverProcess, downstream: Downstream, tmp_path: Path) -> None:
    path = new_path()
    sink = make_sink(forwarding, path, tmp_path)
    downstream.answers = [(503, b"{}"), (429, b'{"error": "slow down"}'), (500, b"{}")]
    assert commit(sink, prepare(sink, orders(0, 3))) is CommitOutcome.COMMITTED
    assert downstream.records() == [0, 1, 2]
    downstream.answers = [(503, b"{}")] * 10
    with pytest.raises(RetryableError, match=r"502 .*downstream webhook answered 503.*"
                       r"Fix: retried automatically"):
        commit(sink, prepare(sink, orders(3, 3), batch=1))
    assert downstream.records() == [0, 1, 2]


def test_a_redirect_is_never_followed(http_receiver: ReceiverProcess, receiver_path: str,
                                      downstream: Downstream, tmp_path: Path) -> None:
    sink = HttpSink(downstream.url, staging=str(tmp_path), token=TOKEN)
    downstream.answers = [(307, b"")]
    downstream.headers = {"Location": http_receiver.url(receiver_path)}
    with pytest.raises(ConfigurationError, match=r"307 .*redirected to http://127.*"
                       r"Fix: fix url="):
        commit(sink, prepare(sink, orders(0, 2)))
    assert downstream.hits == [] and http_receiver.records(receiver_path) == []


def test_a_409_is_waited_out_and_each_request_executes_once(
        forwarding: ReceiverProcess, downstream: Downstream, tmp_path: Path) -> None:
    path = new_path()
    sink = make_sink(forwarding, path, tmp_path, max_records_per_request=10,
                     initial_backoff_s=0.3, max_backoff_s=0.5)
    handle = prepare(sink, orders(0, 3))
    downstream.gate.clear()
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(commit, sink, handle)
        assert downstream.arrived.wait(10)
        second = pool.submit(commit, sink, handle)  # 409 while the first is in flight
        time.sleep(0.5)
        downstream.gate.set()
        outcomes = {first.result(), second.result()}
    assert outcomes <= {CommitOutcome.COMMITTED, CommitOutcome.ALREADY_COMMITTED}
    assert downstream.records() == [0, 1, 2] == forwarding.event_ids(path)
    assert "-> 409" in forwarding.log.read_text()


def test_a_key_used_with_another_payload_is_fatal_with_both_fingerprints(
        http_receiver: ReceiverProcess, receiver_path: str, tmp_path: Path) -> None:
    first = make_sink(http_receiver, receiver_path, tmp_path / "job-a")
    assert commit(first, prepare(first, orders(0, 2))) is CommitOutcome.COMMITTED
    second = make_sink(http_receiver, receiver_path, tmp_path / "job-b")  # shares the ids
    with pytest.raises(FatalError, match=r"422 .*another request \(fingerprint [0-9a-f]{64}; "
                       r"this one: [0-9a-f]{64}\).*this request's fingerprint: [0-9a-f]{64}.*"
                       r"Fix: .*own staging="):
        commit(second, prepare(second, orders(5, 2)))
    assert http_receiver.event_ids(receiver_path) == [0, 1]


def test_a_handle_older_than_the_key_expiry_is_lost_and_nothing_is_sent(
        http_receiver: ReceiverProcess, receiver_path: str, tmp_path: Path) -> None:
    sink = make_sink(http_receiver, receiver_path, tmp_path, key_expiry_s=1.0)
    handle = prepare(sink, orders(0, 3))
    time.sleep(1.0)
    with pytest.raises(TransactionLostError, match=r"staged \d+s ago.*keeps idempotency keys "
                       r"for 1s.*execute it twice.*Fix: "):
        commit(sink, handle)
    assert http_receiver.records(receiver_path) == []
    assert sink.abort(handle) is AbortOutcome.ABORTED


def test_a_key_expiry_longer_than_the_receiver_publishes_is_refused(
        private_receiver: Receivers, tmp_path: Path) -> None:
    receiver = private_receiver(options=["--key-expiry", "3600"])
    columns = [Column("event_id", "bigint")]
    with pytest.raises(ConfigurationError, match=r"keeps idempotency keys for 3600.*"
                       r"Fix: pass key_expiry_s=3600"):
        make_sink(receiver, "/x", tmp_path).check_schema(columns)
    make_sink(receiver, "/x", tmp_path, key_expiry_s=3600).check_schema(columns)


def test_a_receiver_killed_and_restarted_between_requests_delivers_each_record_once(
        private_receiver: Receivers, tmp_path: Path) -> None:
    receiver = private_receiver()
    path = new_path()
    sink = make_sink(receiver, path, tmp_path)
    handle = prepare(sink, orders(0, 8))  # three requests
    manifest = sink.staging.manifest(handle.txn_id)
    assert manifest is not None and len(manifest.requests) == 3
    committer = sink.committer()
    assert committer.send(handle.txn_id, manifest, manifest.requests[0]) is False
    receiver.kill()
    receiver.restart()
    assert commit(sink, handle) is CommitOutcome.COMMITTED  # the first one is replayed
    assert receiver.event_ids(path) == list(range(8))
    # every request sent, the driver killed before its commit record, the receiver killed too:
    # the recovery's commit is proven by the replays alone
    again = prepare(sink, orders(8, 8), batch=1)
    manifest = sink.staging.manifest(again.txn_id)
    assert manifest is not None
    assert [committer.send(again.txn_id, manifest, r) for r in manifest.requests] == [False] * 3
    receiver.kill()
    receiver.restart()
    assert commit(sink, again) is CommitOutcome.ALREADY_COMMITTED
    assert receiver.event_ids(path) == list(range(16))


def test_a_receiver_down_during_commit_is_retryable_and_after_its_restart_all_arrive(
        private_receiver: Receivers, tmp_path: Path) -> None:
    receiver = private_receiver()
    path = new_path()
    sink = make_sink(receiver, path, tmp_path, max_attempts=2)
    handles = [prepare(sink, orders(10 * p, 4), partition=p) for p in range(3)]
    assert commit(sink, handles[0]) is CommitOutcome.COMMITTED
    receiver.kill()
    with pytest.raises(RetryableError, match="ConnectionError"):
        commit(sink, handles[1])
    receiver.restart()
    assert [commit(sink, h) for h in handles] == [CommitOutcome.ALREADY_COMMITTED,
                                                  CommitOutcome.COMMITTED,
                                                  CommitOutcome.COMMITTED]
    assert receiver.event_ids(path) == [0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23]


@pytest.fixture
def certificate(tmp_path: Path) -> Path:
    cert = tmp_path / "tls" / "receiver.pem"
    cert.parent.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(cert.with_suffix(".key")), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert


def test_tls_is_verified_by_default(private_receiver: Receivers, certificate: Path,
                                    tmp_path: Path) -> None:
    receiver = private_receiver(certfile=certificate)
    path = new_path()
    untrusting = make_sink(receiver, path, tmp_path, max_attempts=1)
    assert untrusting.settings.url.startswith("https://")
    handle = prepare(untrusting, orders(0, 2))
    with pytest.raises(ConfigurationError, match=r"SSLError.*Fix: .*ca_bundle="):
        commit(untrusting, handle)
    trusting = make_sink(receiver, path, tmp_path, ca_bundle=str(certificate))
    assert commit(trusting, handle) is CommitOutcome.COMMITTED
    assert receiver.event_ids(path) == [0, 1]


def test_secrets_and_bodies_stay_out_of_repr_messages_and_logs(
        http_receiver: ReceiverProcess, receiver_path: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    sink = make_sink(http_receiver, receiver_path, tmp_path, token="wrong-secret-token",
                     headers={"X-Api-Key": "header-secret"})
    with pytest.raises(ConfigurationError) as refused:
        commit(sink, prepare(sink, [(1, 2, "very-private-status", None)]))
    seen = [repr(sink), repr(sink.settings), str(refused.value), caplog.text,
            http_receiver.log.read_text()]
    for secret in ("wrong-secret-token", "header-secret", SIGNING_SECRET, TOKEN,
                   "very-private-status"):
        assert not any(secret in text for text in seen), secret


def test_values_are_encoded_as_lossless_json() -> None:
    names = ("d", "t", "ntz", "day", "b", "nan", "nested", "span")
    row = (Decimal("1.10"), datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
           datetime(2026, 1, 2, 3, 4, 5), date(2026, 1, 2), b"\x00\xff", float("nan"),
           {"k": [Decimal("2"), float("inf")]}, timedelta(seconds=90))
    assert json.loads(encode_record(names, row)) == {
        "d": "1.10", "t": "2026-01-02T03:04:05+00:00", "ntz": "2026-01-02T03:04:05",
        "day": "2026-01-02", "b": "AP8=", "nan": None, "nested": {"k": ["2", None]},
        "span": 90.0}


def test_a_signature_checks_timestamp_and_body() -> None:
    secret, body, now = b"s", b"body", 1_000_000.0
    header = sign(secret, body, now)
    assert refusal(secret, header, body, now) is None
    assert "does not match" in (refusal(secret, header, b"other", now) or "")
    assert "does not match" in (refusal(b"x", header, body, now) or "")
    assert "tolerance" in (refusal(secret, header, body, now + 301) or "")
    assert "malformed" in (refusal(secret, "v1=abc", body, now) or "")


def test_options_are_checked_before_anything_is_written(tmp_path: Path) -> None:
    bad: dict[str, Any]
    for bad in ({"url": "ftp://x/y"}, {"method": "GET"}, {"encoding": "xml"},
                {"max_records_per_request": 0}, {"key_expiry_s": 0}):
        with pytest.raises(ConfigurationError, match="Fix: "):
            options: dict[str, Any] = {"url": "http://127.0.0.1/x",
                                       "staging": str(tmp_path), **bad}
            HttpSink(**options)
    assert list(tmp_path.iterdir()) == []
    assert isinstance(HttpSink("http://h/orders", staging=str(tmp_path)).committer(),
                      HttpCommitter)
    assert HttpSink("http://h/api/orders/", staging=str(tmp_path)).default_namespace() == \
        "orders"


# -- staging on S3 ---------------------------------------------------------------------------------

#: A process of its own: the sink built from argv[1] (JSON options) lists the namespace's
#: transactions in doubt, commits those of batch 0 and aborts the others.
RESOLVE_ELSEWHERE = """
import json, sys
from sinks.http import HttpSink
from twophase.testing.contract import NAMESPACE, commit
sink = HttpSink(**json.loads(sys.argv[1]))
print(json.dumps([[str(h.txn_id), h.data["requests"],
                   (commit(sink, h) if h.txn_id.batch == 0 else sink.abort(h)).name]
                  for h in sink.list_in_doubt(NAMESPACE)]))
"""

#: A process of its own that writes three full requests of one transaction, never
#: pre-commits, says so and waits to be killed.
WRITE_AND_WAIT = """
import json, sys, time
from sinks.http import HttpSink
from twophase.testing.contract import context, orders
sink = HttpSink(**json.loads(sys.argv[1]))
txn = sink.begin_transaction(context(batch=5))
sink.write(txn, orders(0, 10))
print(txn.txn_id, flush=True)
time.sleep(600)
"""


def s3_sink(receiver: ReceiverProcess, path: str, moto: MotoServer, bucket: str,
            **options: Any) -> tuple[HttpSink, dict[str, Any]]:
    """A sink staging on S3, and the JSON-able options another process builds it from."""
    given = {**receiver.sink_options(path), **s3_staging(moto, bucket),
             "max_records_per_request": 3, **options}
    return HttpSink(**given), given


def staged_keys(moto: MotoServer, bucket: str) -> list[str]:
    """What the staging holds, in S3's own view."""
    reply = moto.client().list_objects_v2(Bucket=bucket)
    return sorted(item["Key"] for item in reply.get("Contents", ()))


def run_python(script: str, options: dict[str, Any]) -> str:
    done = subprocess.run([sys.executable, "-c", script, json.dumps(options)], check=True,
                          capture_output=True, text=True, timeout=120)
    return done.stdout


def test_s3_staging_seals_with_the_manifest_written_last_and_removes_all_at_commit(
        http_receiver: ReceiverProcess, receiver_path: str, moto_server: MotoServer,
        s3_bucket: str) -> None:
    sink, _ = s3_sink(http_receiver, receiver_path, moto_server, s3_bucket)
    handle = prepare(sink, orders(0, 7))
    txn = handle.txn_id
    assert handle.data["staged"] == f"s3://{s3_bucket}/staging/{txn}.staged/"
    assert staged_keys(moto_server, s3_bucket) == [
        f"staging/{txn}.staged/{name}"
        for name in ("000000.body", "000001.body", "000002.body", "manifest.json")]
    assert commit(sink, handle) is CommitOutcome.COMMITTED
    assert staged_keys(moto_server, s3_bucket) == [f"staging/{txn}.committed"]
    assert commit(sink, handle) is CommitOutcome.ALREADY_COMMITTED
    assert http_receiver.event_ids(receiver_path) == list(range(7))
    assert sink.purge_commit_records(NAMESPACE, datetime.now(UTC) + timedelta(seconds=5)) == 1
    assert staged_keys(moto_server, s3_bucket) == []


def test_s3_staged_transactions_are_listed_committed_and_aborted_by_another_process(
        http_receiver: ReceiverProcess, receiver_path: str, moto_server: MotoServer,
        s3_bucket: str) -> None:
    sink, options = s3_sink(http_receiver, receiver_path, moto_server, s3_bucket)
    kept = prepare(sink, orders(0, 7), batch=0)
    dropped = prepare(sink, orders(7, 4), batch=1)
    resolved = json.loads(run_python(RESOLVE_ELSEWHERE, options))
    assert resolved == [[str(kept.txn_id), 3, "COMMITTED"], [str(dropped.txn_id), 2, "ABORTED"]]
    assert http_receiver.event_ids(receiver_path) == list(range(7))
    assert staged_keys(moto_server, s3_bucket) == [f"staging/{kept.txn_id}.committed"]
    assert sink.list_in_doubt(NAMESPACE) == []


def test_a_killed_writers_partial_bodies_on_s3_are_listed_and_aborted(
        http_receiver: ReceiverProcess, receiver_path: str, moto_server: MotoServer,
        s3_bucket: str) -> None:
    sink, options = s3_sink(http_receiver, receiver_path, moto_server, s3_bucket)
    writer = subprocess.Popen([sys.executable, "-c", WRITE_AND_WAIT, json.dumps(options)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None
        txn = writer.stdout.readline().strip()
    finally:
        writer.kill()  # SIGKILL: no cleanup of any kind
        writer.wait()
    assert staged_keys(moto_server, s3_bucket) == [
        f"staging/{txn}.staged/{index:06d}.body" for index in range(3)]  # no manifest
    listed = sink.list_in_doubt(NAMESPACE)
    assert [(str(h.txn_id), h.data["requests"]) for h in listed] == [(txn, 0)]
    assert sink.abort(listed[0]) is AbortOutcome.ABORTED
    assert sink.abort(listed[0]) is AbortOutcome.NOT_FOUND
    assert staged_keys(moto_server, s3_bucket) == [] and sink.list_in_doubt(NAMESPACE) == []
    assert http_receiver.records(receiver_path) == []


def test_a_missing_bucket_is_a_configuration_error_and_no_endpoint_retryable_with_the_fix(
        http_receiver: ReceiverProcess, receiver_path: str, moto_server: MotoServer) -> None:
    sink, _ = s3_sink(http_receiver, receiver_path, moto_server, "no-such-bucket")
    steps: list[Callable[[], object]] = [lambda: sink.check_schema([]),
                                         lambda: prepare(sink, orders(0, 4))]
    for step in steps:
        with pytest.raises(ConfigurationError, match=r"S3: .*s3://no-such-bucket/"
                           r"staging.*NoSuchBucket.*Fix: create the bucket"):
            step()
    unreachable, _ = s3_sink(http_receiver, receiver_path, moto_server, "b", staging_options={
        "endpoint_url": "http://127.0.0.1:9", "region": "us-east-1",
        "access_key_id": "x", "secret_access_key": "y"})
    with pytest.raises(RetryableError,
                       match=r"Could not connect to the endpoint.*Fix: .*endpoint_url="):
        unreachable.check_schema([])


def test_s3_staging_options_are_checked_and_their_secrets_kept_out_of_repr(
        http_receiver: ReceiverProcess, moto_server: MotoServer, s3_bucket: str,
        tmp_path: Path) -> None:
    sink, options = s3_sink(http_receiver, "/x", moto_server, s3_bucket)
    secret = options["staging_options"]["secret_access_key"]
    assert secret not in repr(sink) and secret not in repr(sink.staging)
    assert f"staging='s3://{s3_bucket}/staging/'" in repr(sink)
    bad: dict[str, Any]
    for bad in ({"staging": "s3://", "staging_options": {}},
                {"staging": f"s3://{s3_bucket}", "staging_options": {"password": "x"}},
                {"staging": str(tmp_path), "staging_options": {"region": "eu-west-1"}},
                {"staging": "gs://bucket/prefix"}):
        with pytest.raises(ConfigurationError, match="Fix: "):
            HttpSink("http://127.0.0.1/x", **bad)
