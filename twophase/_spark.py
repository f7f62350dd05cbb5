"""The Spark side of the protocol: what runs in executors and in Spark's commit process.

Spark 4's Python Data Source API calls ``write(iterator)`` once per partition on an executor and
``commit(messages, batchId)`` / ``abort(messages, batchId)`` on the driver, in a Python worker
that Spark may reuse or replace between calls, always on a fresh writer. Nothing can be counted
on to survive in memory between those calls, so all they need is a :class:`RunConfig` (pickled
with the data source class) and the state file. What does survive (a reused worker, the
driver's process for ``foreachBatch``) keeps the run's :class:`~twophase._pipeline.CommitPipeline`:
its committers, and a batch committing behind the next (:attr:`RunConfig.pipelined`).

On Spark Connect the caller is a client and the driver is the server: :func:`on_spark_side`
runs the takeover in a task there, and :class:`ForeachBatchWriter` decides each batch in the
server's Python process that runs it.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import pickle
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from pyspark import TaskContext, cloudpickle
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from twophase import errors
from twophase._aborts import abort_quietly
from twophase._coordinator import SWEEP_INTERVAL_S, Coordinator, CrashPoint
from twophase._crash import AFTER_PRE_COMMIT, crash_point
from twophase._eligibility import can_never_be_decided, is_failed_attempt
from twophase._handle import Handle, TxnId
from twophase._pipeline import CommitPipeline, RunKey, pipeline_of
from twophase._retry import RetryPolicy
from twophase._rows import INSTANT_TYPE, plain_rows, positions
from twophase._state import NO_BATCH, StateStore
from twophase._storage import FILE_SCHEME, local_path
from twophase._task import Delivery, arrow_delivery, rows_delivery, run_transaction
from twophase._workers import keep_out_of_worker_collections
from twophase.errors import ConfigurationError, FatalError, TwoPhaseError
from twophase.sink import Column, TransactionContext, TwoPhaseCommitSink

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, Row, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"
SPARK_CHECKPOINT_METADATA = "metadata"  # Spark's checkpoint file holding {"id": query id}
CONNECT_MODULE = "pyspark.sql.connect."  # where Spark Connect's client classes live
SPARK_SIDE_SCHEMA = "outcome binary"  # the one column of on_spark_side's one row
MESSAGES_SCHEMA = "message binary"  # a foreachBatch task's pickled TwoPhaseMessage

T = TypeVar("T")


@dataclass(frozen=True)
class RunConfig:
    """What every process of one run needs: the sink, where the state is, which epoch we hold."""

    sink: TwoPhaseCommitSink[Any]
    #: The state's directory or S3 prefix, and its options (see StateStore).
    state_location: str
    namespace: str
    epoch: int
    columns: tuple[Column, ...]
    retry: RetryPolicy
    #: Batch jobs fix the query id and batch id on the driver; streams read them per task.
    query_id: str | None = None
    batch: int | None = None
    #: A stream's checkpoint location (its metadata names the query before any task reports).
    checkpoint: str | None = None
    state_options: dict[str, Any] = field(default_factory=dict, repr=False)
    #: The batches up to this one were decided before this run started: when Spark replays
    #: one (its commit was not recorded before a crash), its tasks write nothing and the
    #: driver finishes the decision. Tasks learn it here, never from the driver's disk.
    decided_through: int = NO_BATCH
    #: Can tasks read the state (S3, or a local one in local mode)? Then a task whose batch
    #: was given up (or whose run was fenced) while it pre-committed aborts its transaction
    #: itself; otherwise the driver's second sweep (or the next batch's) aborts it.
    tasks_read_state: bool = True
    #: Commit each batch behind the next one, in the process of the commit callbacks (see
    #: :mod:`twophase._pipeline`); False: in the callback, before Spark goes on.
    pipelined: bool = False
    #: Tune Spark's reused Python workers (:mod:`twophase._workers`); False where the run
    #: was started with ``TWOPHASE_WORKER_TUNING=0``: shipped to every task with the config.
    worker_tuning: bool = True

    def store(self) -> StateStore:
        return StateStore(self.state_location, self.state_options)

    def coordinator(self, *, sweep_interval_s: float = 0.0) -> Coordinator:
        return Coordinator(self.sink, self.store(), namespace=self.namespace,
                           epoch=self.epoch, retry=self.retry, sweep_interval_s=sweep_interval_s)

    def run_key(self) -> RunKey:
        """What names this run's pipeline in a process (see :func:`pipeline_of`)."""
        return self.state_location, self.namespace, self.epoch

    def pipeline(self) -> CommitPipeline:
        """This process's commit pipeline of the run (made on first use, kept)."""
        return pipeline_of(self.run_key(), lambda: CommitPipeline(
            self.coordinator(sweep_interval_s=SWEEP_INTERVAL_S), self.coordinator()))


@dataclass
class TwoPhaseMessage(WriterCommitMessage):
    """What an executor tells the driver: a handle, or that the batch was already decided."""

    query_id: str
    handle: str | None  # Handle JSON; None: the batch was decided already, nothing written


def columns_of(schema: StructType) -> tuple[Column, ...]:
    return tuple(Column(f.name, f.dataType.simpleString(), f.nullable) for f in schema.fields)


# -- executor ------------------------------------------------------------------------------


class TaskAttempt(Protocol):
    """What :func:`write_partition` reads of Spark's ``TaskContext``."""

    def partitionId(self) -> int: ...  # noqa: N802 - Spark's name

    def attemptNumber(self) -> int: ...  # noqa: N802 - Spark's name

    def taskAttemptId(self) -> int: ...  # noqa: N802 - Spark's name


def write_partition(
    config: RunConfig, deliver: Delivery, *, batch: int, query_id: str,
    task: TaskAttempt | None = None, crash_point: CrashPoint = crash_point,
    discard_on_failure: bool = True,
) -> TwoPhaseMessage:
    """Begin, write and pre-commit this task's rows; or nothing, if the batch is decided.

    ``task`` is Spark's running task unless given; ``crash_point`` and ``discard_on_failure``
    (False: a failed transaction is left as a killed executor leaves it) serve a simulated
    executor (:mod:`twophase.testing.model`).
    """
    keep_out_of_worker_collections(tuning=config.worker_tuning)
    if batch <= config.decided_through:
        log.info("batch %d was decided before this run: its replay writes nothing", batch)
        return TwoPhaseMessage(query_id=query_id, handle=None)
    task = _task() if task is None else task
    txn_id = TxnId.open(namespace=config.namespace, query_id=query_id, epoch=config.epoch,
                        batch=batch, partition=task.partitionId(), attempt=task.taskAttemptId())
    if task.attemptNumber() > 0:
        _abort_failed_attempts(config, txn_id)
    ctx = TransactionContext(txn_id, config.columns)
    handle = run_transaction(config.sink, ctx, deliver, retry=config.retry,
                             discard_on_failure=discard_on_failure)
    crash_point(AFTER_PRE_COMMIT, batch)
    if config.tasks_read_state and can_never_be_decided(config.store().read(),
                                                        epoch=config.epoch, batch=batch):
        _abort_late_handle(config, handle)
        return TwoPhaseMessage(query_id=query_id, handle=None)
    return TwoPhaseMessage(query_id=query_id, handle=handle.dumps())


def _abort_failed_attempts(config: RunConfig, txn_id: TxnId) -> None:
    """A retried task aborts what its failed attempts left in doubt, before it writes.

    An attempt whose executor died after its pre-commit leaves a transaction no decision will
    reference (:func:`~twophase._eligibility.is_failed_attempt`), and in a database it holds
    the locks of the very rows the retry writes: the retry would wait for them until its lock
    wait timed out, on every attempt.
    """
    with config.sink.committer() as committer:
        failed = [handle for handle in committer.list_in_doubt(config.namespace)
                  if is_failed_attempt(handle.txn_id, retry=txn_id)]
        if failed:
            log.warning("task %s retries a failed attempt: aborting %s", txn_id,
                        ", ".join(str(handle.txn_id) for handle in failed))
        for handle in failed:
            abort_quietly(committer, handle, config.retry)


def _abort_late_handle(config: RunConfig, handle: Handle) -> None:
    log.warning("batch %d was given up (or its run fenced) while %s pre-committed: aborting it",
                handle.txn_id.batch, handle.txn_id)
    with config.sink.committer() as committer:
        abort_quietly(committer, handle, config.retry)


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


def query_id_of(config: RunConfig, present: Sequence[TwoPhaseMessage]) -> str | None:
    """The query id of a batch: from a message, the job, or Spark's checkpoint metadata.

    A batch whose tasks all failed sends no message; on a new query the state file does not
    know the id yet either, so the checkpoint's own record of it is read.
    """
    if present:
        return present[0].query_id
    if config.query_id is not None:
        return config.query_id
    return checkpoint_query_id(config.checkpoint) if config.checkpoint else None


def checkpoint_query_id(checkpoint_location: str) -> str | None:
    """The query id Spark keeps in ``<checkpoint>/metadata``; None for a new or remote one."""
    if is_remote(checkpoint_location):
        return None
    metadata = local_path(checkpoint_location) / SPARK_CHECKPOINT_METADATA
    try:
        return str(json.loads(metadata.read_text())["id"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigurationError(f"cannot read Spark's query id from {metadata}: {exc}.",
                                 fix="point checkpoint_location at a Spark checkpoint") from exc


def is_remote(location: str) -> bool:
    """Is ``location`` a URL of a file system other than the local one (``file:``)?"""
    return "://" in location and not location.startswith(FILE_SCHEME)


def commit_messages(
    config: RunConfig, messages: Sequence[WriterCommitMessage | None], batch: int
) -> None:
    keep_out_of_worker_collections(tuning=config.worker_tuning)
    present = _ours(messages)
    if len(present) < len(messages):
        raise FatalError(f"batch {batch}: {len(messages) - len(present)} of {len(messages)} "
                         "tasks sent no commit message.", fix="report this as a twophase bug")
    query_id = query_id_of(config, present)
    if query_id is None:
        raise FatalError(f"batch {batch} has no partitions and its query id is unknown.",
                         fix="report this as a twophase bug")
    handles = [Handle.loads(m.handle) for m in present if m.handle is not None]
    if config.pipelined:  # also an empty batch: the state must know every batch Spark commits
        config.pipeline().commit_batch(batch, query_id, handles)
        return
    with config.coordinator() as coordinator:
        coordinator.commit_batch(batch, query_id, handles)


def abort_messages(
    config: RunConfig, messages: Sequence[WriterCommitMessage | None], batch: int
) -> None:
    present = _ours(messages)
    handles = [Handle.loads(m.handle) for m in present if m.handle is not None]
    query_id = query_id_of(config, present)
    if config.pipelined:
        config.pipeline().abort_batch(batch, query_id, handles)
        return
    with config.coordinator() as coordinator:
        coordinator.abort_batch(batch, query_id, handles)


class _StreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, config: RunConfig) -> None:
        self.config = config

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TwoPhaseMessage:
        batch, query_id = _stream_task_ids()
        return write_partition(self.config, arrow_delivery(iterator), batch=batch,
                               query_id=query_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        commit_messages(self.config, messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        abort_messages(self.config, messages, batchId)


class _BatchWriter(DataSourceArrowWriter):
    """``df.write``: the whole job is one batch with an id chosen by the driver."""

    def __init__(self, config: RunConfig) -> None:
        if config.query_id is None or config.batch is None:
            raise FatalError("batch write started without a job id.",
                             fix="use twophase.spark.write()")
        self.config = config
        self.query_id: str = config.query_id
        self.batch: int = config.batch

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TwoPhaseMessage:
        return write_partition(self.config, arrow_delivery(iterator), batch=self.batch,
                               query_id=self.query_id)

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


def _instants_as_micros(df: DataFrame, instants: Sequence[int]) -> DataFrame:
    """``df`` with its TIMESTAMP columns as ``unix_micros``: Spark's Rows would turn them into
    naive datetimes in the worker's local time zone (see :mod:`twophase._rows`)."""
    from pyspark.sql.functions import unix_micros  # noqa: PLC0415 - needs a running Spark

    if not instants:
        return df
    return df.select(*(unix_micros(df[name]).alias(name) if i in instants else df[name]
                       for i, name in enumerate(df.columns)))


class ForeachBatchWriter:
    """The ``foreachBatch`` adapter: same protocol, the batch decided in this process.

    A job writes the batch's partitions, each task from Arrow record batches (``mapInArrow``;
    in classic Spark on a driver without pyarrow, from Spark's Rows), and this function decides
    their handles and commits them: no Python process of Spark's data source path per batch
    (on PySpark 4.1 each imported the sink again). In classic Spark it runs in the driver; on
    Spark Connect in a Python process of the server (the driver's host) for the whole run,
    where the tasks cannot tell the query id (the write is not the stream's job): it is read
    from the checkpoint once per run and given to them.
    """

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self._query_id: str | None = None  # on Connect: read once per run

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        config = self.config
        if is_connect(batch_df):
            if self._query_id is None:
                self._query_id = stream_query_id(batch_df.sparkSession, config)
            config = replace(config, query_id=self._query_id)
        write = written_as_arrow if has_pyarrow() else written_as_rows
        messages = write(batch_df, config, batch_id)
        try:
            commit_messages(config, messages, batch_id)
        except BaseException:
            abort_messages(config, messages, batch_id)
            raise


def has_pyarrow() -> bool:
    """Can this process (the driver) use Arrow? (Its executors are checked at the start.)"""
    return importlib.util.find_spec("pyarrow") is not None


def written_as_arrow(batch_df: DataFrame, config: RunConfig,
                     batch: int) -> list[WriterCommitMessage | None]:
    """Each partition of ``batch_df`` written and pre-committed by a task from Arrow record
    batches (``mapInArrow``); their messages, collected. The query id is ``config``'s, or the
    stream's the task belongs to."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa  # noqa: PLC0415 - in the task's process

        query_id = config.query_id or _stream_task_ids()[1]
        message = write_partition(config, arrow_delivery(batches), batch=batch,
                                  query_id=query_id)
        yield pa.RecordBatch.from_pydict({"message": [pickle.dumps(message)]})

    rows = batch_df.mapInArrow(write, MESSAGES_SCHEMA).collect()
    return [pickle.loads(row[0]) for row in rows]  # noqa: S301 - from our own tasks


def written_as_rows(batch_df: DataFrame, config: RunConfig,
                    batch: int) -> list[WriterCommitMessage | None]:
    """As :func:`written_as_arrow`, from Spark's Rows (an RDD job, classic Spark): for a driver
    without pyarrow."""
    types = [column.type for column in config.columns]
    instants, structs = positions(types, INSTANT_TYPE), positions(types, "struct<")

    def write(rows: Iterable[Row]) -> Iterator[TwoPhaseMessage]:
        _, query_id = _stream_task_ids()
        plain = plain_rows(rows, instants=instants, structs=structs)
        yield write_partition(config, rows_delivery(plain), batch=batch, query_id=query_id)

    exact = _instants_as_micros(batch_df, instants)
    return list(exact.rdd.mapPartitions(write).collect())


def is_connect(spark_object: DataFrame | SparkSession) -> bool:
    """Is this a Spark Connect DataFrame or session (its driver a server: no RDD, no py4j)?"""
    return type(spark_object).__module__.startswith(CONNECT_MODULE)


def stream_query_id(spark: SparkSession, config: RunConfig) -> str:
    """The query id in Spark's checkpoint metadata: from the disk, or read through Spark
    (a checkpoint on S3, HDFS...: wherever Spark itself keeps it)."""
    if config.checkpoint is None:
        raise FatalError("a stream's writer has no checkpoint location.",
                         fix="report this as a twophase bug")
    local = checkpoint_query_id(config.checkpoint)
    if local is not None:
        return local
    metadata = f"{config.checkpoint.rstrip('/')}/{SPARK_CHECKPOINT_METADATA}"
    first = spark.read.text(metadata).first()
    if first is None:
        raise FatalError(f"Spark's checkpoint metadata {metadata} is empty.",
                         fix="point checkpoint_location at a Spark checkpoint")
    return str(json.loads(first[0])["id"])


def on_spark_side(spark: SparkSession, action: Callable[[], T]) -> T:
    """``action()`` run in one Spark task of ``spark``; its result (or its TwoPhaseError,
    raised again here) returned to the caller.

    For a Spark Connect client that is the server's side: the task sees the checkpoint, the
    state and the sink's servers as the driver and the executors do. A task may run again
    after a failed attempt: ``action`` must allow that (a takeover does: the later attempt's
    epoch fences the earlier one's, which no run uses).
    """

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa  # noqa: PLC0415 - in the task's process

        for _ in batches:
            pass
        try:
            outcome: tuple[bool, Any] = (True, action())
        except TwoPhaseError as exc:
            outcome = (False, (type(exc).__name__, exc.cause, exc.fix))
        pickled = cloudpickle.dumps(outcome)  # type: ignore[no-untyped-call]
        yield pa.RecordBatch.from_pydict({"outcome": [pickled]})

    rows = spark.range(1, numPartitions=1).mapInArrow(run, SPARK_SIDE_SCHEMA).collect()
    succeeded, value = pickle.loads(rows[0][0])  # noqa: S301 - from our own task
    if not succeeded:
        name, cause, fix = value
        raise getattr(errors, name, FatalError)(cause, fix=fix)
    result: T = value
    return result
