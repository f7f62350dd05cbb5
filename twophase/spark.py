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

import json
import logging
import uuid
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twophase._handle import validate_namespace
from twophase._retry import RetryPolicy
from twophase._spark import (
    ForeachBatchWriter,
    RunConfig,
    columns_of,
    register_data_source,
)
from twophase._state import State, StateStore
from twophase.errors import ConfigurationError
from twophase.sink import TwoPhaseCommitSink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = ["write", "write_stream"]

log = logging.getLogger("twophase")

FILE_SCHEME = "file:"
SPARK_CHECKPOINT_METADATA = "metadata"  # Spark's checkpoint file holding {"id": query id}


def write_stream(
    df: DataFrame,
    sink: TwoPhaseCommitSink[Any],
    *,
    checkpoint_location: str,
    namespace: str | None = None,
    state_location: str | None = None,
    trigger: Mapping[str, Any] | None = None,
    query_name: str | None = None,
    retry: RetryPolicy | None = None,
    foreach_batch: bool = False,
) -> StreamingQuery:
    """Start a streaming query that writes ``df`` into ``sink`` exactly once.

    Args:
        df: a streaming DataFrame whose columns the sink accepts (checked before the start).
        sink: the sink, e.g. ``sinks.sqlite.SQLiteSink(...)``.
        checkpoint_location: Spark's checkpoint directory; the state file lives inside it.
        namespace: prefix of every transaction id (default: derived from the sink's target).
            Keep it stable for the life of the checkpoint: recovery finds transactions by it.
        state_location: a local directory for the state file, if not inside the checkpoint
            (required when the checkpoint is not on a local file system).
        trigger: keyword arguments of ``DataStreamWriter.trigger``, e.g.
            ``{"processingTime": "10 seconds"}`` or ``{"availableNow": True}``.
        query_name: Spark's query name.
        retry: how retryable commit/abort errors are retried (default: :class:`RetryPolicy`).
        foreach_batch: drive the sink through ``foreachBatch`` instead of the Python Data
            Source API (which needs pyarrow).

    Raises ConfigurationError or SchemaMismatchError before the query starts if an option is
    wrong, the state location is unusable or the rows do not fit; recovery errors of an earlier
    run (e.g. an unreachable server) are raised here too.
    """
    if not checkpoint_location:
        raise ConfigurationError("write_stream needs checkpoint_location.",
                                 fix="pass checkpoint_location='/path/to/checkpoint'")
    store = (StateStore(_local_dir(state_location)) if state_location
             else StateStore.for_checkpoint(_local_dir(checkpoint_location)))
    query_id = _same_query(store, checkpoint_location)  # before fencing anybody
    config = _begin_run(df, sink, store, namespace=namespace, retry=retry,
                        settings={"trigger": dict(trigger or {}), "kind": "stream"})
    config.coordinator().start(query_id)
    writer = df.writeStream.option("checkpointLocation", checkpoint_location)
    if trigger:
        writer = writer.trigger(**trigger)
    if query_name:
        writer = writer.queryName(query_name)
    if foreach_batch:
        writer = writer.foreachBatch(ForeachBatchWriter(config))
    else:
        writer = writer.format(register_data_source(df, config))
    query = writer.start()
    log.info("started query %s into %r (namespace %s, epoch %d, state %s)",
             query.id, sink, config.namespace, config.epoch, store.path)
    return query


def write(
    df: DataFrame,
    sink: TwoPhaseCommitSink[Any],
    *,
    state_location: str,
    namespace: str | None = None,
    retry: RetryPolicy | None = None,
) -> None:
    """Write a (batch) DataFrame into ``sink`` as one all-or-nothing transaction set.

    Each call is one batch of the "query" that ``state_location`` identifies: its transactions
    are decided together, and a later call first finishes a call that crashed after deciding.
    """
    if not state_location:
        raise ConfigurationError("write needs state_location (a local directory).",
                                 fix="pass state_location='/path/to/state'")
    store = StateStore(_local_dir(state_location))
    config = _begin_run(df, sink, store, namespace=namespace, retry=retry,
                        settings={"kind": "batch"})
    state = store.update(_with_job_query_id, epoch=config.epoch)
    config.coordinator().start(state.query_id)
    config = replace(config, query_id=state.query_id, batch=state.last_done_batch + 1)
    df.write.format(register_data_source(df, config)).mode("append").save()


def _begin_run(
    df: DataFrame,
    sink: TwoPhaseCommitSink[Any],
    store: StateStore,
    *,
    namespace: str | None,
    retry: RetryPolicy | None,
    settings: dict[str, Any],
) -> RunConfig:
    """Check the options and the rows' columns, fence older runs; return the run config."""
    if not isinstance(sink, TwoPhaseCommitSink):
        raise ConfigurationError(f"{sink!r} is not a TwoPhaseCommitSink.",
                                 fix="pass a sink object, e.g. sinks.sqlite.SQLiteSink(...)")
    namespace = validate_namespace(namespace or sink.default_namespace())
    columns = columns_of(df.schema)
    sink.check_schema(columns)
    state = store.start_run(namespace, settings)
    return RunConfig(sink=sink, state_dir=str(store.directory), namespace=namespace,
                     epoch=state.epoch, columns=columns, retry=retry or RetryPolicy())


def _same_query(store: StateStore, checkpoint_location: str) -> str | None:
    """The query id, if known yet; refuses a state file that belongs to another query.

    A new checkpoint restarts batch ids at 0: its batches must not pass for replays of the old
    query's (nor the other way round).
    """
    state = store.read()
    checkpoint_query = _checkpoint_query_id(checkpoint_location)
    if state is None or state.query_id is None or checkpoint_query == state.query_id:
        return checkpoint_query or (state.query_id if state else None)
    if "://" in checkpoint_location:
        return state.query_id  # a remote checkpoint: trust the state file
    raise ConfigurationError(
        f"the state file {store.path} belongs to query {state.query_id}, but the checkpoint "
        f"{checkpoint_location} to query {checkpoint_query or '(none: a new checkpoint)'}.",
        fix="give each checkpoint its own state_location (the default keeps the state "
        "inside the checkpoint), or restore the checkpoint that goes with this state",
    )


def _checkpoint_query_id(checkpoint_location: str) -> str | None:
    """The query id Spark keeps in ``<checkpoint>/metadata``; None for a new or remote one."""
    if "://" in checkpoint_location:
        return None
    metadata = _local_dir(checkpoint_location) / SPARK_CHECKPOINT_METADATA
    try:
        return str(json.loads(metadata.read_text())["id"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigurationError(f"cannot read Spark's query id from {metadata}: {exc}.",
                                 fix="point checkpoint_location at a Spark checkpoint") from exc


def _with_job_query_id(state: State) -> State:
    """Batch jobs of one state location share a query id, so a job sweeps its crashed ones."""
    return state if state.query_id else replace(state, query_id=str(uuid.uuid4()))


def _local_dir(location: str) -> Path:
    if location.startswith(FILE_SCHEME):
        location = location[len(FILE_SCHEME):].removeprefix("//")
    if "://" in location:
        raise ConfigurationError(
            f"the state file must be on a local file system, not {location!r}.",
            fix="pass state_location='/local/dir' (one per query, kept with the checkpoint)",
        )
    return Path(location)
