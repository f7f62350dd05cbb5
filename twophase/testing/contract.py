"""The contract suite: every rule of :class:`~twophase.TwoPhaseCommitSink`, as inheritable tests.

A sink's test module subclasses :class:`SinkContract` and gives it a fresh target per test (a
:class:`~twophase.testing.Target`, see :mod:`twophase.testing.suite`)::

    from twophase.testing import Target
    from twophase.testing.contract import SinkContract

    class MyTarget(Target):                  # a sink over a fresh, empty target whose columns
        def visible(self):                   # are ORDER_COLUMNS (event_id, order_id, status, ts)
            return sorted(...)               # the event_id of every row a reader sees

    class TestMySinkContract(SinkContract):
        @pytest.fixture
        def target(self, tmp_path):
            return MyTarget("my_package.sinks:MySink", {"directory": str(tmp_path / "out")})

Every test runs under a query id of its own (:func:`current_query_id`), so transaction ids
never repeat from test to test, also where a system keeps them per server (PostgreSQL's gids
are unique per cluster). Before each test the sink's ``check_schema(ORDER_COLUMNS)`` runs, as
the driver runs it before a query starts; one test expects it to refuse a column the target
lacks. Set ``purges_commit_records = False`` if the sink keeps no proofs it could purge,
``has_schema = False`` if its target has no columns to check. The tests drive the sink (the
``sink`` fixture, built from the target) as the framework does: a task's
begin/write/pre-commit (:func:`prepare`; ``arrow=True``: through ``write_arrow``, as Spark's
data source path does), the driver's committer for commit and abort, other processes for a
writer killed with SIGKILL and for a commit from elsewhere. The builders here
(:func:`context`, :func:`orders`, :func:`prepare`) serve a sink's own tests too, and so do the
driver's calls through a committer (:func:`commit`, :func:`abort`, :func:`list_in_doubt`,
:func:`purge_commit_records`).

Deprecated, removed in 0.6.0 (see ``CHANGELOG.md``): 0.1.0's way, a ``sink`` fixture and the
suite's ``visible(sink)`` in place of ``target``. It still works, with a
:class:`DeprecationWarning` naming the replacement (the suite reads the rows through
``visible(sink)``; the target builds a pickled copy of the fixture's sink).
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from twophase._handle import Handle, TxnId
from twophase._task import arrow_delivery, rows_delivery, run_transaction
from twophase.errors import SchemaMismatchError, TransactionLostError, TwoPhaseError
from twophase.sink import (
    AbortOutcome,
    Column,
    CommitOutcome,
    TransactionContext,
    TwoPhaseCommitSink,
)
from twophase.testing.suite import TargetSuite
from twophase.testing.target import Target

#: Ids are deterministic within a test: the same arguments name the same transaction.
OPENED_AT = time.time()
#: The query id outside a :class:`SinkContract` test (each of those gets a fresh one).
QUERY_ID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
OTHER_QUERY_ID = "ffffffff-4b5a-6978-8796-a5b4c3d2e1f0"
NAMESPACE = "orders"
ORDER_COLUMNS = (
    Column("event_id", "bigint", False),
    Column("order_id", "bigint", False),
    Column("status", "string", False),
    Column("ts", "timestamp", True),
)
FIRST_TS = datetime(2026, 11, 1, tzinfo=UTC)
CONCURRENT_COMMITS = 8
SUBPROCESS_TIMEOUT_S = 60.0


_current_query = [QUERY_ID]


def current_query_id() -> str:
    """The query id of the running test (:data:`QUERY_ID` outside a contract test)."""
    return _current_query[0]


def use_query_id(new: str) -> None:
    """Make ``new`` the query id of what follows (a contract test sets a fresh one)."""
    _current_query[0] = new


def context(*, batch: int = 0, partition: int = 0, attempt: int = 0, epoch: int = 1,
            namespace: str = NAMESPACE, query_id: str | None = None,
            columns: Sequence[Column] = ORDER_COLUMNS) -> TransactionContext:
    """The context of one task's transaction; the same arguments give the same id (under
    ``query_id``, default :func:`current_query_id`)."""
    txn_id = TxnId.open(namespace=namespace, query_id=query_id or current_query_id(),
                        epoch=epoch,
                        batch=batch, partition=partition, attempt=attempt,
                        clock=lambda: OPENED_AT)
    return TransactionContext(txn_id, tuple(columns))


def orders(first: int, count: int, status: str = "paid") -> list[tuple[Any, ...]]:
    """``count`` order rows of ORDER_COLUMNS with event ids from ``first``."""
    return [(i, 1000 + i, status, FIRST_TS + timedelta(seconds=i))
            for i in range(first, first + count)]


def prepare(sink: TwoPhaseCommitSink[Any], rows: Sequence[Sequence[Any]], *,
            arrow: bool = False, **ctx: Any) -> Handle:
    """begin_transaction + write + pre_commit, as an executor's task does; ``arrow=True``:
    the rows go through ``write_arrow`` as record batches of two rows, as on Spark's data
    source path (needs pyarrow)."""
    transaction = context(**ctx)
    if not arrow:
        return run_transaction(sink, transaction, rows_delivery(rows))
    from twophase.testing.arrow import record_batches  # noqa: PLC0415 - needs pyarrow

    batches = record_batches(rows, transaction.columns, rows_per_batch=2)
    return run_transaction(sink, transaction, arrow_delivery(batches))


def commit(sink: TwoPhaseCommitSink[Any], handle: Handle) -> CommitOutcome:
    """Commit as the driver does: through a committer fenced at the handle's epoch."""
    with sink.committer() as committer:
        committer.fence(handle.txn_id.namespace, current_query_id(), handle.txn_id.epoch)
        return committer.commit(handle)


def abort(sink: TwoPhaseCommitSink[Any], handle: Handle) -> AbortOutcome:
    """Abort as the driver or cleanup does: through a committer."""
    with sink.committer() as committer:
        committer.fence(handle.txn_id.namespace, current_query_id(), handle.txn_id.epoch)
        return committer.abort(handle)


def list_in_doubt(sink: TwoPhaseCommitSink[Any], namespace: str) -> list[Handle]:
    """List what is in doubt as the driver's sweep, cleanup and ``status`` do: through a
    committer (``sink.list_in_doubt`` on a sink with a committer is deprecated)."""
    with sink.committer() as committer:
        return committer.list_in_doubt(namespace)


def purge_commit_records(sink: TwoPhaseCommitSink[Any], namespace: str,
                         older_than: datetime) -> int:
    """Purge proofs of commit as cleanup does: through a committer."""
    with sink.committer() as committer:
        return committer.purge_commit_records(namespace, older_than)


_IN_ANOTHER_PROCESS = """
import os, pickle, signal, sys
from twophase import Handle
from twophase.testing.contract import commit, abort, orders, prepare, use_query_id
sink = pickle.loads(bytes.fromhex(sys.argv[1]))
use_query_id(sys.argv[2])
if sys.argv[3] == "write-then-die":
    print(prepare(sink, orders(0, 5), batch=7).dumps(), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
action = {"commit": commit, "abort": abort}[sys.argv[3]]
print(action(sink, Handle.loads(sys.argv[4])).value)
"""


def in_another_process(sink: TwoPhaseCommitSink[Any], action: str,
                       handle: Handle | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``action`` (commit, abort, write-then-die) on a pickled copy of ``sink`` elsewhere,
    under the test's query id. The child imports the sink's module from this process's
    ``sys.path`` (so a sink in the test's package is found)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.run(
        [sys.executable, "-c", _IN_ANOTHER_PROCESS, pickle.dumps(sink).hex(),
         current_query_id(), action, handle.dumps() if handle else ""],
        capture_output=True, text=True, env=env, timeout=SUBPROCESS_TIMEOUT_S, check=False)


class SinkContract(TargetSuite):
    """Inherit it as ``TestXxx(SinkContract)``; give it a ``target`` (see above)."""

    #: False for a sink whose proofs of commit cannot be purged (``purge_commit_records`` is 0).
    purges_commit_records = True
    #: False for a sink whose target has no columns (``check_schema`` refuses nothing).
    has_schema = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if _reads_its_sink(cls):  # 0.1.0's sink fixture and visible(sink): deprecated
            setattr(cls, "target", _target_of_sink_fixture)  # noqa: B010 - a fixture
            warnings.warn(SINK_FIXTURE_DEPRECATED.format(name=cls.__qualname__),
                          DeprecationWarning, stacklevel=2)

    @pytest.fixture
    def sink(self, target: Target) -> TwoPhaseCommitSink[Any]:
        """The sink over the test's target, as the tests drive it."""
        return target.build()

    @pytest.fixture(autouse=True)
    def _fresh_query_checked(self, sink: TwoPhaseCommitSink[Any]) -> Iterator[None]:
        """A query id of the test's own, and the schema check the driver makes first."""
        sink.check_schema(ORDER_COLUMNS)
        use_query_id(str(uuid.uuid4()))
        try:
            yield
        finally:
            use_query_id(QUERY_ID)

    # -- schema and the Arrow path -------------------------------------------------------------

    def test_check_schema_refuses_a_column_the_target_lacks(
        self, target: Target, sink: TwoPhaseCommitSink[Any]
    ) -> None:
        more = [*ORDER_COLUMNS, Column("no_such_column", "string")]
        if self.has_schema:
            with pytest.raises(SchemaMismatchError, match=r"'no_such_column'.*Fix: "):
                sink.check_schema(more)
        else:
            sink.check_schema(more)  # a target without columns takes any
        assert target.visible() == []

    def test_record_batches_through_write_arrow_commit_like_rows(
        self, target: Target, sink: TwoPhaseCommitSink[Any]
    ) -> None:
        written = prepare(sink, orders(0, 5), arrow=True, partition=0)
        empty = prepare(sink, [], arrow=True, partition=1)
        assert (written.rows, empty.rows) == (5, 0)
        assert target.visible() == []
        assert commit(sink, written) is CommitOutcome.COMMITTED
        assert commit(sink, empty) in (CommitOutcome.COMMITTED, CommitOutcome.ALREADY_COMMITTED)
        assert target.visible() == [0, 1, 2, 3, 4]
        assert list_in_doubt(sink, NAMESPACE) == []

    # -- visibility ----------------------------------------------------------------------------

    def test_pre_committed_rows_stay_invisible_until_commit(
        self, target: Target, sink: TwoPhaseCommitSink[Any]
    ) -> None:
        first = prepare(sink, orders(0, 3), partition=0)
        second = prepare(sink, orders(3, 2), partition=1)
        assert (first.rows, second.rows, first.sink) == (3, 2, sink.kind)
        assert target.visible() == []
        assert commit(sink, first) is CommitOutcome.COMMITTED
        assert target.visible() == [0, 1, 2]
        assert commit(sink, second) is CommitOutcome.COMMITTED
        assert target.visible() == [0, 1, 2, 3, 4]

    def test_pre_committed_transactions_are_committable_while_the_system_answers(
        self, target: Target, sink: TwoPhaseCommitSink[Any]
    ) -> None:
        written, empty = prepare(sink, orders(0, 3), partition=0), prepare(sink, [], partition=1)
        with sink.committer() as committer:  # else no batch of the sink would be decided
            committer.check_committable([written, empty])
        assert commit(sink, written) is CommitOutcome.COMMITTED
        assert commit(sink, empty) in (CommitOutcome.COMMITTED, CommitOutcome.ALREADY_COMMITTED)
        assert target.visible() == [0, 1, 2]
        assert list_in_doubt(sink, NAMESPACE) == []

    def test_a_second_commit_proves_it_was_already_committed(
        self, target: Target, sink: TwoPhaseCommitSink[Any]
    ) -> None:
        handle = prepare(sink, orders(0, 4))
        assert commit(sink, handle) is CommitOutcome.COMMITTED
        again = Handle.loads(handle.dumps())  # as recovery reads it from the state file
        assert commit(sink, again) is CommitOutcome.ALREADY_COMMITTED
        assert target.visible() == [0, 1, 2, 3]
        assert list_in_doubt(sink, NAMESPACE) == []

    def test_an_empty_partition_commits_and_leaves_nothing_behind(
        self, target: Target, sink: TwoPhaseCommitSink[Any]
    ) -> None:
        handle = prepare(sink, [])
        assert handle.rows == 0
        assert commit(sink, handle) in (CommitOutcome.COMMITTED,
                                         CommitOutcome.ALREADY_COMMITTED)
        assert commit(sink, handle) is CommitOutcome.ALREADY_COMMITTED
        assert target.visible() == []
        assert list_in_doubt(sink, NAMESPACE) == []

    # -- abort and loss ------------------------------------------------------------------------

    def test_abort_is_idempotent_and_a_commit_after_it_is_a_lost_transaction(
        self, target: Target, sink: TwoPhaseCommitSink[Any]
    ) -> None:
        handle = prepare(sink, orders(0, 3))
        assert abort(sink, handle) is AbortOutcome.ABORTED
        assert abort(sink, handle) is AbortOutcome.NOT_FOUND
        with pytest.raises(TransactionLostError, match=r"Fix: "):
            commit(sink, handle)  # decided, then aborted outside: never "success"
        assert target.visible() == []
        assert list_in_doubt(sink, NAMESPACE) == []

    def test_a_discarded_transaction_leaves_nothing(
        self, target: Target, sink: TwoPhaseCommitSink[Any]
    ) -> None:
        txn = sink.begin_transaction(context())
        sink.write(txn, orders(0, 3))
        sink.discard(txn)
        assert target.visible() == []
        assert list_in_doubt(sink, NAMESPACE) == []

    def test_a_committed_transaction_id_is_never_reused(
        self, target: Target, sink: TwoPhaseCommitSink[Any]
    ) -> None:
        assert commit(sink, prepare(sink, orders(0, 2))) is CommitOutcome.COMMITTED
        with pytest.raises(TwoPhaseError, match=r"already committed.*Fix: "):
            commit(sink, prepare(sink, orders(10, 2)))  # the same id: a restored old state
        assert target.visible() == [0, 1]

    # -- other processes -----------------------------------------------------------------------

    def test_commit_and_abort_work_from_another_process(
        self, target: Target, sink: TwoPhaseCommitSink[Any]
    ) -> None:
        kept, dropped = prepare(sink, orders(0, 2), partition=0), prepare(
            sink, orders(2, 2), partition=1)
        committed = in_another_process(sink, "commit", kept)
        aborted = in_another_process(sink, "abort", dropped)
        assert (committed.stdout.strip(), aborted.stdout.strip()) == (
            "committed", "aborted"), committed.stderr + aborted.stderr
        assert target.visible() == [0, 1]
        assert commit(sink, kept) is CommitOutcome.ALREADY_COMMITTED
        assert list_in_doubt(sink, NAMESPACE) == []

    def test_a_writer_killed_after_pre_commit_leaves_a_transaction_the_driver_commits(
        self, target: Target, sink: TwoPhaseCommitSink[Any]
    ) -> None:
        writer = in_another_process(sink, "write-then-die")
        assert writer.returncode == -signal.SIGKILL, writer.stderr
        handle = Handle.loads(writer.stdout.strip())
        assert target.visible() == []
        assert [h.txn_id for h in list_in_doubt(sink, NAMESPACE)] == [handle.txn_id]
        assert commit(sink, handle) is CommitOutcome.COMMITTED
        assert target.visible() == [0, 1, 2, 3, 4]

    # -- listing, concurrency, purge -----------------------------------------------------------

    def test_in_doubt_listing_is_scoped_to_its_namespace_and_abortable(
        self, target: Target, sink: TwoPhaseCommitSink[Any]
    ) -> None:
        ours = prepare(sink, orders(0, 2), namespace=NAMESPACE)
        similar = prepare(sink, orders(2, 2), namespace=f"{NAMESPACE}2")  # a prefix trap
        listed = list_in_doubt(sink, NAMESPACE)
        assert [h.txn_id for h in listed] == [ours.txn_id]
        assert abort(sink, listed[0]) is AbortOutcome.ABORTED  # a listed handle is abortable
        assert [h.txn_id for h in list_in_doubt(sink, f"{NAMESPACE}2")] == [similar.txn_id]
        assert abort(sink, similar) is AbortOutcome.ABORTED
        assert target.visible() == []

    def test_commits_run_concurrently_through_one_committer(
        self, target: Target, sink: TwoPhaseCommitSink[Any]
    ) -> None:
        handles = [prepare(sink, orders(10 * p, 3), partition=p)
                   for p in range(CONCURRENT_COMMITS)]
        with sink.committer() as committer:
            committer.fence(NAMESPACE, current_query_id(), 1)
            with ThreadPoolExecutor(max_workers=CONCURRENT_COMMITS) as pool:
                outcomes = list(pool.map(committer.commit, handles))
        assert outcomes == [CommitOutcome.COMMITTED] * CONCURRENT_COMMITS
        assert target.visible() == sorted(10 * p + i for p in range(CONCURRENT_COMMITS)
                                            for i in range(3))

    def test_purge_forgets_old_proofs_of_its_namespace_only(
        self, target: Target, sink: TwoPhaseCommitSink[Any]
    ) -> None:
        ours = prepare(sink, orders(0, 1), namespace=NAMESPACE)
        others = prepare(sink, orders(1, 1), namespace=f"{NAMESPACE}2")
        for handle in (ours, others):
            assert commit(sink, handle) is CommitOutcome.COMMITTED
        later = datetime.now(UTC) + timedelta(hours=1)
        purged = purge_commit_records(sink, NAMESPACE, later)
        assert commit(sink, others) is CommitOutcome.ALREADY_COMMITTED
        if self.purges_commit_records:
            assert purged == 1
            with pytest.raises(TransactionLostError):
                commit(sink, ours)  # no proof is left: "committed" can no longer be proven
        else:
            assert purged == 0
            assert commit(sink, ours) is CommitOutcome.ALREADY_COMMITTED
        assert target.visible() == [0, 1]


# -- deprecated: removed in 0.6.0 (see CHANGELOG.md) ------------------------------------------

SINK_FIXTURE_DEPRECATED = (
    "{name}: SinkContract's sink fixture with visible(sink) is deprecated since 0.2.0 and is "
    "removed in 0.6.0: give the suite a target fixture returning a twophase.testing.Target "
    "(the sink's factory and options, and visible(self) reading the target); the suite builds "
    "its sink fixture from it."
)


def _reads_its_sink(cls: type[SinkContract]) -> bool:
    """Whether a suite class is the first written the 0.1.0 way: ``visible(sink)`` on it and
    no ``target`` of its own (nor a setup to make one)."""
    defines_target = next(k for k in cls.__mro__ if "target" in vars(k))
    return (hasattr(cls, "visible") and cls.setup_fixture is None
            and defines_target is TargetSuite)


@pytest.fixture(name="target")
def _target_of_sink_fixture(self: SinkContract, sink: TwoPhaseCommitSink[Any]) -> Target:
    """The ``target`` of a suite written the 0.1.0 way: its ``sink`` fixture, read through
    its ``visible(sink)``."""
    read: Callable[[TwoPhaseCommitSink[Any]], list[int]] = getattr(self, "visible")  # noqa: B009
    return _SinkFixtureTarget(f"{type(sink).__module__}:{type(sink).__qualname__}", {},
                              sink=sink, read=read)


@dataclass(eq=False)
class _SinkFixtureTarget(Target):
    """A target over a sink fixture's sink: read by the suite's ``visible(sink)``; built as a
    pickled copy (as a driver's executors get it)."""

    sink: TwoPhaseCommitSink[Any] | None = None
    read: Callable[[TwoPhaseCommitSink[Any]], list[int]] | None = None

    def build(self) -> TwoPhaseCommitSink[Any]:
        built: TwoPhaseCommitSink[Any] = pickle.loads(pickle.dumps(self.sink))  # noqa: S301
        return built

    def visible(self) -> list[int]:
        assert self.sink is not None and self.read is not None
        return self.read(self.sink)
