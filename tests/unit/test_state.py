"""The state file: atomic, checksummed, fenced, owner-only, bounded, and SIGKILL-proof.

One suite, run against every kind of state location: a local directory and an S3 prefix (a
private moto_server process over HTTP).
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from setups.servers.moto import MotoServer
from setups.servers.tls import CertificateAuthority
from twophase import ConfigurationError, FencedError, Secret, StateCorruptError
from twophase._state import State, StateStore

Location = tuple[str, dict[str, Any]]


def s3_options(server: MotoServer) -> dict[str, Any]:
    options = server.options()
    return {key: options[key] for key in ("endpoint_url", "region", "path_style",
                                          "access_key_id", "secret_access_key", "ca_bundle")
            if key in options}


@pytest.fixture(params=["local", "s3"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Location:
    """Where a fresh state lives: a local directory, or a prefix in a fresh S3 bucket."""
    if request.param == "local":
        return str(tmp_path / "state"), {}
    server: MotoServer = request.getfixturevalue("moto_server")
    return f"s3://{server.new_bucket('state')}/checkpoints/orders/twophase", s3_options(server)


def store_at(location: Location) -> StateStore:
    return StateStore(location[0], location[1])


def raw(store: StateStore) -> bytes:
    found = store.storage.read()
    assert found is not None
    return found.data


def overwrite(store: StateStore, data: bytes) -> None:
    """Replace the file's bytes behind the store's back (damage, a hand edit)."""
    found = store.storage.read()
    assert store.storage.replace(data, found.version if found else None) is not None


def test_each_run_bumps_the_epoch(location: Location) -> None:
    store = store_at(location)
    assert store.read() is None
    assert store.start_run("orders", {}).epoch == 1
    assert store.start_run("orders", {}).epoch == 2
    assert store.read() == State(namespace="orders", epoch=2)


def test_a_zombie_epoch_is_fenced_and_changes_nothing(location: Location) -> None:
    store = store_at(location)
    zombie_epoch = store.start_run("orders", {}).epoch
    store.start_run("orders", {})  # a newer run takes over
    before = raw(store)
    with pytest.raises(FencedError, match="was fenced and stopped without committing"):
        store.update(lambda s: replace(s, last_done_batch=99), epoch=zombie_epoch)
    assert raw(store) == before


def test_another_namespace_on_the_same_state_is_refused(location: Location) -> None:
    store = store_at(location)
    store.start_run("orders", {})
    with pytest.raises(ConfigurationError, match="belongs to namespace 'orders'"):
        store.start_run("payments", {})


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage"])
def test_a_damaged_state_file_is_refused_not_read_as_empty(location: Location,
                                                           damage: str) -> None:
    store = store_at(location)
    store.start_run("orders", {})
    data = bytearray(raw(store))
    if damage == "flip":
        data[data.index(b'"epoch": 1') + len('"epoch": ')] = ord("7")
    elif damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data = bytearray(b"\x00" * 40)
    overwrite(store, bytes(data))
    with pytest.raises(StateCorruptError, match=f"state file {store.path} cannot be trusted"):
        store.read()
    with pytest.raises(StateCorruptError):
        store.start_run("orders", {})  # nor written over


def test_concurrent_writers_lose_no_change(location: Location) -> None:
    """Four writers (threads with their own store objects) each add 15 batches at once: every
    increment survives (flock locally; conditional writes that lose a race retry on S3)."""
    store_at(location).start_run("orders", {})
    writers, increments = 4, 15

    def add_batches() -> None:
        store = store_at(location)
        for _ in range(increments):
            store.update(lambda s: replace(s, last_done_batch=s.last_done_batch + 1), epoch=None)

    threads = [threading.Thread(target=add_batches) for _ in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    state = store_at(location).read()
    assert state is not None and state.last_done_batch == -1 + writers * increments


WRITER = """
import json, sys
from dataclasses import replace
from twophase._state import StateStore
store = StateStore(sys.argv[1], json.loads(sys.argv[2]))
store.start_run("orders", {})
print("ready", flush=True)
while True:
    store.update(lambda s: replace(s, last_done_batch=s.last_done_batch + 1,
                                   settings={"pad": "x" * 20000}), epoch=None)
"""


def test_sigkill_at_any_instant_never_leaves_a_torn_state(location: Location) -> None:
    """A writer replacing the file in a tight loop is SIGKILLed 15 times at random instants."""
    last_seen = -1
    for round_number in range(15):
        writer = subprocess.Popen([sys.executable, "-c", WRITER, location[0],
                                   json.dumps(location[1])], stdout=subprocess.PIPE, text=True)
        assert writer.stdout is not None and writer.stdout.readline() == "ready\n"
        time.sleep(0.01 + 0.013 * round_number)
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
        state = store_at(location).read()  # raises if torn
        assert state is not None
        assert state.last_done_batch >= last_seen
        last_seen = state.last_done_batch
    assert last_seen > 0, "the writer never completed a replace: the test proved nothing"


# -- what only one kind of location has ---------------------------------------------------------

def test_a_local_state_is_readable_by_the_owner_only(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    store.start_run("orders", {})
    assert stat.S_IMODE(Path(store.path).stat().st_mode) == 0o600
    assert stat.S_IMODE(Path(store.location).stat().st_mode) == 0o700


def test_an_unwritable_local_location_names_the_path_and_the_fix(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    store = StateStore(blocker / "state")
    with pytest.raises(ConfigurationError,
                       match=f"cannot write the state location {store.location}"):
        store.start_run("orders", {})


def test_an_s3_write_that_lost_the_race_to_a_takeover_is_fenced(moto_server: MotoServer) -> None:
    """A zombie read the state, a newer run started, then the zombie writes: its conditional
    write is refused, it reads again, and the epoch check fences it. (Locally flock orders
    them: the takeover waits for the zombie's whole update.)"""
    location = (f"s3://{moto_server.new_bucket('state')}/orders", s3_options(moto_server))
    store = store_at(location)
    zombie_epoch = store.start_run("orders", {}).epoch
    took_over = False

    def change_racing_a_takeover(state: State) -> State:
        nonlocal took_over
        if not took_over:
            store.start_run("orders", {})
            took_over = True
        return replace(state, last_done_batch=99)

    with pytest.raises(FencedError):
        store_at(location).update(change_racing_a_takeover, epoch=zombie_epoch)
    state = store.read()
    assert state is not None and (state.epoch, state.last_done_batch) == (2, -1)


def refuses(action: Callable[[], object], pattern: str) -> None:
    with pytest.raises(ConfigurationError, match=pattern):
        action()


def test_s3_locations_and_their_errors_name_the_fix(moto_server: MotoServer,
                                                    moto_checking_credentials: MotoServer,
                                                    tmp_path: Path) -> None:
    options = s3_options(moto_server)
    assert StateStore("s3a://bucket/cp/twophase", options).path == \
        "s3://bucket/cp/twophase/state.json"
    assert StateStore.for_checkpoint("s3a://bucket/cp", options).path == \
        "s3://bucket/cp/twophase/state.json"
    refuses(lambda: StateStore("s3://no-such-bucket-here/x", options).start_run("orders", {}),
            r"s3://no-such-bucket-here/x/state.json failed: NoSuchBucket.*Fix: create the bucket")
    refuses(lambda: StateStore("hdfs://nn/cp/twophase"), r"not at 'hdfs://.*Fix: pass "
            r"state_location='s3://bucket/prefix'")
    refuses(lambda: StateStore("s3://b/x", {"endpoint": "typo"}),
            r"state_options: unknown S3 options \['endpoint'\]")
    refuses(lambda: StateStore(tmp_path, {"region": "x"}), r"only with an s3:// state location")
    bucket = moto_checking_credentials.new_bucket("state")
    wrong = {**s3_options(moto_checking_credentials), "secret_access_key": "wrong"}
    refuses(lambda: StateStore(f"s3://{bucket}/x", wrong).read(),
            r"SignatureDoesNotMatch.*Fix: fix the credentials")
    key_id, secret = moto_checking_credentials.add_user("lister", ["s3:ListBucket"])
    lister = {**wrong, "access_key_id": key_id, "secret_access_key": secret}
    refuses(lambda: StateStore(f"s3://{bucket}/x", lister).read(),
            r"AccessDenied.*Fix: GetObject needs s3:GetObject; grant s3:GetObject and "
            r"s3:PutObject on the bucket")


def test_a_state_on_s3_over_https_is_verified_and_takes_secrets_by_reference(
        moto_secured: MotoServer, other_ca: CertificateAuthority,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TWOPHASE_STATE_SECRET", moto_secured.secret_access_key)
    options = {**s3_options(moto_secured),
               "secret_access_key": Secret(env="TWOPHASE_STATE_SECRET")}
    assert options["endpoint_url"].startswith("https://") and options["ca_bundle"]
    location = f"s3://{moto_secured.new_bucket('state')}/checkpoints/orders/twophase"
    store = StateStore(location, options)
    store.start_run("orders", {})
    assert store.read() is not None
    assert moto_secured.secret_access_key not in repr(store.storage)
    assert moto_secured.secret_access_key.encode() not in pickle.dumps(options)
    untrusting = StateStore(location, {**options, "ca_bundle": str(other_ca.cafile)})
    refuses(untrusting.read, r"CERTIFICATE_VERIFY_FAILED.*Fix: the store's certificate was not "
            r"verified: pass ca_bundle=")
