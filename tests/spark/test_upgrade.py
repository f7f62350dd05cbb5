"""Upgrades with batches pending (issue 28): what the previous release left, the current code
recovers; what a newer release wrote, the current code refuses.

The previous release (its wheel, checked in: :mod:`tests.releases`) runs its own driver into
the real server of every sink it has (registered ``since`` it or earlier: a later sink is
left out) and is SIGKILLed after deciding batch 1, before committing it; its own sink then
leaves orphans of the query (transactions no decision names). The current code reads that
state, ``status`` shows the batch pending, and a normal restart of the query commits the
decided batch, aborts the orphans and finishes the feed: every row once in each system's own
view, nothing in doubt. The self-contained case is checked in whole: the state
and the SQLite database the release left (a decided batch pending, orphans staged), recovered
by the current ``python -m twophase.cleanup``. The rules these follow are in
:mod:`twophase._state` ("Versions").
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from setups import SQLiteSetup
from setups.base import Target as SetupTarget
from sinks.postgres.connection import SSLMODE_OF_TLS
from tests.release_orphans import ORPHAN_EVENT_IDS
from tests.releases import PREVIOUS, SQLITE_STATE, launch_release, leave_orphans, unpacked
from tests.sink_sets import Sinks, shipped_in, sink_sets, undecided
from twophase import Handle, StateNewerError
from twophase._crash import AFTER_DECISION
from twophase._handle import HANDLE_FORMAT_VERSION
from twophase._metrics import ORPHANS_ABORTED, ORPHANS_FOUND
from twophase._state import STATE_FORMAT_VERSION, StateStore, _checksum
from twophase.testing.driver import DriverSpec, generate_feed, launch

FILES, ROWS_PER_FILE, ORPHANS = 3, 20, 2
#: The feed of the checked-in SQLite state (tests.release_fixture writes it so).
FIXTURE = "fixture.json"
#: Sink options newer than the previous release (its defaults do the same on the plain test
#: servers: 0.1.0's MySQL sink tried TLS, then plain text, where tls="off" asks for plain).
NEWER_OPTIONS = frozenset({"tls"})
#: Options the previous release spelled otherwise, per sink: the release's name and value.
#: 0.1.0's PostgreSQL sink took libpq's ``sslmode`` (verified by default).
RELEASE_SPELLINGS: dict[str, dict[str, tuple[str, Mapping[Any, Any]]]] = {
    "sinks.postgres:PostgresSink": {"tls": ("sslmode", SSLMODE_OF_TLS)}}


@pytest.fixture(scope="session")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's packages, unpacked from its wheel."""
    return unpacked(tmp_path_factory.mktemp(f"twophase-{PREVIOUS}"))


def as_the_release_takes(spec: DriverSpec) -> DriverSpec:
    """``spec`` as the previous release takes it: an option it spelled otherwise in its
    spelling, one newer than it left out (its defaults do what it asks for on the plain test
    servers); a group's members each by their own sink."""
    return replace(spec, sink_kwargs=_as_spelled(spec.sink_factory, spec.sink_kwargs))


def _as_spelled(factory: str, options: Mapping[str, Any]) -> dict[str, Any]:
    spellings = RELEASE_SPELLINGS.get(factory, {})
    spelled: dict[str, Any] = {}
    for key, value in options.items():
        if key in spellings:
            name, values = spellings[key]
            spelled[name] = values[value]
        elif key not in NEWER_OPTIONS:
            spelled[key] = _value_as_spelled(factory, value)
    return spelled


def _value_as_spelled(factory: str, value: Any) -> Any:
    """A group's member by its own sink, another mapping (the members) by ``factory``."""
    if isinstance(value, dict) and {"sink", "options"} <= set(value):
        return {**value, "options": _as_spelled(value["sink"], value["options"])}
    return _as_spelled(factory, value) if isinstance(value, dict) else value


@pytest.mark.spark
@pytest.mark.crash
@pytest.mark.parametrize("sinks", sink_sets(shipped_in(PREVIOUS)))
def test_a_decided_batch_and_orphans_the_previous_release_left_are_recovered(
        request: pytest.FixtureRequest,
        sinks: tuple[str, ...], previous_release: Path, tmp_path: Path) -> None:
    system = Sinks.of(request, sinks)
    expected = list(range(generate_feed(tmp_path / "feed", files=FILES,
                                        rows_per_file=ROWS_PER_FILE)))
    spec = DriverSpec.into(system.target, tmp_path)
    released = as_the_release_takes(spec)
    crashed = launch_release(previous_release, released, workdir=tmp_path / "previous",
                             crash_at=f"{AFTER_DECISION}@1")
    assert crashed.crashed, f"the previous release's driver did not die: see {crashed.log}"
    orphans = leave_orphans(previous_release, released, count=ORPHANS)

    left = spec.state_store().read_existing()  # the current code reads the release's state
    assert [decision.batch for decision in left.pending] == [1]
    assert undecided(system, left) == dict.fromkeys(system.members, ORPHANS)
    assert system.visible() == system.expecting(expected[:ROWS_PER_FILE])  # batch 0 only
    status = subprocess.run([sys.executable, "-m", "twophase.status", spec.checkpoint],
                            capture_output=True, text=True, check=False)
    assert status.returncode == 0, status.stderr
    assert "pending    batch 1" in status.stdout

    finished = launch(spec, workdir=tmp_path / "current")
    assert finished.returncode == 0, f"the current code's restart failed: see {finished.log}"
    assert system.visible() == system.expecting(expected), "rows lost, duplicated or orphaned"
    assert system.in_doubt() == system.nothing(), "left open on a server"
    state = spec.state_store().read_existing()
    assert (state.pending, state.last_done_batch) == ((), FILES - 1)
    swept = {name: state.metrics.get(name, 0) - left.metrics.get(name, 0)
             for name in (ORPHANS_FOUND, ORPHANS_ABORTED)}
    assert swept == dict.fromkeys(swept, len(orphans)), swept


def test_the_previous_releases_sqlite_state_is_recovered_by_cleanup(tmp_path: Path) -> None:
    """The checked-in state and database: batch 0 committed, batch 1 decided and staged,
    orphans staged; the current cleanup commits batch 1 and aborts the orphans."""
    shutil.copytree(SQLITE_STATE, tmp_path, dirs_exist_ok=True)
    fixture = json.loads((tmp_path / FIXTURE).read_text())
    target = SetupTarget("sinks.sqlite:SQLiteSink",
                         {"path": str(tmp_path / "orders.db"), "table": "orders"},
                         SQLiteSetup(tmp_path))
    store = StateStore(tmp_path / "twophase")
    left = store.read_existing()
    assert [decision.batch for decision in left.pending] == [fixture["decided_batch"]]
    assert target.visible() == fixture["committed"]
    assert len(target.in_doubt()) == len(left.pending[0].handles) + len(fixture["orphans"])

    cleaned = subprocess.run(
        [sys.executable, "-m", "twophase.cleanup", "--sink", target.factory,
         "--options", json.dumps(target.options), "--state", store.location,
         "--older-than", "1s"],  # the fixture may be younger than the default 10 minutes
        capture_output=True, text=True, check=False)
    assert cleaned.returncode == 0, cleaned.stderr
    actions = [json.loads(line) for line in cleaned.stdout.splitlines()]
    assert sorted(a["subject"] for a in actions if a["action"] == "abort_orphan") == sorted(
        fixture["orphans"])
    assert [a["done"] for a in actions if a["action"] == "roll_forward"] == [True]
    assert target.visible() == fixture["committed"] + fixture["decided"]
    assert not set(target.visible()) & set(range(ORPHAN_EVENT_IDS, ORPHAN_EVENT_IDS + 100))
    assert target.in_doubt() == []
    assert store.read_existing().pending == ()


def test_a_state_written_by_a_newer_version_is_refused_naming_both_versions(
        tmp_path: Path) -> None:
    store = StateStore(tmp_path / "twophase")
    store.start_run("orders", {})
    newer = STATE_FORMAT_VERSION + 1
    body = {**json.loads(Path(store.path).read_bytes())["state"], "format": newer,
            "decided_elsewhere": [7]}  # what only the newer version knows
    written = json.dumps({"checksum": _checksum(body), "state": body})
    Path(store.path).write_text(written)
    with pytest.raises(StateNewerError) as refused:
        store.read()
    assert f"state format {newer}" in str(refused.value)
    assert f"reads formats up to {STATE_FORMAT_VERSION}" in str(refused.value)
    assert "upgrade twophase" in str(refused.value)
    with pytest.raises(StateNewerError):
        store.start_run("orders", {})  # nor written over
    assert Path(store.path).read_text() == written
    for module in ("twophase.status", "twophase.cleanup"):
        args = ([store.location] if module == "twophase.status"
                else ["--sink", "sinks.sqlite:SQLiteSink", "--options",
                      json.dumps({"path": str(tmp_path / "orders.db"), "table": "orders"}),
                      "--state", store.location])
        ran = subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                             text=True, check=False)
        assert ran.returncode != 0 and "upgrade twophase" in ran.stderr, (module, ran.stderr)
        assert "Traceback" not in ran.stderr, (module, ran.stderr)
    assert Path(store.path).read_text() == written


def test_a_handle_of_a_newer_format_is_refused() -> None:
    newer = {"v": HANDLE_FORMAT_VERSION + 1, "sink": "sqlite", "rows": 1, "data": {},
             "txn": "orders.3f2a9c1e7b6d4a01.4.17.2.345.1763730000"}
    with pytest.raises(StateNewerError, match="run the newer twophase version"):
        Handle.from_json(newer)
