"""The crash suite: a real Spark driver SIGKILLed at every named crash point, for any sink.

One stream runs through the whole list of crash points in turn, as the demo does: the driver
(:mod:`twophase.testing.driver`, a process session of its own) is armed at the first point for
batch 1 and dies there (driver, JVM and Python workers, ``kill -9``); the restart recovers,
goes on and dies at the next point for batch 2; and so on, then a last run finishes the feed.
After every crash nothing is visible twice; at the end every row is visible exactly once,
nothing is in doubt, and the state file has nothing pending. A sink's test module says how to
build the sink (by name: the driver is another process) and how to read what is visible::

    from twophase.testing.crash import CrashSuite, SinkTarget

    class TestMySinkCrashes(CrashSuite):
        @pytest.fixture
        def target(self, tmp_path):
            return SinkTarget("my_package.sinks:MySink", {"directory": str(tmp_path / "out")})

        def visible(self, target):
            return sorted(...)  # the event_id of every row a reader of the target sees

``check_lost_state = True`` also tries, after every crash, a restart whose state directory is
gone: it must be refused and write nothing (then the state comes back and recovery goes on).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from twophase._crash import CRASH_POINTS
from twophase._loader import build_sink
from twophase._state import StateStore
from twophase.sink import TwoPhaseCommitSink
from twophase.testing.driver import DriverSpec, RunResult, generate_feed, launch

ROWS_PER_FILE = 100
LOST_STATE_MESSAGE = "there is no state file"


@dataclass(frozen=True)
class SinkTarget:
    """A sink as the driver process builds it: ``"module:Class"`` and its keyword options."""

    factory: str
    options: dict[str, Any] = field(default_factory=dict)

    def build(self) -> TwoPhaseCommitSink[Any]:
        return build_sink(self.factory, self.options)


class CrashSuite:
    """Inherit it as ``TestXxx(CrashSuite)``; provide ``target`` and ``visible`` (see above)."""

    check_lost_state = False
    foreach_batch = False
    rows_per_file = ROWS_PER_FILE

    @pytest.fixture
    def target(self) -> SinkTarget:
        raise NotImplementedError("override the target fixture: the sink over an empty target")

    def visible(self, target: SinkTarget) -> list[int]:
        raise NotImplementedError("return the sorted event_id of every row a reader sees")

    def test_a_driver_killed_at_every_point_in_turn_delivers_every_row_exactly_once(
        self, target: SinkTarget, tmp_path: Path
    ) -> None:
        files = len(CRASH_POINTS) + 2  # a batch before the first crash, one after the last
        expected = list(range(generate_feed(tmp_path / "feed", files=files,
                                            rows_per_file=self.rows_per_file)))
        spec = DriverSpec(input_dir=str(tmp_path / "feed"), checkpoint=str(tmp_path / "ckpt"),
                          sink_factory=target.factory, sink_kwargs=target.options,
                          foreach_batch=self.foreach_batch)
        runs = tmp_path / "runs"
        for batch, point in enumerate(CRASH_POINTS, start=1):
            crashed = launch(spec, workdir=runs, crash_at=f"{point}@{batch}")
            assert crashed.crashed, f"the driver did not die at {point}@{batch}: {_tail(crashed)}"
            seen = self.visible(target)
            assert len(seen) == len(set(seen)), f"a row is visible twice after a crash at {point}"
            assert set(seen) <= set(expected)
            if self.check_lost_state:
                self._refused_without_state(spec, runs / f"without-state-{point}", seen)
        finished = launch(spec, workdir=runs)
        assert finished.returncode == 0, f"the last run failed: {_tail(finished)}"
        assert self.visible(target) == expected, "rows lost or duplicated"
        state = StateStore.for_checkpoint(spec.checkpoint).read()
        assert state is not None
        assert (state.pending, state.last_done_batch) == ((), files - 1)
        assert target.build().list_in_doubt(state.namespace) == [], "left in doubt"

    def _refused_without_state(self, spec: DriverSpec, workdir: Path, seen: list[int]) -> None:
        """A restart whose state is gone is refused and writes nothing; then it is restored."""
        state_dir = StateStore.for_checkpoint(spec.checkpoint).directory
        workdir.mkdir(parents=True)
        aside = workdir / "state-aside"
        os.rename(state_dir, aside)
        try:
            refused = launch(spec, workdir=workdir)
            assert not refused.crashed and refused.returncode != 0, (
                f"a start without its state ran: {_tail(refused)}")
            assert LOST_STATE_MESSAGE in refused.log.read_text()
            assert self.visible(self.target_of(spec)) == seen
        finally:
            os.rename(aside, state_dir)

    @staticmethod
    def target_of(spec: DriverSpec) -> SinkTarget:
        return SinkTarget(spec.sink_factory, spec.sink_kwargs)


def _tail(run: RunResult, lines: int = 30) -> str:
    """The end of a driver's log, for an assertion message."""
    return f"see {run.log}:\n" + "\n".join(run.log.read_text().splitlines()[-lines:])
