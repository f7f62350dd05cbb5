"""sinks.http against the reference receiver running as a separate process on loopback: the
shared contract suite, and the sink's reaction to each of the receiver's answers, with the
receiver SIGKILLed and restarted between requests. The receiver's own answers:
tests/sinks/http/test_http_receiver.py."""

from __future__ import annotations

import json
import logging
import os
import pickle
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar

import pytest
import requests

from setups.http import s3_staging
from setups.servers.http_receiver import (
    SIGNING_SECRET,
    TOKEN,
    Downstream,
    ReceiverProcess,
    Receivers,
    new_path,
)
from setups.servers.moto import MotoServer
from setups.servers.tls import WRONG_HOST, CertificateAuthority
from sinks.http import HttpSink
from sinks.http.committer import HttpCommitter
from sinks.http.encoding import encode_record
from sinks.http.protocol import WELL_KNOWN
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
    SinkContract,
    abort,
    commit,
    context,
    list_in_doubt,
    orders,
    prepare,
    purge_commit_records,
)

#: The tests' sinks: small requests, quick retries.
CONTRACT_OPTIONS = {"max_records_per_request": 3, "initial_backoff_s": 0.02,
                    "max_backoff_s": 0.1}


def make_sink(receiver: ReceiverProcess, path: str, staging: Path | str,
              **options: Any) -> HttpSink:
    return HttpSink(**{**receiver.sink_options(path), "staging": str(staging),
                       **CONTRACT_OPTIONS, **options})


# -- the contract suite -------------------------------------------------------------------------

class TestHttpJsonContract(SinkContract):
    setup_fixture = "http_setup"
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
    listed = list_in_doubt(sink, NAMESPACE)
    assert [h.txn_id for h in listed] == [txn.txn_id]
    assert abort(sink, listed[0]) is AbortOutcome.ABORTED
    assert list_in_doubt(sink, NAMESPACE) == [] and list(tmp_path.iterdir()) == []
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
    assert abort(sink, handle) is AbortOutcome.ABORTED


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


def test_before_a_decision_the_receiver_is_asked_and_a_down_one_is_retryable(
        private_receiver: Receivers, tmp_path: Path) -> None:
    receiver = private_receiver()
    path = new_path()
    sink = make_sink(receiver, path, tmp_path)
    handle, empty = prepare(sink, orders(0, 4)), prepare(sink, [], partition=1)
    with sink.committer() as committer:
        committer.check_committable([handle, empty])
        receiver.kill()
        with pytest.raises(RetryableError, match=r"GET .*/\.well-known/idempotency"
                           r".*ConnectionError.*Fix: retried automatically; if it persists, "
                           r"check url="):
            committer.check_committable([handle, empty])
        committer.check_committable([empty])  # nothing to send: the receiver is not asked
        receiver.restart()
        committer.check_committable([handle])
    assert commit(sink, handle) is CommitOutcome.COMMITTED
    assert receiver.event_ids(path) == [0, 1, 2, 3]


def test_tls_is_verified_by_default_and_plain_http_is_refused(
        http_secured: ReceiverProcess, tmp_path: Path) -> None:
    path = new_path()
    trusting = make_sink(http_secured, path, tmp_path)
    assert trusting.settings.url.startswith("https://") and trusting.settings.tls.verifies
    assert trusting.settings.tls.ca_bundle == str(http_secured.cafile)
    trusting.check_schema(())
    assert commit(trusting, prepare(trusting, orders(0, 2))) is CommitOutcome.COMMITTED
    assert http_secured.event_ids(path) == [0, 1]
    with pytest.raises(requests.ConnectionError):  # the receiver speaks TLS only
        requests.get(http_secured.url(WELL_KNOWN).replace("https://", "http://"), timeout=5)


def _refused_before_anything_is_sent(sink: HttpSink, receiver: ReceiverProcess, path: str,
                                     cause: str) -> None:
    """``sink``'s check and its commit are refused naming ``cause`` and the fix; the receiver
    holds nothing."""
    fix = r"Fix: the receiver's certificate was not verified.*pass ca_bundle=.*tls='require'"
    with pytest.raises(ConfigurationError, match=rf"SSLError.*{cause}.*{fix}"):
        sink.check_schema(())
    with pytest.raises(ConfigurationError, match=rf"SSLError.*{cause}.*{fix}"):
        commit(sink, prepare(sink, orders(0, 2)))
    assert receiver.event_ids(path) == [] and receiver.key_states() == {}


@pytest.mark.parametrize("trusted", ["other CA", "default CAs"])
def test_a_receiver_whose_certificate_another_ca_issued_is_refused_before_anything_is_sent(
        private_receiver: Receivers, tls_ca: CertificateAuthority, other_ca: CertificateAuthority,
        tmp_path: Path, trusted: str) -> None:
    receiver = private_receiver(certfile=tls_ca.issue("receiver").certfile, cafile=tls_ca.cafile)
    path = new_path()
    ca_bundle = str(other_ca.cafile) if trusted == "other CA" else None
    sink = make_sink(receiver, path, tmp_path, ca_bundle=ca_bundle, max_attempts=1)
    _refused_before_anything_is_sent(sink, receiver, path, "CERTIFICATE_VERIFY_FAILED")


def test_a_receiver_whose_certificate_names_another_host_is_refused_before_anything_is_sent(
        private_receiver: Receivers, tls_ca: CertificateAuthority, tmp_path: Path) -> None:
    receiver = private_receiver(certfile=tls_ca.issue("wrong-host", (WRONG_HOST,)).certfile,
                                cafile=tls_ca.cafile, names_host=False)
    path = new_path()
    sink = make_sink(receiver, path, tmp_path, max_attempts=1)
    assert sink.settings.tls.ca_bundle == str(tls_ca.cafile)  # the right CA, the wrong name
    _refused_before_anything_is_sent(sink, receiver, path,
                                     "(IP address mismatch|Hostname mismatch|doesn't match)")
    # the one relaxing option
    unverified = make_sink(receiver, path, tmp_path, tls="require", ca_bundle=None)
    unverified.check_schema(())


CANARY_TOKEN, CANARY_SIGNING = "canary-http-token-3b8e", "canary-http-signing-71d2"


def test_secrets_by_reference_stay_out_of_repr_pickles_logs_and_errors(
        private_receiver: Receivers, tls_ca: CertificateAuthority, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    receiver = private_receiver(certfile=tls_ca.issue("receiver").certfile, cafile=tls_ca.cafile,
                                token=CANARY_TOKEN, signing_secret=CANARY_SIGNING)
    monkeypatch.setenv("TWOPHASE_HTTP_TOKEN", CANARY_TOKEN)
    token_file = tmp_path / "signing-secret"
    token_file.write_text(CANARY_SIGNING + "\n")
    caplog.set_level(logging.DEBUG)
    path = new_path()
    sink = make_sink(receiver, path, tmp_path / "staging", token=Secret(env="TWOPHASE_HTTP_TOKEN"),
                     signing_secret=Secret(file=str(token_file)))
    sink.check_schema(())
    assert commit(sink, prepare(sink, orders(0, 5))) is CommitOutcome.COMMITTED
    assert receiver.event_ids(path) == [0, 1, 2, 3, 4]  # the references were revealed
    monkeypatch.setenv("TWOPHASE_HTTP_TOKEN", "rotated-" + CANARY_TOKEN)
    with pytest.raises(ConfigurationError) as refused:  # read again by the next request
        commit(sink, prepare(sink, orders(10, 2), batch=2))
    assert "urllib3.connectionpool" in {record.name for record in caplog.records}
    produced = [repr(sink), repr(sink.settings), str(refused.value), caplog.text,
                receiver.log.read_text()]
    for canary in (CANARY_TOKEN, CANARY_SIGNING):
        assert not any(canary in text for text in produced), canary
        assert canary.encode() not in pickle.dumps(sink)


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
from twophase.testing.contract import NAMESPACE, abort, commit, list_in_doubt
sink = HttpSink(**json.loads(sys.argv[1]))
print(json.dumps([[str(h.txn_id), h.data["requests"],
                   (commit(sink, h) if h.txn_id.batch == 0 else abort(sink, h)).name]
                  for h in list_in_doubt(sink, NAMESPACE)]))
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
    assert purge_commit_records(sink, NAMESPACE, datetime.now(UTC) + timedelta(seconds=5)) == 1
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
    assert list_in_doubt(sink, NAMESPACE) == []


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
    listed = list_in_doubt(sink, NAMESPACE)
    assert [(str(h.txn_id), h.data["requests"]) for h in listed] == [(txn, 0)]
    assert abort(sink, listed[0]) is AbortOutcome.ABORTED
    assert abort(sink, listed[0]) is AbortOutcome.NOT_FOUND
    assert staged_keys(moto_server, s3_bucket) == [] and list_in_doubt(sink, NAMESPACE) == []
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
        "access_key_id": "AKIDEXAMPLE", "secret_access_key": "wJalrXUtnFEMI/K7MDENG"})
    with pytest.raises(RetryableError,
                       match=r"Could not connect to the endpoint.*Fix: .*endpoint_url="):
        unreachable.check_schema([])


def test_s3_staging_takes_its_secrets_by_reference(
        http_receiver: ReceiverProcess, moto_server: MotoServer, s3_bucket: str,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("TWOPHASE_STAGING_SECRET", "canary-staging-secret-0c4f")
    monkeypatch.setenv("TWOPHASE_STAGING_TOKEN", "canary-staging-token-6d1a")
    caplog.set_level(logging.DEBUG)
    staging = s3_staging(moto_server, s3_bucket)
    staging["staging_options"].update(secret_access_key=Secret(env="TWOPHASE_STAGING_SECRET"),
                                      session_token=Secret(env="TWOPHASE_STAGING_TOKEN"))
    path = new_path()
    sink = HttpSink(**{**http_receiver.sink_options(path), **staging, **CONTRACT_OPTIONS})
    sink.check_schema(())
    assert commit(sink, prepare(sink, orders(0, 4))) is CommitOutcome.COMMITTED
    assert http_receiver.event_ids(path) == [0, 1, 2, 3]
    for canary in ("canary-staging-secret-0c4f", "canary-staging-token-6d1a"):
        assert canary.encode() not in pickle.dumps(sink)
        assert canary not in repr(sink) and canary not in caplog.text


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
