"""The protocol model (twophase.testing.model) over every landed sink, and broken protocols caught.

Each sink runs generated crash schedules against its real server, one fresh external system per
example (a new SQLite file, a new MariaDB table, a new S3 prefix). Then eight deliberately
broken variants of the protocol, written here by subclassing (the framework is untouched), each
run under the same model over SQLite: the model must find a counterexample within the CI budget
(each was found within 50 examples of its 200 once every example began with a run; before, a
third of the examples did nothing and two variants were found only by luck of the seed).

Budget (profile ``twophase-ci``, derandomized, 25 steps per example): the examples each sink's
setup registers (``model_ci_examples``), the group's below; the module runs in about 80 s on
the two-core machine with its servers, most of it Kafka's and PostgreSQL's.
``TWOPHASE_HYPOTHESIS_PROFILE=long`` selects the long profile (``chaos/model.py`` runs it per
sink and prints the counts).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase

from setups import SETUPS, SinkSetup, SQLiteSetup
from tests.sink_sets import fixture_of
from twophase import CommitOutcome, CommitStage, Handle
from twophase._coordinator import Coordinator
from twophase._pipeline import CommitPipeline
from twophase._state import Decision, State, StateStore
from twophase.testing.model import (
    PROFILE_ENV,
    ModelStats,
    run_model,
)
from twophase.testing.target import ExactlyOnceError, GroupTarget, Target

#: Examples of the model over a sink group (two SQLite tables) in the CI profile (a sink's:
#: its setup's ``model_ci_examples``; the long profile ignores both).
GROUP_CI_EXAMPLES = 15
#: Examples of the model over pipelined commits (SQLite, a sink and a group) in the CI profile.
PIPELINED_CI_EXAMPLES = 20
MEMORY_FS = Path("/dev/shm")
#: The broken variants must be caught within this many examples (over SQLite), found but not
#: shrunk (shrinking a schedule takes minutes; a real failure of the model is shrunk).
BROKEN_BUDGET = 200
FIND_ONLY = (Phase.explicit, Phase.generate)


def ci_examples(count: int) -> int | None:
    """``count`` (a CI bound), or None under the long profile (its own count applies)."""
    return None if os.environ.get(PROFILE_ENV) == "long" else count


# -- a fresh external system per example: the sink's setup's new target ------------------------


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """A directory in memory (tmpfs) where the machine has one: the model fsyncs a lot."""
    if not MEMORY_FS.is_dir():
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(dir=MEMORY_FS, prefix="twophase-model-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def report(sink: str, stats: ModelStats) -> None:
    print(f"\n{sink}: {stats.examples} examples, {stats.steps} steps, "
          f"{stats.seconds:.0f}s, faults {dict(stats.faults)}, "
          f"examples by batches decided {dict(sorted(stats.decided_batches.items()))}")


# -- the model over every sink ------------------------------------------------------------------


def model_setup(registered: type[SinkSetup], scratch: Path, request: pytest.FixtureRequest
                ) -> contextlib.AbstractContextManager[SinkSetup]:
    """The sink's setup; one with no server keeps its files in ``scratch`` (on tmpfs: the
    model fsyncs a lot)."""
    if registered.servers:
        return contextlib.nullcontext(request.getfixturevalue(fixture_of(registered.name)))
    return registered.over(scratch, {})


@pytest.mark.parametrize("name", SETUPS)
def test_model_over_every_sink(name: str, scratch: Path, request: pytest.FixtureRequest) -> None:
    registered = SETUPS[name]
    with model_setup(registered, scratch, request) as setup:
        stats = run_model(setup.model_target, state_root=str(scratch),
                          max_examples=ci_examples(registered.model_ci_examples))
    report(name, stats)
    assert stats.examples >= 1


@pytest.mark.parametrize("group", [False, True], ids=["sink", "group"])
def test_model_over_pipelined_commits(scratch: Path, *, group: bool) -> None:
    """Each batch commits behind the next (twophase._pipeline): the next batch's tasks run,
    and the driver dies or the sink fails, while the batch behind commits; still exactly
    once, and in order (a group's members in commit order)."""
    setup = SQLiteSetup(scratch)
    stats = run_model(functools.partial(sqlite_group, setup) if group else setup.new_target,
                      pipeline_class=CommitPipeline, state_root=str(scratch),
                      max_examples=ci_examples(PIPELINED_CI_EXAMPLES))
    report(f"pipelined {'group' if group else 'sink'}", stats)
    assert stats.faults["driver kill"] > 0


def sqlite_group(setup: SQLiteSetup) -> Target:
    """Two fresh SQLite tables as one sink group (each its own database file)."""
    return GroupTarget.of({"orders": setup.new_target(), "changes": setup.new_target()})


def test_model_over_a_sink_group(scratch: Path) -> None:
    """Crashes also between the members' commits; every member exactly once, in order."""
    stats = run_model(functools.partial(sqlite_group, SQLiteSetup(scratch)),
                      max_examples=ci_examples(GROUP_CI_EXAMPLES),
                      state_root=str(scratch))
    report("group", stats)
    assert stats.examples >= 1


# -- broken protocols: the model must catch each ------------------------------------------------


class CommitsMembersOutOfOrder(Coordinator):
    """Commits a sink group's last member first."""

    def _commit_all(self, decision: Decision) -> list[CommitOutcome]:
        stages = self.committer.commit_stages(decision.handles)[::-1]
        return [outcome for stage in stages
                for outcome in self._commit_stage(decision.batch, stage)]


class CommitsAStageTwice(Coordinator):
    """Commits every commit stage again once it committed (a stage commit that does not know
    that a settle already made the whole stage visible)."""

    def _commit_stage(self, batch: int, stage: CommitStage) -> list[CommitOutcome]:
        super()._commit_stage(batch, stage)
        return super()._commit_stage(batch, stage)


class DecidesWithAMemberUnprepared(Coordinator):
    """Decides a sink group's batch with the last member of one partition left out."""

    def _decide(self, batch: int, query_id: str, handles: Sequence[Handle]) -> Decision:
        first, *rest = handles
        members = dict(first.data["members"])
        members.pop(next(reversed(members)))
        return super()._decide(batch, query_id, [replace(first, data={"members": members}),
                                                 *rest])


class CommitsBeforeTheDecisionIsDurable(Coordinator):
    """Makes the batch visible first, then writes the decision."""

    def _decide(self, batch: int, query_id: str, handles: Sequence[Handle]) -> Decision:
        self._commit_all(Decision(batch, self.epoch, time.time(), tuple(handles)))
        return super()._decide(batch, query_id, handles)


class AbortsADecidedBatch(Coordinator):
    """Rolls back what Spark aborts or replays, decided or not."""

    def abort_batch(self, batch: int, query_id: str | None, handles: Sequence[Handle]) -> None:
        self._abort_all(handles)

    def _finish_replay(self, state: State, batch: int, handles: Sequence[Handle]) -> None:
        decision = state.decision(batch)
        self._abort_all([*handles, *(decision.handles if decision else ())])


class ForgetsTheEpoch(StateStore):
    """Lets every run write the state, also a zombie."""

    def check_epoch(self, state: State, epoch: int) -> None:
        return None


class NeverSweepsOrphans(Coordinator):
    """Leaves the transactions of failed attempts and crashed runs in doubt."""

    def _sweep(self, state: State, query_id: str, *, up_to_batch: int,
               keep: Any) -> None:
        return None


class CommitsAheadOfTheBatchBehind(CommitPipeline):
    """Decides and commits the next batch without waiting for the batch committing behind."""

    def wait_for_commit(self) -> bool:
        return True


class LeavesEarlierBatchesPending(Coordinator):
    """Decides a batch without first committing the decided batches before it."""

    def _finish_earlier(self, state: State, batch: int) -> None:
        return None


@pytest.mark.parametrize("variant", [
    pytest.param({"coordinator_class": CommitsBeforeTheDecisionIsDurable},
                 id="commit-before-the-decision-is-durable"),
    pytest.param({"coordinator_class": AbortsADecidedBatch}, id="abort-a-decided-batch"),
    pytest.param({"store_class": ForgetsTheEpoch}, id="forget-the-epoch-check"),
    pytest.param({"coordinator_class": NeverSweepsOrphans}, id="never-sweep-orphans"),
    pytest.param({"coordinator_class": CommitsMembersOutOfOrder, "group": True},
                 id="commit-a-group-out-of-order"),
    pytest.param({"coordinator_class": CommitsAStageTwice, "group": True},
                 id="commit-a-stage-twice"),
    pytest.param({"coordinator_class": DecidesWithAMemberUnprepared, "group": True},
                 id="decide-a-group-with-a-member-unprepared"),
    pytest.param({"coordinator_class": LeavesEarlierBatchesPending,
                  "pipeline_class": CommitsAheadOfTheBatchBehind},
                 id="commit-ahead-of-the-batch-behind"),
])
def test_the_model_catches_a_broken_protocol(scratch: Path, variant: dict[str, Any]) -> None:
    setup = SQLiteSetup(scratch)
    new_target = (functools.partial(sqlite_group, setup) if variant.pop("group", False)
                  else setup.new_target)
    with pytest.raises(ExactlyOnceError) as caught:
        run_model(new_target, max_examples=BROKEN_BUDGET, derandomize=True,
                  phases=FIND_ONLY, state_root=str(scratch), **variant)
    schedule = "\n".join(getattr(caught.value, "__notes__", ()))
    print(f"\ncaught: {caught.value}\n{schedule}")
