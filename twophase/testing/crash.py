"""The crash suite: a real Spark driver SIGKILLed at every named crash point, for any sink.

One stream runs through the whole list of crash points in turn, as the demo does: the driver
(:mod:`twophase.testing.driver`, a process session of its own) is armed at the first point for
batch 1 and dies there (driver, JVM and Python workers, ``kill -9``); the restart recovers,
goes on and dies at the next point for batch 2; and so on, then a last run finishes the feed.
After every crash nothing is visible twice; at the end every row is visible exactly once,
nothing is in doubt (neither in the sink's listing nor on the server: the target's
``in_doubt``), and the state file has nothing pending. A sink's test module gives the suite a
fresh target per test, as to the contract suite (:class:`~twophase.testing.Target`: the driver
is another process, which builds the sink from the target's ``factory`` and ``options``)::

    from twophase.testing.crash import CrashSuite

    class TestMySinkCrashes(CrashSuite):
        @pytest.fixture
        def target(self, tmp_path):
            return MyTarget("my_package.sinks:MySink", {"directory": str(tmp_path / "out")})

``check_lost_state = True`` also tries, after the crash that leaves a decided batch pending
(``after_decision``), a restart whose state directory is gone: it must be refused and write
nothing (then the state comes back and recovery goes on).

``crash_points`` is every point by default; a suite whose sink, adapter or way of running the
driver goes through every point in another suite may take ``DECISION_POINTS`` (to keep a quick
run quick; the other suite runs the full sweep).

On a cluster: override ``spark_conf`` with the master's settings and ``driver_disk`` with a
directory the executors cannot read. The driver is killed at every driver-side point, and the
task-side point (after pre-commit) SIGKILLs an executor instead, once: the retried task
succeeds on another executor and the run goes on.

Driver failover: override the ``state`` fixture to keep the state on shared storage (an
``s3://`` prefix and its options) and set ``fresh_host_per_run = True``: every run then starts
in a new working directory (its temporary files and Spark's local directory inside), and the
crashed driver's is deleted, as if the driver were restarted on another host that shares only
the checkpoint (a shared file system here) and the state.

Over Spark Connect the driver is the server: override ``run_driver`` to restart the server
armed at the crash point and launch an unarmed client (``DriverSpec.remote``), reporting the
run as crashed when the server died (see ``tests/test_connect.py``).

Another source than files: override the ``source`` fixture with a :class:`FeedSource`, which
fills its system with the generated feed and tells the driver to read it from there (say
``source_kafka``, one file's rows per micro-batch). ``check_finished(target)`` adds checks on
the target once every row is delivered (say, every ``ts`` is the feed's instant).

Deprecated, removed in 0.6.0 (see ``CHANGELOG.md``): 0.1.0's :class:`SinkTarget` and a suite's
``visible(target)``. They still work, with a :class:`DeprecationWarning` naming the
replacement: a :class:`~twophase.testing.Target` subclass whose ``visible()`` reads the target.
So does a suite's ``pipelined_commits = True``/``False`` (0.4.0's): ``commits = "behind"`` or
``"inline"``, ``write_stream``'s option.
"""

from __future__ import annotations

import os
import shutil
import warnings
from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from twophase._crash import AFTER_DECISION, AFTER_PRE_COMMIT, BEFORE_DECISION, CRASH_POINTS
from twophase._state import StateStore
from twophase.sink import TwoPhaseCommitSink
from twophase.spark import Commits
from twophase.testing.contract import list_in_doubt
from twophase.testing.driver import (
    PIPELINED_COMMITS_DEPRECATED,
    DriverSpec,
    KeyedFeed,
    RunResult,
    crash_marker,
    generate_feed,
    generate_keyed_feed,
    launch,
)
from twophase.testing.jvm import ensure_archive
from twophase.testing.suite import TargetSuite
from twophase.testing.target import Target

#: The public API (the deprecated :class:`SinkTarget` is kept out of it).
__all__ = ["DECISION_POINTS", "EXECUTOR_POINTS", "LOST_STATE_MESSAGE", "ROWS_PER_FILE",
           "CrashSuite", "FeedSource", "KeyedCrashSuite", "KeyedFeedTarget"]

ROWS_PER_FILE = 100
#: Crash points reached in a task: on a cluster they kill the task's executor, not the driver.
EXECUTOR_POINTS = (AFTER_PRE_COMMIT,)
#: Either side of the decision (recovery aborts and replays; recovery commits): the points for a
#: suite whose sink, adapter or way of running the driver (a cluster, Spark Connect, another
#: source) goes through every point in another suite.
DECISION_POINTS = (BEFORE_DECISION, AFTER_DECISION)
LOST_STATE_MESSAGE = "there is no state file"


@dataclass(frozen=True)
class FeedSource:
    """The feed delivered by another system than files: ``fill`` puts the generated feed (its
    directory) there; ``spec`` are the :class:`DriverSpec` fields that read it from there (say
    ``{"source_kafka": {...}}``), ``spark_conf`` what Spark needs for it (under the suite's)."""

    spec: dict[str, Any]
    fill: Callable[[Path], object]
    spark_conf: dict[str, str] = field(default_factory=dict)

    def apply(self, spec: DriverSpec, feed_dir: Path) -> DriverSpec:
        """Fill the source with the feed in ``feed_dir``; ``spec`` reading from the source."""
        self.fill(feed_dir)
        return replace(spec, spark_conf={**self.spark_conf, **spec.spark_conf}, **self.spec)


class CrashSuite(TargetSuite):
    """Inherit it as ``TestXxx(CrashSuite)``; give it a ``target`` (see above)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if hasattr(cls, "visible") and not any(
                issubclass(base, CrashSuite) and hasattr(base, "visible")
                for base in cls.__bases__):  # once, where a suite first gets it
            warnings.warn(SUITE_VISIBLE_DEPRECATED.format(name=cls.__qualname__),
                          DeprecationWarning, stacklevel=2)
        pipelined = cls.__dict__.get("pipelined_commits")
        if pipelined is not None:
            warnings.warn(PIPELINED_COMMITS_DEPRECATED.format(name=cls.__qualname__),
                          DeprecationWarning, stacklevel=2)
            cls.commits = "behind" if pipelined else "inline"

    check_lost_state = False
    #: The points the driver is killed at, one per batch (a sink group's: GROUP_CRASH_POINTS).
    crash_points: tuple[str, ...] = CRASH_POINTS
    #: ``write_stream``'s ``foreach_batch`` (None: chosen by ``write_stream``).
    foreach_batch: bool | None = None
    #: The stream's trigger (None: ``availableNow``); one that runs until stopped (as
    #: ``{"processingTime": "0 seconds"}``) commits each batch behind the next, and each run
    #: stops its query once the feed is written.
    trigger: dict[str, Any] | None = None
    #: ``write_stream``'s ``commits`` (``"auto"``: chosen for the trigger).
    commits: Commits = "auto"
    #: Deprecated, removed in 0.6.0: ``commits = "behind"`` (True) or ``"inline"`` (False).
    pipelined_commits: bool | None = None
    fresh_host_per_run = False
    rows_per_file = ROWS_PER_FILE

    @pytest.fixture
    def state(self) -> tuple[str | None, dict[str, Any]]:
        """The state location and its options; (None, {}): inside the checkpoint."""
        return None, {}

    @pytest.fixture
    def spark_conf(self) -> dict[str, str]:
        """Spark settings of the driver; ``spark.master`` runs it on a cluster (see below)."""
        return {}

    @pytest.fixture
    def driver_disk(self, tmp_path: Path) -> Path:
        """Where the checkpoint (and a local state) go: the driver's own disk."""
        return tmp_path

    @pytest.fixture
    def source(self) -> FeedSource | None:
        """How the feed reaches the driver; None: JSON files (see :class:`FeedSource`)."""
        return None

    def test_a_driver_killed_at_every_point_in_turn_delivers_every_row_exactly_once(
        self, target: Target, state: tuple[str | None, dict[str, Any]],
        spark_conf: dict[str, str], driver_disk: Path, tmp_path: Path, *,
        source: FeedSource | None
    ) -> None:
        given, target = target, self._read_by_suite(target)
        assert not self.check_lost_state or AFTER_DECISION in self.crash_points, \
            f"check_lost_state needs {AFTER_DECISION} among the crash points"
        files = len(self.crash_points) + 2  # a batch before the first crash, one after the last
        expected = self.make_feed(tmp_path / "feed", files)
        ensure_archive()  # every driver of the suite starts from it (twophase.testing.jvm)
        spec = DriverSpec.into(target, tmp_path, checkpoint=str(driver_disk / "ckpt"),
                               foreach_batch=self.foreach_batch, state_location=state[0],
                               state_options=state[1], spark_conf=spark_conf,
                               commits=self.commits,
                               **({} if self.trigger is None else
                                  {"trigger": self.trigger, "stop_when_done": True}))
        if source is not None:
            spec = source.apply(spec, tmp_path / "feed")
        runs = tmp_path / "runs"
        for batch, point in enumerate(_schedule(self.crash_points, spark_conf), start=1):
            crashed = self._launch(spec, runs, batch, crash_at=f"{point}@{batch}")
            if point in EXECUTOR_POINTS and _on_cluster(spark_conf):
                assert crashed.returncode == 0, f"the run failed: {_tail(crashed)}"
                assert crash_marker(runs).exists(), f"no executor died at {point}@{batch}"
            else:
                assert crashed.crashed, f"the driver did not die at {point}@{batch}: " \
                    f"{_tail(crashed)}"
            seen = self.check_after_crash(target, expected, point)
            if self.check_lost_state and point == AFTER_DECISION:
                self._refused_without_state(spec, runs / f"without-state-{point}", target,
                                            seen)
        finished = self._launch(spec, runs, len(self.crash_points) + 1)
        assert finished.returncode == 0, f"the last run failed: {_tail(finished)}"
        self.check_delivered(target, expected)
        final = spec.state_store().read()
        assert final is not None
        assert (final.pending, final.last_done_batch) == ((), files - 1)
        assert list_in_doubt(target.build(), final.namespace) == [], "left in doubt"
        assert target.in_doubt() == [], "left in doubt on the server"
        self.check_finished(given)

    def make_feed(self, feed_dir: Path, files: int) -> Any:
        """Write the feed's ``files`` JSON files into ``feed_dir``; return what the target must
        hold in the end (here: every event_id, once)."""
        return list(range(generate_feed(feed_dir, files=files, rows_per_file=self.rows_per_file)))

    def check_after_crash(self, target: Target, expected: Any, point: str) -> list[int]:
        """What the target shows after a crash at ``point`` is possible (here: no row twice,
        none that is not in the feed); return what a reader sees."""
        seen = target.visible()
        assert len(seen) == len(set(seen)), f"a row is visible twice after a crash at {point}"
        assert set(seen) <= set(expected)
        return seen

    def check_delivered(self, target: Target, expected: Any) -> None:
        """Once the feed is done the target holds ``expected`` (here: every row exactly once)."""
        assert target.visible() == expected, "rows lost or duplicated"

    def check_finished(self, target: Any) -> None:
        """More checks on the target once every row is delivered (none by default): ``target``
        is what the ``target`` fixture returned (typed ``Any`` so that a suite may name its own
        ``Target`` subclass)."""

    def _read_by_suite(self, target: Target) -> Target:
        """``target``, read by the suite's deprecated ``visible(target)`` if it has one."""
        read = getattr(self, "visible", None)
        return target if read is None else _ReadBySuite(target.factory, target.options,
                                                        given=target, read=read)

    def _launch(self, spec: DriverSpec, runs: Path, run: int,
                crash_at: str | None = None) -> RunResult:
        """One run of the driver: in ``runs``, or on a fresh "host" deleted afterwards."""
        if not self.fresh_host_per_run:
            return self.run_driver(spec, runs, crash_at)
        host = runs / f"host-{run}"
        result = self.run_driver(spec, host, crash_at)
        log = runs / f"driver-{run}.log"
        shutil.copy(result.log, log)
        shutil.rmtree(host)  # nothing of this driver's disk reaches the next one
        return replace(result, log=log)

    def run_driver(self, spec: DriverSpec, workdir: Path, crash_at: str | None) -> RunResult:
        """One run of the driver process, armed at ``crash_at``; over Spark Connect, a client
        whose server (the driver) is armed instead."""
        return launch(spec, workdir=workdir, crash_at=crash_at)

    @staticmethod
    def _refused_without_state(spec: DriverSpec, workdir: Path, target: Target,
                               seen: list[int]) -> None:
        """A restart whose state is gone is refused and writes nothing; then it is restored."""
        state_dir = Path(StateStore.for_checkpoint(spec.checkpoint).location)
        workdir.mkdir(parents=True)
        aside = workdir / "state-aside"
        os.rename(state_dir, aside)
        try:
            refused = launch(spec, workdir=workdir)
            assert not refused.crashed and refused.returncode != 0, (
                f"a start without its state ran: {_tail(refused)}")
            assert LOST_STATE_MESSAGE in refused.log.read_text()
            assert target.visible() == seen
        finally:
            os.rename(aside, state_dir)


@dataclass(eq=False)
class KeyedFeedTarget(Target):
    """A fresh, empty table ``(order_id PRIMARY KEY, event_id, ts)`` and, in ``options``, a
    sink over it in the keyed mode: ``key=("order_id",)``, ``version="event_id"``,
    ``deleted="status"`` (the keyed feed's ``'d'``; read, never written)."""

    @abstractmethod
    def state(self) -> dict[int, int]:
        """``order_id -> event_id`` of every row a reader of the table sees."""

    def visible(self) -> list[int]:
        return sorted(self.state().values())


class KeyedCrashSuite(CrashSuite):
    """The crash suite over a change stream into a sink in the keyed mode (give it a
    ``target`` fixture returning a :class:`KeyedFeedTarget`): late, repeated and deleting
    changes (:func:`~twophase.testing.driver.generate_keyed_feed`), the driver killed at each
    point; after each crash every row a reader sees is a change of the feed, in the end the
    table equals the reference computed from the feed (each key's newest change; deleted keys
    absent), nothing in doubt. Either side of the decision by default."""

    crash_points: tuple[str, ...] = DECISION_POINTS

    def make_feed(self, feed_dir: Path, files: int) -> KeyedFeed:
        return generate_keyed_feed(feed_dir, files=files, rows_per_file=self.rows_per_file)

    def check_after_crash(self, target: Target, expected: Any, point: str) -> list[int]:
        assert isinstance(target, KeyedFeedTarget) and isinstance(expected, KeyedFeed)
        stray = set(target.state().items()) - expected.upserts
        assert not stray, f"after a crash at {point} the table holds rows no change of the " \
            f"feed wrote: {sorted(stray)[:5]}"
        return target.visible()

    def check_delivered(self, target: Target, expected: Any) -> None:
        assert isinstance(target, KeyedFeedTarget) and isinstance(expected, KeyedFeed)
        assert target.state() == expected.newest, "the table differs from the feed's newest " \
            "changes"


def _on_cluster(spark_conf: dict[str, str]) -> bool:
    return not spark_conf.get("spark.master", "local").startswith("local")


def _schedule(points: Sequence[str], spark_conf: dict[str, str]) -> list[str]:
    """The crash points in turn; on a cluster the executor's last, as it kills an executor and
    the run goes on to the end of the feed."""
    if not _on_cluster(spark_conf):
        return list(points)
    return [p for p in points if p not in EXECUTOR_POINTS] + list(EXECUTOR_POINTS)


def _tail(run: RunResult, lines: int = 30) -> str:
    """The end of a driver's log, for an assertion message."""
    return f"see {run.log}:\n" + "\n".join(run.log.read_text().splitlines()[-lines:])


# -- deprecated: removed in 0.6.0 (see CHANGELOG.md) ------------------------------------------

SINK_TARGET_DEPRECATED = (
    "twophase.testing.crash.SinkTarget is deprecated since 0.2.0 and is removed in 0.6.0: "
    "use a subclass of twophase.testing.Target (the same factory and options) whose visible() "
    "reads the target, and drop the suite's visible(target)."
)
SUITE_VISIBLE_DEPRECATED = (
    "{name}.visible(target) is deprecated since 0.2.0 and is removed in 0.6.0: move it onto "
    "a subclass of twophase.testing.Target as visible(self) and return that from the suite's "
    "target fixture (in place of twophase.testing.crash.SinkTarget)."
)


@dataclass(eq=False)
class SinkTarget(Target):
    """Deprecated (0.1.0's crash-suite target), removed in 0.6.0: a sink as the driver process
    builds it, ``"module:Class"`` and its options, read by the suite's ``visible(target)``.
    Use a :class:`~twophase.testing.Target` subclass instead (it reads itself)."""

    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        warnings.warn(SINK_TARGET_DEPRECATED, DeprecationWarning, stacklevel=3)

    def visible(self) -> list[int]:
        raise NotImplementedError("a SinkTarget is read by its suite's visible(target): "
                                  + SINK_TARGET_DEPRECATED)


@dataclass(eq=False)
class _ReadBySuite(Target):
    """A target that a suite's deprecated ``visible(target)`` reads."""

    given: Target | None = None
    read: Callable[[Target], list[int]] | None = None

    def build(self) -> TwoPhaseCommitSink[Any]:
        assert self.given is not None
        return self.given.build()

    def visible(self) -> list[int]:
        assert self.given is not None and self.read is not None
        return self.read(self.given)

    def in_doubt(self) -> list[Any]:
        assert self.given is not None
        return self.given.in_doubt()
