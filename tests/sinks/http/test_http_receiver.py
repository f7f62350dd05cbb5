"""The reference receiver (sinks/http/receiver.py) running as a separate process on loopback,
spoken to directly: its answers (400/401/409/413/415/422, replays, expiry), its signature check,
keys left in flight by a killed receiver, and a forwarding receiver's downstream webhook hit
once per key. The sink's reaction to each answer: tests/sinks/http/test_http_sink.py."""

from __future__ import annotations

import contextlib
import gzip
import json
import sqlite3
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

from setups.servers.http_receiver import (
    SIGNING_SECRET,
    TOKEN,
    Downstream,
    ReceiverProcess,
    Receivers,
    new_path,
)
from sinks.http.protocol import IDEMPOTENCY_KEY, REPLAYED, SIGNATURE, WELL_KNOWN, key_header
from sinks.http.signing import refusal, sign

JSON_TYPE = "application/json"


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



# -- a downstream webhook with no idempotency of its own ------------------------------------------

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



def test_a_signature_checks_timestamp_and_body() -> None:
    secret, body, now = b"s", b"body", 1_000_000.0
    header = sign(secret, body, now)
    assert refusal(secret, header, body, now) is None
    assert "does not match" in (refusal(secret, header, b"other", now) or "")
    assert "does not match" in (refusal(b"x", header, body, now) or "")
    assert "tolerance" in (refusal(secret, header, body, now + 301) or "")
    assert "malformed" in (refusal(secret, "v1=abc", body, now) or "")

