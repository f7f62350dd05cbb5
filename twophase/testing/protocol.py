"""The protocol without Spark: the driver's half, the state file it keeps, and the executors'
half as Spark's tasks run it.

For benchmarks and harnesses that drive a sink through decisions and recoveries themselves,
and read what a run recorded::

    store = StateStore(tmp / "state")                   # or StateStore.for_checkpoint(...)
    epoch = store.start_run("orders", {}).epoch         # a run of the query, fencing older ones
    with Coordinator(sink, store, namespace="orders", epoch=epoch) as coordinator:
        coordinator.start(query_id)                     # finish and sweep earlier runs
        coordinator.commit_batch(0, query_id, handles)  # as Spark's commit of batch 0 does
    store.read_existing().history[-1].commit_ms         # a BatchRecord of what it took

================  ==========================================================================
name              what it is
================  ==========================================================================
``Coordinator``   one run of one query: ``start`` (recovery), ``commit_batch`` and
                  ``abort_batch`` (Spark's commit and abort of a batch); a context manager
``StateStore``    one query's state file, local or on S3: ``read``, ``read_existing``,
                  ``start_run`` (a new epoch), ``update`` (a fenced read-modify-write)
``State``         what the file holds: epoch, ``last_done_batch``, ``pending`` decisions,
                  ``history``
``Decision``      a decided batch: its handles must all end up committed
``BatchRecord``   what the history remembers of a done batch (rows, decision and commit ms)
``RunConfig``     what every process of one run shares: the sink, the state's location, the
                  epoch, the columns, the retry policy
``write_partition``  one task: begin, write (a ``Delivery``), pre-commit, the handle's message
``build_sink``    a sink from ``"module:Class"`` and its options, as the tools build one
================  ==========================================================================

How each works, and why, is told where it lives (:mod:`twophase._coordinator`,
:mod:`twophase._state`); ``python -m twophase.status`` shows a state to an operator.
"""

from twophase._coordinator import Coordinator
from twophase._loader import build_sink
from twophase._spark import RunConfig, write_partition
from twophase._state import BatchRecord, Decision, State, StateStore
from twophase._task import Delivery

__all__ = ["BatchRecord", "Coordinator", "Decision", "Delivery", "RunConfig", "State",
           "StateStore", "build_sink", "write_partition"]
