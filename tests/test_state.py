"""The state file: atomic, checksummed, fenced, owner-only, bounded, and SIGKILL-proof."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from twophase import ConfigurationError, FencedError, StateCorruptError
from twophase._state import State, StateStore


def test_each_run_bumps_the_epoch(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    assert store.read() is None
    assert store.start_run("orders", {}).epoch == 1
    assert store.start_run("orders", {}).epoch == 2
    assert store.read() == State(namespace="orders", epoch=2)


def test_state_is_readable_by_the_owner_only(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    store.start_run("orders", {})
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.directory.stat().st_mode) == 0o700


def test_a_zombie_epoch_is_fenced_and_changes_nothing(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    zombie_epoch = store.start_run("orders", {}).epoch
    store.start_run("orders", {})  # a newer run takes over
    before = store.path.read_bytes()
    with pytest.raises(FencedError, match="was fenced and stopped without committing"):
        store.update(lambda s: replace(s, last_done_batch=99), epoch=zombie_epoch)
    assert store.path.read_bytes() == before


def test_another_namespace_on_the_same_state_is_refused(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    store.start_run("orders", {})
    with pytest.raises(ConfigurationError, match="belongs to namespace 'orders'"):
        store.start_run("payments", {})


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage"])
def test_a_damaged_state_file_is_refused_not_read_as_empty(tmp_path: Path, damage: str) -> None:
    store = StateStore(tmp_path / "state")
    store.start_run("orders", {})
    raw = bytearray(store.path.read_bytes())
    if damage == "flip":
        raw[raw.index(b'"epoch": 1') + len('"epoch": ')] = ord("7")
    elif damage == "truncate":
        raw = raw[: len(raw) // 2]
    else:
        raw = bytearray(b"\x00" * 40)
    store.path.write_bytes(bytes(raw))
    with pytest.raises(StateCorruptError, match=f"state file {store.path} cannot be trusted"):
        store.read()


def test_an_unwritable_location_names_the_path_and_the_fix(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    store = StateStore(blocker / "state")
    with pytest.raises(ConfigurationError,
                       match=f"cannot write the state location {store.directory}"):
        store.start_run("orders", {})


WRITER = """
import sys
from dataclasses import replace
from twophase._state import StateStore
store = StateStore(sys.argv[1])
store.start_run("orders", {})
print("ready", flush=True)
while True:
    store.update(lambda s: replace(s, last_done_batch=s.last_done_batch + 1,
                                   settings={"pad": "x" * 20000}), epoch=None)
"""


def test_sigkill_at_any_instant_never_leaves_a_torn_state(tmp_path: Path) -> None:
    """A writer replacing the file in a tight loop is SIGKILLed 15 times at random instants."""
    directory = tmp_path / "state"
    last_seen = -1
    for round_number in range(15):
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(directory)],
                                  stdout=subprocess.PIPE, text=True)
        assert writer.stdout is not None and writer.stdout.readline() == "ready\n"
        time.sleep(0.01 + 0.013 * round_number)
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
        state = StateStore(directory).read()  # raises if torn
        assert state is not None
        assert state.last_done_batch >= last_seen
        last_seen = state.last_done_batch
    assert last_seen > 0, "the writer never completed a replace: the test proved nothing"
