"""Public API stability: a sink and its tests written to an earlier release's README run
against the current code, passing, with a DeprecationWarning naming each replacement.

``tests/data/compat_0_1_0`` holds a PostgreSQL sink a newcomer wrote from 0.1.0's README
(commit :data:`RELEASE_COMMIT`; ``git show <commit>:README.md``, "Writing your own sink") and
its tests with that release's suite API (``compat_checks.py``): ``twophase.kit``'s
``CommitsViaCommitter``, the contract suite's ``sink`` fixture and ``visible(sink)``, the crash
suite's ``SinkTarget``, ``visible(target)`` and ``check_finished(target)``. They run unchanged,
as the newcomer runs them: pytest from that directory (its own root), against the private
PostgreSQL server. The contract suite runs in CI; the crash suite (a Spark driver SIGKILLed at
every point) under ``-m long``; the crash suite's shims also without Spark, here. The one line
added to the newcomer's code is a ``type: ignore`` on its sink's import: mypy checks that
directory as the package ``tests.data.compat_0_1_0``, pytest runs it as the newcomer's root.
See CHANGELOG.md and README's "Versioning and deprecations".
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from setups.servers.postgres import PgView
from sinks.sqlite import SQLiteSink
from tests import DATA, REPO
from twophase import (
    AbortOutcome,
    CommitOutcome,
    Committer,
    Handle,
    SinkGroup,
    TwoPhaseCommitSink,
)
from twophase.kit import COMMITS_VIA_COMMITTER_DEPRECATED, CommitsViaCommitter
from twophase.sink import DRIVER_SIDE_ON_SINK_DEPRECATED
from twophase.testing import Target
from twophase.testing.contract import (
    SINK_FIXTURE_DEPRECATED,
    SinkContract,
    context,
    list_in_doubt,
    orders,
    prepare,
)
from twophase.testing.crash import (
    SINK_TARGET_DEPRECATED,
    SUITE_VISIBLE_DEPRECATED,
    CrashSuite,
    SinkTarget,
)

COMPAT = DATA / "compat_0_1_0"
#: The release whose README the newcomer followed, and its commit (CHANGELOG.md's 0.1.0).
RELEASE, RELEASE_COMMIT = "0.1.0", "8da4bfe9cc4985f6677a0fff962ae3e86a94cd1f"
RUN_TIMEOUT_S = 1800
CONTRACT_TESTS = sorted(name for name in dir(SinkContract) if name.startswith("test_"))
CRASH_TESTS = sorted(name for name in dir(CrashSuite) if name.startswith("test_"))


@dataclass(frozen=True)
class Run:
    """One pytest run of the newcomer's tests: its outcome and every warning it recorded."""

    result: subprocess.CompletedProcess[str]
    warnings: list[dict[str, Any]]

    def deprecations(self) -> dict[str, str]:
        """Each DeprecationWarning's message -> the file it points at."""
        return {w["message"]: Path(w["filename"]).name for w in self.warnings
                if w["category"] == "DeprecationWarning"}


def run_newcomers_tests(pg: PgView, tmp_path: Path, *select: str) -> Run:
    """pytest over ``compat_checks.py`` from its directory, ``select`` (-k/-m) applied."""
    recorded = tmp_path / "warnings.jsonl"
    recorded.touch()
    env = {**os.environ, "MY_PG": json.dumps(pg.server.params.client_options()),
           "COMPAT_WARNINGS": str(recorded), "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "compat_checks.py", "-p", "tests.compat_record",
         "-p", "no:cacheprovider", "-q", "-rA", "-W", "always::DeprecationWarning",
         "--basetemp", str(tmp_path / "basetemp"), *select],
        cwd=COMPAT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
        check=False)
    lines = recorded.read_text().splitlines()
    return Run(result, [json.loads(line) for line in lines])


def passed(run: Run, suite: str, tests: list[str]) -> None:
    """Every test of ``suite`` passed, and nothing else failed or errored."""
    output = run.result.stdout + run.result.stderr
    assert run.result.returncode == 0, output[-6000:]
    for test in tests:
        assert f"PASSED compat_checks.py::{suite}::{test}" in output, (test, output[-6000:])
    assert " failed" not in output and " error" not in output, output[-6000:]


def test_the_newcomers_sink_passes_the_contract_suite_of_its_release_with_deprecations(
        pg: PgView, tmp_path: Path) -> None:
    run = run_newcomers_tests(pg, tmp_path, "-k", "Contract")
    passed(run, "TestMyPgSinkContract", CONTRACT_TESTS)
    deprecations = run.deprecations()
    assert deprecations.get(COMMITS_VIA_COMMITTER_DEPRECATED.format(name="MyPgSink")) == \
        "my_pg_sink.py", deprecations
    assert deprecations.get(SINK_FIXTURE_DEPRECATED.format(name="TestMyPgSinkContract")) == \
        "compat_checks.py", deprecations
    assert deprecations.get(SUITE_VISIBLE_DEPRECATED.format(name="TestMyPgSinkCrashes")) == \
        "compat_checks.py", deprecations  # the module is imported whole
    replacements = {"CommitsViaCommitter": "committer()", "sink fixture": "twophase.testing"
                    ".Target", "visible(target)": "twophase.testing.Target"}
    for old, new in replacements.items():
        assert any(old in message and new in message for message in deprecations), (old, new)


@pytest.mark.long
@pytest.mark.spark
@pytest.mark.crash
def test_the_newcomers_sink_passes_both_suites_of_its_release_with_deprecations(
        pg: PgView, tmp_path: Path) -> None:
    run = run_newcomers_tests(pg, tmp_path)
    passed(run, "TestMyPgSinkContract", CONTRACT_TESTS)
    passed(run, "TestMyPgSinkCrashes", CRASH_TESTS)
    deprecations = run.deprecations()
    assert deprecations.get(SINK_TARGET_DEPRECATED) == "compat_checks.py", deprecations


# -- the shims, without a server -------------------------------------------------------------


class Memory(Committer):
    """Commits into a list; says whether it was closed."""

    outcomes: list[str] = []  # noqa: RUF012 - one test at a time

    def commit(self, handle: Handle) -> CommitOutcome:
        self.outcomes.append(f"commit {handle.txn_id}")
        return CommitOutcome.COMMITTED

    def abort(self, handle: Handle) -> AbortOutcome:
        self.outcomes.append(f"abort {handle.txn_id}")
        return AbortOutcome.ABORTED

    def close(self) -> None:
        self.outcomes.append("closed")


def memory_sink_class() -> type[TwoPhaseCommitSink[None]]:
    """A sink in 0.1.0's shape: CommitsViaCommitter first among its bases, a committer."""
    class OldShape(CommitsViaCommitter, TwoPhaseCommitSink[None]):
        kind = "memory"

        def begin_transaction(self, ctx: Any) -> None: ...
        def write(self, txn: None, rows: Any) -> None: ...
        def pre_commit(self, txn: None) -> Handle: raise NotImplementedError
        def list_in_doubt(self, namespace: str) -> list[Handle]: return []
        def committer(self) -> Committer: return Memory(self)

    return OldShape


def test_commits_via_committer_only_warns_and_the_sink_commits_through_its_committer() -> None:
    with pytest.warns(DeprecationWarning, match=r"CommitsViaCommitter is deprecated .* remove "
                      r"it from .*OldShape's bases") as caught:
        sink_class = memory_sink_class()
    assert Path(caught[0].filename) == Path(__file__), "the warning names the class statement"
    assert vars(CommitsViaCommitter).keys().isdisjoint({"commit", "abort", "committer"})
    handle = Handle(context().txn_id, "memory", 0)
    Memory.outcomes.clear()
    with pytest.warns(DeprecationWarning, match=r"OldShape.commit\(\) on the sink is deprecated"):
        assert sink_class().commit(handle) is CommitOutcome.COMMITTED  # until 0.6.0
    with pytest.warns(DeprecationWarning, match=r"OldShape.abort\(\) on the sink is deprecated"):
        assert sink_class().abort(handle) is AbortOutcome.ABORTED
    assert Memory.outcomes == [f"commit {handle.txn_id}", "closed",
                               f"abort {handle.txn_id}", "closed"]


def test_the_crash_suites_old_target_and_visible_are_read_as_a_target() -> None:
    checked: list[Target] = []
    with pytest.warns(DeprecationWarning, match=r"OldCrashes.visible\(target\) is deprecated"):
        class OldCrashes(CrashSuite):
            def visible(self, target: SinkTarget) -> list[int]:
                return [len(target.options["rows"])]

            def check_finished(self, target: Target) -> None:
                checked.append(target)

    with pytest.warns(DeprecationWarning, match="SinkTarget is deprecated") as caught:
        old = SinkTarget("sinks.sqlite:SQLiteSink", {"rows": [1, 2, 3]})
    assert Path(caught[0].filename) == Path(__file__)
    suite = OldCrashes()
    read = suite._read_by_suite(old)
    assert (read.factory, read.options, read.visible(), read.in_doubt()) == (
        old.factory, old.options, [3], [])
    with pytest.raises(NotImplementedError, match="visible\\(target\\)"):
        old.visible()

    class NewCrashes(CrashSuite):
        pass

    assert NewCrashes()._read_by_suite(old) is old  # a suite without visible reads the target


def test_the_driver_side_called_on_a_prebuilt_sink_warns_and_still_answers(
        tmp_path: Path) -> None:
    """0.4.0's ``sink.list_in_doubt(ns)``, ``sink.purge_commit_records(...)``,
    ``sink.commit(handle)``, ``group.list_in_doubt(ns)``: the driver side lives in the
    committer since 0.5.0; until 0.6.0 each still answers, through a committer of its own,
    with a DeprecationWarning naming the committer's method, pointing at the caller."""
    with sqlite3.connect(tmp_path / "orders.db") as connection:
        connection.execute("CREATE TABLE orders (event_id, order_id, status, ts)")
    sink = SQLiteSink(tmp_path / "orders.db", "orders")
    kept, dropped = (prepare(sink, orders(2 * p, 2), partition=p) for p in range(2))

    def deprecated(method: str, name: str = "SQLiteSink") -> Any:
        message = DRIVER_SIDE_ON_SINK_DEPRECATED.format(sink=name, method=method)
        assert f"committer.{method}(...)" in message, "it names the replacement"
        return pytest.warns(DeprecationWarning, match=re.escape(message))

    with deprecated("list_in_doubt") as caught:
        listed = sink.list_in_doubt("orders")
    assert Path(caught[0].filename) == Path(__file__), "the warning points at the caller"
    assert sorted(h.txn_id for h in listed) == sorted([kept.txn_id, dropped.txn_id])
    with deprecated("commit"):
        assert sink.commit(kept) is CommitOutcome.COMMITTED
    with deprecated("abort"):
        assert sink.abort(dropped) is AbortOutcome.ABORTED
    with deprecated("purge_commit_records"):
        assert sink.purge_commit_records("orders", datetime.now(UTC) + timedelta(hours=1)) == 1
    assert list_in_doubt(sink, "orders") == []  # the replacement answers without a warning

    group = SinkGroup({"orders": sink})
    member = prepare(sink, orders(4, 1), namespace="orders-orders", batch=1)
    with deprecated("list_in_doubt", "SinkGroup"):
        (partition,) = group.list_in_doubt("orders")
    assert [h.txn_id for _, h in group.member_handles(partition)] == [member.txn_id]
