"""A PostgreSQL table and an Iceberg table visible in the same instant: a sink group of a staged
:class:`~sinks.postgres.PostgresSink` (``publish="staged"``) and an
:class:`~sinks.iceberg.IcebergSink` whose SQL catalog is in the same database commits each
batch in ONE local transaction (:class:`twophase.kit.LocalCommitMember`).

The proof: a reader polls, in one REPEATABLE READ transaction, the table's event ids and the
catalog row's ``metadata_location`` (then the files of that metadata, read by pyiceberg), and
never finds a row in one and not the other, while a Spark driver is killed at the crash points
(``-m long``, CI time: either side of the decision, and every point a group's driver passes
but ``between_members``, which one local stage never reaches). Without Spark, in CI: the group
commits in one stage, an error in the lake's swap rolls the table back too, and the staged sink
alone commits, aborts and lists what is in doubt.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import StaticTable

from setups import IcebergSetup, PostgresSetup, Target
from setups.servers.postgres import PostgresServer
from sinks.iceberg import local_commit
from sinks.postgres.schema import Table
from sinks.postgres.staging import staging_table_of
from twophase import (
    AbortOutcome,
    CommitOutcome,
    Handle,
    RetryableError,
    SinkGroup,
    StageCommits,
)
from twophase._crash import CRASH_POINTS
from twophase.testing import GroupTarget
from twophase.testing.contract import (
    ORDER_COLUMNS,
    abort,
    commit,
    list_in_doubt,
    orders,
    prepare,
    use_query_id,
)
from twophase.testing.crash import DECISION_POINTS, CrashSuite

#: How often the reader looks (a snapshot of both tables each time).
POLL_S = 0.05


@dataclass(eq=False)
class StagedTarget(Target):
    """A staged PostgreSQL table: in doubt are also the transactions with staged rows."""

    def in_doubt(self) -> list[Any]:
        assert isinstance(self.setup, PostgresSetup)
        staging = staging_table_of(Table("public", self.options["table"]))
        staged = self.setup.view.query(sql.SQL(
            "SELECT DISTINCT _twophase_txn FROM {} ORDER BY 1").format(staging.ident)) \
            if self.setup.view.query("SELECT to_regclass(%s)", (str(staging),))[0][0] else []
        return [*super().in_doubt(), *(("staged", row[0]) for row in staged)]


def staged_target(setup: PostgresSetup) -> StagedTarget:
    return StagedTarget(setup.factory, setup.target_options(publish="staged"), setup)


def same_instant_group(postgres_setup: PostgresSetup, iceberg: IcebergSetup) -> GroupTarget:
    return GroupTarget.of({"orders": staged_target(postgres_setup),
                           "lake": iceberg.new_target()})


class SameInstantReader:
    """Polls both tables in one REPEATABLE READ snapshot; records every disagreement."""

    def __init__(self, server: PostgresServer, group: GroupTarget) -> None:
        self.server = server
        self.table = group.members["orders"].options["table"]
        lake = group.members["lake"].options
        self.catalog = str(lake["catalog_name"])
        self.namespace, self.name = str(lake["table"]).rsplit(".", 1)
        self.seen: list[int] = []
        self.mismatches: list[tuple[int, int, list[int]]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="same-instant-reader",
                                        daemon=True)
        self._locations: dict[str, set[int]] = {}

    def __enter__(self) -> SameInstantReader:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception as exc:  # a reader's hiccup is counted, not fatal
                self.errors.append(repr(exc))
            time.sleep(POLL_S)

    def poll(self) -> tuple[set[int], set[int]]:
        params = self.server.params
        with psycopg.connect(**params.client_options()) as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            with conn.transaction():
                table = {row[0] for row in conn.execute(sql.SQL("SELECT event_id FROM {}")
                                                        .format(sql.Identifier(self.table)))}
                row = conn.execute(
                    "SELECT metadata_location FROM iceberg_tables WHERE catalog_name = %s AND "
                    "table_namespace = %s AND table_name = %s",
                    (self.catalog, self.namespace, self.name)).fetchone() \
                    if conn.execute("SELECT to_regclass('iceberg_tables')").fetchone() \
                    != (None,) else None
        lake = self._lake(row[0]) if row and row[0] else set()
        if table != lake:
            self.mismatches.append((len(table), len(lake), sorted(table ^ lake)[:10]))
        self.seen.append(len(table))
        return table, lake

    def _lake(self, location: str) -> set[int]:
        """The event ids of the metadata file ``location`` (immutable: read once)."""
        if location not in self._locations:
            table = StaticTable.from_metadata(location)
            self._locations[location] = (
                set() if table.current_snapshot() is None else
                set(table.scan(selected_fields=("event_id",)).to_arrow()
                    .column("event_id").to_pylist()))
        return self._locations[location]

    def check(self) -> None:
        assert self.mismatches == [], f"a batch in one table and not the other: " \
            f"{self.mismatches[:5]}"
        assert len({n for n in self.seen if n}) >= 2, \
            f"the reader saw no batch arrive mid-run: {sorted(set(self.seen))}"


# -- without Spark ---------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def fresh_query() -> None:
    """A query id of this test's own (the marker table is the database's, shared)."""
    use_query_id(str(uuid.uuid4()))


def _batch(group: SinkGroup, batch: int, partitions: int = 3, rows: int = 4) -> list[Handle]:
    group.check_schema(ORDER_COLUMNS)
    return [prepare(group, orders((batch * partitions + p) * rows, rows), batch=batch,
                    partition=p, arrow=p % 2 == 1) for p in range(partitions)]


def _commit(group: SinkGroup, handles: list[Handle]) -> list[CommitOutcome]:
    with group.committer() as committer:
        stages = committer.commit_stages(handles)
        outcomes = [outcome for stage in stages
                    for outcome in stage.committer.commit_handles(
                        stage.handles, StageCommits(stage.committer))]
        committer.finish_batch("orders", 0, handles)
    return outcomes


def test_the_group_commits_both_tables_in_one_local_transaction(
        postgres_setup: PostgresSetup, iceberg_pg_setup: IcebergSetup,
        postgres: PostgresServer) -> None:
    target = same_instant_group(postgres_setup, iceberg_pg_setup)
    group = target.build()
    assert isinstance(group, SinkGroup)
    handles = _batch(group, 0)
    with group.committer() as committer:
        assert [stage.label for stage in committer.commit_stages(handles)] == ["orders+lake"]
    assert _commit(group, handles) == [CommitOutcome.COMMITTED] * 6
    reader = SameInstantReader(postgres, target)
    table, lake = reader.poll()
    assert table == lake == set(range(12))
    assert _commit(group, handles) == [CommitOutcome.ALREADY_COMMITTED] * 6
    assert target.visible() == list(range(12))
    assert target.in_doubt() == []


def test_a_failed_swap_of_the_lake_rolls_the_table_back_too(
        postgres_setup: PostgresSetup, iceberg_pg_setup: IcebergSetup,
        postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> None:
    target = same_instant_group(postgres_setup, iceberg_pg_setup)
    group = target.build()
    assert isinstance(group, SinkGroup)
    handles = _batch(group, 0)

    def raced(*_args: object) -> None:
        raise CommitFailedException("Table has been updated by another process")

    with monkeypatch.context() as patch:
        patch.setattr(local_commit._SwapOn, "commit_table", raced)
        with pytest.raises(RetryableError):
            _commit(group, handles)
    assert SameInstantReader(postgres, target).poll() == (set(), set())
    assert len(target.members["orders"].in_doubt()) == 3  # staged, not published
    assert _commit(group, handles) == [CommitOutcome.COMMITTED] * 6
    assert SameInstantReader(postgres, target).poll() == (set(range(12)), set(range(12)))


def test_the_staged_sink_alone_commits_aborts_and_lists_in_doubt(
        postgres_setup: PostgresSetup) -> None:
    target = staged_target(postgres_setup)
    sink = target.build()
    sink.check_schema(ORDER_COLUMNS)
    kept, dropped = (prepare(sink, orders(p * 5, 5), partition=p) for p in range(2))
    assert sorted(h.txn_id for h in list_in_doubt(sink, "orders")) == sorted(
        [kept.txn_id, dropped.txn_id])
    assert target.visible() == []
    assert commit(sink, kept) == CommitOutcome.COMMITTED
    assert commit(sink, kept) == CommitOutcome.ALREADY_COMMITTED
    assert abort(sink, dropped) == AbortOutcome.ABORTED
    assert abort(sink, dropped) == AbortOutcome.NOT_FOUND
    assert abort(sink, kept) == AbortOutcome.NOT_FOUND
    assert target.visible() == list(range(5))
    assert list_in_doubt(sink, "orders") == []
    assert target.in_doubt() == []
    with contextlib.suppress(Exception):
        sink.committer().close()


# -- under the crash suite -------------------------------------------------------------------------

@pytest.mark.spark
@pytest.mark.crash
class SameInstantCrashes(CrashSuite):
    """A reader of both tables in one snapshot never sees them disagree, through the crashes."""

    reader: SameInstantReader | None = None

    @pytest.fixture
    def target(self, postgres_setup: PostgresSetup, iceberg_pg_setup: IcebergSetup,
               postgres: PostgresServer) -> Any:
        group = same_instant_group(postgres_setup, iceberg_pg_setup)
        with SameInstantReader(postgres, group) as reader:
            self.reader = reader
            yield group

    def check_finished(self, target: Any) -> None:
        assert self.reader is not None
        self.reader.poll()
        self.reader.check()


@pytest.mark.long  # CI time: the one local transaction, its failed swap and its recommit in CI
# above (test_the_group_commits_both_tables_in_one_local_transaction and the tests after it);
# recovery either side of the decision in CI by every other crash suite
class TestSameInstantCrashes(SameInstantCrashes):
    """Either side of the decision."""

    crash_points = DECISION_POINTS


@pytest.mark.long
class TestSameInstantEveryPoint(SameInstantCrashes):
    """Every point of the driver (one local stage: there is no point between the members)."""

    crash_points = CRASH_POINTS
