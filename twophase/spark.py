"""Run a two-phase-commit sink from Spark: :func:`write_stream` for streams, :func:`write` for jobs.

Example::

    from twophase.spark import write_stream
    from sinks.sqlite import SQLiteSink

    query = write_stream(
        orders_df,
        SQLiteSink("orders.db", "orders_live"),
        checkpoint_location="/data/checkpoints/orders_live",
        trigger={"processingTime": "10 seconds"},
    )
    query.awaitTermination()

Each micro-batch is a checkpoint: every partition writes into its own sink transaction and
pre-commits it; once all have, the driver records the decision in the state file (by default
``<checkpoint_location>/twophase/``) and commits them. A crash anywhere is finished by the next
start of the same query: decided batches are committed, undecided transactions aborted.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pyspark.errors import PySparkException

from twophase._coordinator import Coordinator
from twophase._handle import validate_namespace
from twophase._progress import log_commits
from twophase._retry import RetryPolicy
from twophase._spark import (
    ForeachBatchWriter,
    RunConfig,
    checkpoint_query_id,
    columns_of,
    is_remote,
    register_data_source,
)
from twophase._state import State, StateStore
from twophase._storage import is_s3, local_path
from twophase.errors import ConfigurationError, SchemaMismatchError, TwoPhaseError
from twophase.sink import Column, TwoPhaseCommitSink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter

__all__ = ["write", "write_stream"]

log = logging.getLogger(__name__)

SPARK_OFFSETS_DIR = "offsets"  # Spark's log of started batches
SPARK_COMMITS_DIR = "commits"  # Spark's log of finished batches


def write_stream(
    df: DataFrame,
    sink: TwoPhaseCommitSink[Any],
    *,
    checkpoint_location: str,
    namespace: str | None = None,
    state_location: str | None = None,
    state_options: Mapping[str, Any] | None = None,
    trigger: Mapping[str, Any] | None = None,
    query_name: str | None = None,
    retry: RetryPolicy | None = None,
    foreach_batch: bool = False,
    accept_lost_state: bool = False,
) -> StreamingQuery:
    """Start a streaming query that writes ``df`` into ``sink`` exactly once.

    Args:
        df: a streaming DataFrame whose columns the sink accepts (checked before the start).
        sink: the sink, e.g. ``sinks.sqlite.SQLiteSink(...)``.
        checkpoint_location: Spark's checkpoint directory; the state file lives inside it,
            whether it is local (or a shared mount) or on S3 (``s3://``, ``s3a://``).
        namespace: prefix of every transaction id (default: derived from the sink's target).
            Keep it stable for the life of the checkpoint: recovery finds transactions by it.
        state_location: a directory or ``s3://bucket/prefix`` for the state file, if not
            inside the checkpoint (required for a checkpoint on HDFS or another file system).
        state_options: for a state on S3: ``endpoint_url``, ``region``, ``path_style``,
            ``access_key_id``, ``secret_access_key``, ``session_token`` (default: boto3's chain).
        trigger: keyword arguments of ``DataStreamWriter.trigger``, e.g.
            ``{"processingTime": "10 seconds"}`` or ``{"availableNow": True}``.
        query_name: Spark's query name.
        retry: how retryable errors are retried (default: :class:`RetryPolicy`).
        foreach_batch: drive the sink through ``foreachBatch`` instead of the Python Data
            Source API (which needs pyarrow).
        accept_lost_state: start although the checkpoint has batches the state file does not
            know (it was deleted, or restored from an older backup). A batch that was decided
            but not done may then be written twice: only for someone who accepts that.

    Everything that can be checked is checked before this run takes the query over from an
    earlier one (fencing it): the options, the trigger, the state against the checkpoint, and
    the rows' columns against the target. A failed check raises ConfigurationError or
    SchemaMismatchError and leaves a live run of the query untouched. Then decided batches of
    earlier runs are committed and their undecided transactions aborted (an unreachable server
    is raised here), and the query starts.
    """
    if not checkpoint_location:
        raise ConfigurationError("write_stream needs checkpoint_location.",
                                 fix="pass checkpoint_location='/path/to/checkpoint'")
    _require_sink(sink)
    writer = _stream_writer(df, checkpoint_location, trigger=trigger, query_name=query_name)
    store = (StateStore(state_location, state_options) if state_location
             else StateStore.for_checkpoint(checkpoint_location, state_options))
    query_id = _same_query(store, checkpoint_location, accept_lost_state=accept_lost_state)
    _require_not_running(df, query_id)
    config = _begin_run(df, sink, store, query_id=query_id, namespace=namespace, retry=retry,
                        settings={"trigger": dict(trigger or {}), "kind": "stream"},
                        checkpoint=checkpoint_location)
    with config.coordinator() as coordinator:
        coordinator.start(query_id)
    if foreach_batch:
        writer = writer.foreachBatch(ForeachBatchWriter(config))
    else:
        writer = writer.format(register_data_source(df, config))
    query = _started(writer, config)
    with config.coordinator() as coordinator:
        coordinator.record_query(str(query.id))
    log_commits(df.sparkSession, str(query.id), store)
    log.info("started query %s into %r (namespace %s, epoch %d, state %s)",
             query.id, sink, config.namespace, config.epoch, store.path)
    return query


def write(
    df: DataFrame,
    sink: TwoPhaseCommitSink[Any],
    *,
    state_location: str,
    state_options: Mapping[str, Any] | None = None,
    namespace: str | None = None,
    retry: RetryPolicy | None = None,
) -> None:
    """Write a (batch) DataFrame into ``sink`` as one all-or-nothing transaction set.

    Each call is one batch of the "query" that ``state_location`` identifies: its transactions
    are decided together, and a later call first finishes a call that crashed after deciding.
    """
    if not state_location:
        raise ConfigurationError("write needs state_location (a directory or S3 prefix).",
                                 fix="pass state_location='/path/to/state' or 's3://b/state'")
    _require_sink(sink)
    if df.isStreaming:
        raise ConfigurationError("twophase.spark.write got a streaming DataFrame.",
                                 fix="use twophase.spark.write_stream for streams")
    store = StateStore(state_location, state_options)
    existing = store.read()
    config = _begin_run(df, sink, store, query_id=existing.query_id if existing else None,
                        namespace=namespace, retry=retry, settings={"kind": "batch"})
    state = store.update(_with_job_query_id, epoch=config.epoch)
    with config.coordinator() as coordinator:
        coordinator.start(state.query_id)
    config = replace(config, query_id=state.query_id, batch=state.last_decided_batch + 1)
    df.write.format(register_data_source(df, config)).mode("append").save()


def _require_sink(sink: object) -> None:
    if not isinstance(sink, TwoPhaseCommitSink):
        raise ConfigurationError(f"{sink!r} is not a TwoPhaseCommitSink.",
                                 fix="pass a sink object, e.g. sinks.sqlite.SQLiteSink(...)")


def _stream_writer(df: DataFrame, checkpoint_location: str, *,
                   trigger: Mapping[str, Any] | None, query_name: str | None) -> DataStreamWriter:
    """Spark's writer with every option set that Spark validates before ``start``."""
    if not df.isStreaming:
        raise ConfigurationError("twophase.spark.write_stream got a batch DataFrame.",
                                 fix="use twophase.spark.write for batch DataFrames")
    writer = df.writeStream.option("checkpointLocation", checkpoint_location)
    if trigger:
        try:
            writer = writer.trigger(**trigger)
        except (TypeError, ValueError, PySparkException) as exc:
            raise ConfigurationError(
                f"Spark refuses the trigger {dict(trigger)!r}: {exc}.",
                fix="pass one of processingTime='10 seconds', once=True, availableNow=True, "
                "continuous=... (the keywords of DataStreamWriter.trigger, case-sensitive)",
            ) from exc
    if query_name is not None:
        if not isinstance(query_name, str) or not query_name.strip():
            raise ConfigurationError(f"query_name={query_name!r} is not a usable name.",
                                     fix="pass a non-empty string, or leave it out")
        writer = writer.queryName(query_name)
    return writer


def _require_not_running(df: DataFrame, query_id: str | None) -> None:
    """Refuse to take over a query that runs in this very Spark session (Spark would refuse
    to start it anyway, but only after the takeover had fenced the live run)."""
    if query_id is None:
        return
    for active in df.sparkSession.streams.active:
        if str(active.id) == query_id:
            raise ConfigurationError(
                f"query {query_id} of this checkpoint is already running in this Spark session.",
                fix="stop it first (query.stop()), or give the new query its own checkpoint",
            )


def _started(writer: DataStreamWriter, config: RunConfig) -> StreamingQuery:
    try:
        return writer.start()
    except Exception as exc:
        raise ConfigurationError(
            f"Spark refused to start the query after this run (epoch {config.epoch}) took it "
            f"over from any earlier run and finished its decided batches: {exc}",
            fix="correct the cause and start the query again; nothing of it is half-visible",
        ) from exc


def _begin_run(
    df: DataFrame,
    sink: TwoPhaseCommitSink[Any],
    store: StateStore,
    *,
    query_id: str | None,
    namespace: str | None,
    retry: RetryPolicy | None,
    settings: dict[str, Any],
    checkpoint: str | None = None,
) -> RunConfig:
    """Check the namespace and the rows' columns, then fence older runs; return the config."""
    namespace = validate_namespace(namespace or sink.default_namespace())
    _require_no_speculation(df)
    retry = retry or RetryPolicy()
    columns = columns_of(df.schema)
    _check_schema(sink, columns, store, query_id=query_id, retry=retry)
    state = store.start_run(namespace, settings)
    return RunConfig(sink=sink, state_location=store.location, namespace=namespace,
                     epoch=state.epoch, columns=columns, retry=retry, checkpoint=checkpoint,
                     state_options=store.options, decided_through=state.last_decided_batch,
                     tasks_read_state=_tasks_read_state(df, store))


def _require_no_speculation(df: DataFrame) -> None:
    """Refuse speculative tasks: a retried task aborts its failed attempts' transactions,
    which is safe only if no other attempt of its partition is still running."""
    if (df.sparkSession.conf.get("spark.speculation", "false") or "").lower() == "true":
        raise ConfigurationError(
            "spark.speculation is on: a partition's speculative copy would write its rows in a "
            "second transaction, and a retried task could not tell a dead attempt from a live "
            "one.", fix="set spark.speculation=false for the query's Spark application")


def _tasks_read_state(df: DataFrame, store: StateStore) -> bool:
    """Can Spark's tasks read the state? On S3, or on this host's disk in local mode."""
    if is_s3(store.location):
        return True
    master = df.sparkSession.conf.get("spark.master", "") or ""
    if master.startswith("local"):
        return True
    log.info("the state %s is on the driver's disk and the tasks run elsewhere (%s): the "
             "driver's sweeps alone abort what tasks of a given-up batch pre-commit late",
             store.path, master)
    return False


def _check_schema(sink: TwoPhaseCommitSink[Any], columns: tuple[Column, ...],
                  store: StateStore, *, query_id: str | None, retry: RetryPolicy) -> None:
    """The sink's schema check; on a mismatch, first finish what earlier runs decided.

    A redeploy that changes the schema is refused until the target is changed; but prepared
    transactions of a crashed run's decided batch hold locks that the change (an ALTER
    TABLE) would wait for. Finishing them takes no takeover: it is safe beside a live run.
    """
    try:
        sink.check_schema(columns)
    except SchemaMismatchError as exc:
        state = store.read()
        if state is None:
            raise
        try:
            with Coordinator(sink, store, namespace=state.namespace, epoch=state.epoch,
                             retry=retry) as coordinator:
                coordinator.start(query_id or state.query_id)  # no takeover: its epoch
        except TwoPhaseError as settle_error:
            log.warning("could not finish the decided batches of earlier runs: %s", settle_error)
            raise exc from settle_error
        raise SchemaMismatchError(
            f"{exc.cause} (Decided batches of earlier runs are committed and their undecided "
            "transactions aborted, so none holds a lock that a schema change waits for.)",
            fix=exc.fix,
        ) from exc


def _same_query(store: StateStore, checkpoint_location: str, *,
                accept_lost_state: bool) -> str | None:
    """The query id, if known yet; refuses a state that does not belong to the checkpoint.

    A new checkpoint restarts batch ids at 0: its batches must not pass for replays of the old
    query's (nor the other way round). A checkpoint with batches the state does not know lost
    its state: the decided batches among them would be written again.
    """
    state = store.read()
    checkpoint_query = checkpoint_query_id(checkpoint_location)
    if state is not None and state.query_id not in (None, checkpoint_query):
        if is_remote(checkpoint_location):
            return state.query_id  # a remote checkpoint: trust the state file
        raise ConfigurationError(
            f"the state file {store.path} belongs to query {state.query_id}, but the "
            f"checkpoint {checkpoint_location} to query "
            f"{checkpoint_query or '(none: a new checkpoint)'}.",
            fix="give each checkpoint its own state_location (the default keeps the state "
            "inside the checkpoint), or restore the checkpoint that goes with this state",
        )
    _require_state_of_every_batch(store, state, checkpoint_location,
                                  accept_lost_state=accept_lost_state)
    return checkpoint_query or (state.query_id if state else None)


def _require_state_of_every_batch(store: StateStore, state: State | None,
                                  checkpoint_location: str, *, accept_lost_state: bool) -> None:
    started = _checkpoint_batches(checkpoint_location, SPARK_OFFSETS_DIR)
    committed = _checkpoint_batches(checkpoint_location, SPARK_COMMITS_DIR)
    if state is None and (started or committed):
        problem = (f"the checkpoint {checkpoint_location} has run batches up to "
                   f"{max(started | committed)}, but there is no state file {store.path}")
    elif state is not None and committed and max(committed) > state.last_decided_batch:
        problem = (f"the checkpoint {checkpoint_location} committed batches up to "
                   f"{max(committed)}, but the state file {store.path} knows batches only up "
                   f"to {state.last_decided_batch} (restored from an older backup?)")
    else:
        return
    if accept_lost_state:
        log.warning("%s; starting anyway (accept_lost_state): a batch decided in the lost "
                    "state may be written twice", problem)
        return
    raise ConfigurationError(
        f"{problem}. The state records which batches were decided; without it a batch that "
        "was decided but not finished would be written twice.",
        fix="restore the twophase/ directory that belongs to this checkpoint (from the same "
        "backup), or pass accept_lost_state=True to start anyway and accept duplicates of "
        "the last batch",
    )


def _checkpoint_batches(checkpoint_location: str, log_dir: str) -> set[int]:
    """The batch ids in one of Spark's checkpoint logs (empty for a remote checkpoint)."""
    if is_remote(checkpoint_location):
        return set()
    directory = local_path(checkpoint_location) / log_dir
    try:
        return {int(entry.name) for entry in directory.iterdir() if entry.name.isdigit()}
    except (FileNotFoundError, NotADirectoryError):
        return set()


def _with_job_query_id(state: State) -> State:
    """Batch jobs of one state location share a query id, so a job sweeps its crashed ones."""
    return state if state.query_id else replace(state, query_id=str(uuid.uuid4()))
