"""The Spark side of the protocol: what runs in executors and in Spark's commit process.

Spark 4's Python Data Source API calls ``write(iterator)`` once per partition on an executor and
``commit(messages, batchId)`` / ``abort(messages, batchId)`` on the driver, in a fresh Python
process each time, on a fresh writer. Nothing survives in memory between those calls, so all
they share is a :class:`RunConfig` (pickled with the data source class) and the state file.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)

from twophase._coordinator import Coordinator
from twophase._crash import AFTER_PRE_COMMIT, crash_point
from twophase._handle import Handle, TxnId
from twophase._retry import RetryPolicy
from twophase._state import StateStore
from twophase.errors import FatalError
from twophase.sink import Column, TransactionContext, TwoPhaseCommitSink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row
    from pyspark.sql.types import StructType

log = logging.getLogger("twophase")

BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"


@dataclass(frozen=True)
class RunConfig:
    """What every process of one run needs: the sink, where the state is, which epoch we hold."""

    sink: TwoPhaseCommitSink[Any]
    state_dir: str
    namespace: str
    epoch: int
    columns: tuple[Column, ...]
    retry: RetryPolicy
    #: Batch jobs fix the query id and batch id on the driver; streams read them per task.
    query_id: str | None = None
    batch: int | None = None

    def coordinator(self) -> Coordinator:
        return Coordinator(self.sink, StateStore(self.state_dir), namespace=self.namespace,
                           epoch=self.epoch, retry=self.retry)


@dataclass
class TwoPhaseMessage(WriterCommitMessage):
    """What an executor tells the driver: a handle, or that the batch was already decided."""

    query_id: str
    handle: str | None  # Handle JSON; None: the batch was decided already, nothing written


def columns_of(schema: StructType) -> tuple[Column, ...]:
    return tuple(Column(f.name, f.dataType.simpleString(), f.nullable) for f in schema.fields)


# -- executor ------------------------------------------------------------------------------


def write_partition(
    config: RunConfig, rows: Iterable[Sequence[Any]], *, batch: int, query_id: str
) -> TwoPhaseMessage:
    """Begin, write and pre-commit this task's rows; or nothing, if the batch is decided."""
    state = StateStore(config.state_dir).read()
    if state is not None and state.is_decided(batch) and state.query_id in (None, query_id):
        log.info("batch %d is already decided: replay writes nothing", batch)
        return TwoPhaseMessage(query_id=query_id, handle=None)
    task = _task()
    txn_id = TxnId.open(namespace=config.namespace, query_id=query_id, epoch=config.epoch,
                        batch=batch, partition=task.partitionId(), attempt=task.taskAttemptId())
    handle = run_transaction(config.sink, TransactionContext(txn_id, config.columns), rows)
    crash_point(AFTER_PRE_COMMIT, batch)
    return TwoPhaseMessage(query_id=query_id, handle=handle.dumps())


def run_transaction(
    sink: TwoPhaseCommitSink[Any], ctx: TransactionContext, rows: Iterable[Sequence[Any]]
) -> Handle:
    txn = sink.begin_transaction(ctx)
    try:
        sink.write(txn, rows)
        return sink.pre_commit(txn)
    except BaseException:
        sink.discard(txn)
        raise


def _task() -> TaskContext:
    task = TaskContext.get()
    if task is None:
        raise FatalError("twophase's partition writer ran outside a Spark task.",
                         fix="write through twophase.spark.write_stream or write")
    return task


def _stream_task_ids() -> tuple[int, str]:
    """Batch id and query id of the micro-batch this task belongs to."""
    task = _task()
    batch, query_id = (task.getLocalProperty(BATCH_ID_PROPERTY),
                       task.getLocalProperty(QUERY_ID_PROPERTY))
    if batch is None or query_id is None:
        raise FatalError("twophase's stream writer ran in a task of no streaming query.",
                         fix="use twophase.spark.write for batch DataFrames")
    return int(batch), query_id


# -- driver --------------------------------------------------------------------------------


def _ours(messages: Sequence[WriterCommitMessage | None]) -> list[TwoPhaseMessage]:
    """The messages that arrived (failed tasks send None), checked to be twophase's."""
    present = [m for m in messages if m is not None]
    foreign = [type(m).__name__ for m in present if not isinstance(m, TwoPhaseMessage)]
    if foreign:
        raise FatalError(f"unexpected commit messages {foreign}.", fix="report a twophase bug")
    return [m for m in present if isinstance(m, TwoPhaseMessage)]


def commit_messages(
    config: RunConfig, messages: Sequence[WriterCommitMessage | None], batch: int
) -> None:
    present = _ours(messages)
    if not present:
        log.info("batch %d has no partitions: nothing to commit", batch)
        return
    query_id = present[0].query_id
    if len(present) < len(messages):
        raise FatalError(f"batch {batch}: {len(messages) - len(present)} of {len(messages)} "
                         "tasks sent no commit message.", fix="report this as a twophase bug")
    handles = [Handle.loads(m.handle) for m in present if m.handle is not None]
    config.coordinator().commit_batch(batch, query_id, handles)


def abort_messages(
    config: RunConfig, messages: Sequence[WriterCommitMessage | None], batch: int
) -> None:
    present = _ours(messages)
    handles = [Handle.loads(m.handle) for m in present if m.handle is not None]
    query_id = present[0].query_id if present else config.query_id
    config.coordinator().abort_batch(batch, query_id, handles)


class _StreamWriter(DataSourceStreamWriter):
    def __init__(self, config: RunConfig) -> None:
        self.config = config

    def write(self, iterator: Iterator[Any]) -> TwoPhaseMessage:
        batch, query_id = _stream_task_ids()
        return write_partition(self.config, iterator, batch=batch, query_id=query_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        commit_messages(self.config, messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        abort_messages(self.config, messages, batchId)


class _BatchWriter(DataSourceWriter):
    """``df.write``: the whole job is one batch with an id chosen by the driver."""

    def __init__(self, config: RunConfig) -> None:
        if config.query_id is None or config.batch is None:
            raise FatalError("batch write started without a job id.",
                             fix="use twophase.spark.write()")
        self.config = config
        self.query_id: str = config.query_id
        self.batch: int = config.batch

    def write(self, iterator: Iterator[Any]) -> TwoPhaseMessage:
        return write_partition(self.config, iterator, batch=self.batch, query_id=self.query_id)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_messages(self.config, messages, self.batch)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort_messages(self.config, messages, self.batch)


class _TwoPhaseDataSource(DataSource):
    """Base of the per-run data source classes made by :func:`register_data_source`."""

    config: ClassVar[RunConfig]
    short_name: ClassVar[str]

    @classmethod
    def name(cls) -> str:
        return cls.short_name

    def streamWriter(self, schema: StructType, overwrite: bool) -> _StreamWriter:  # noqa: N802
        return _StreamWriter(self.config)

    def writer(self, schema: StructType, overwrite: bool) -> _BatchWriter:
        return _BatchWriter(self.config)


def register_data_source(df: DataFrame, config: RunConfig) -> str:
    """Register a data source class carrying ``config``; return its format name.

    The class is made per run so that cloudpickle ships it, with the config, by value to every
    process Spark starts; the options of a format could only carry strings.
    """
    short_name = f"twophase_{uuid.uuid4().hex}"
    cls = type(short_name, (_TwoPhaseDataSource,), {"config": config, "short_name": short_name})
    df.sparkSession.dataSource.register(cls)
    return short_name


class ForeachBatchWriter:
    """The ``foreachBatch`` adapter: same protocol, for Spark setups without pyarrow."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        config = self.config

        def write(rows: Iterable[Row]) -> Iterator[TwoPhaseMessage]:
            _, query_id = _stream_task_ids()
            yield write_partition(config, rows, batch=batch_id, query_id=query_id)

        messages: list[WriterCommitMessage | None] = list(
            batch_df.rdd.mapPartitions(write).collect())
        try:
            commit_messages(config, messages, batch_id)
        except BaseException:
            abort_messages(config, messages, batch_id)
            raise
