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
import re
import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pyspark.errors import PySparkException
from pyspark.sql.streaming.query import StreamingQuery

from twophase._coordinator import Coordinator
from twophase._handle import fitted_namespace, validate_namespace
from twophase._loader import sink_class_name
from twophase._pipeline import COMMITTING_ELSEWHERE_WAIT_S, drop_pipeline, wait_for_commits
from twophase._preflight import require_executor_imports
from twophase._progress import log_commits
from twophase._retry import RetryPolicy
from twophase._spark import (
    ForeachBatchWriter,
    RunConfig,
    checkpoint_query_id,
    columns_of,
    is_connect,
    is_remote,
    on_spark_side,
    register_data_source,
)
from twophase._state import State, StateStore
from twophase._storage import is_s3, local_path
from twophase._workers import worker_tuning_on
from twophase.errors import ConfigurationError, FatalError, SchemaMismatchError, TwoPhaseError
from twophase.group import SinkGroup
from twophase.sink import Column, TwoPhaseCommitSink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.readwriter import DataStreamWriter

__all__ = ["Commits", "PipelinedQuery", "write", "write_stream"]

log = logging.getLogger(__name__)

T = TypeVar("T")

SPARK_OFFSETS_DIR = "offsets"  # Spark's log of started batches
SPARK_COMMITS_DIR = "commits"  # Spark's log of finished batches
#: The triggers of a query that ends by itself once the data available at its start is done.
ENDING_TRIGGERS = ("availableNow", "once")
#: The triggers whose value is an interval, and how the server measures one (NULL: none).
INTERVAL_TRIGGERS = ("processingTime", "continuous", "realTime")
#: Partitions a keyed stream is routed into over Spark Connect when the server's session sets
#: no ``spark.default.parallelism`` (the client cannot see its cores).
DEFAULT_KEY_PARTITIONS = 8
#: ``write_stream``'s ``commits``: chosen for the query, behind the next batch, or inline.
Commits = Literal["auto", "behind", "inline"]
COMMITS_AUTO: Commits = "auto"
COMMITS_BEHIND: Commits = "behind"
COMMITS_INLINE: Commits = "inline"
COMMITS: tuple[Commits, ...] = (COMMITS_AUTO, COMMITS_BEHIND, COMMITS_INLINE)
#: The first PySpark whose Python data source reuses its Python processes across batches
#: (before it, classic Spark's streams go through ``foreachBatch``: docs/PERFORMANCE.md).
DATA_SOURCE_REUSES_WORKERS = (4, 3)
#: The triggers that ``foreachBatch`` does not run (it is micro-batch only).
NOT_MICRO_BATCH_TRIGGERS = ("continuous", "realTime")
#: The deprecated keywords of ``write`` and ``write_stream`` (removed in 0.6.0): the fix of each.
GROUP_DEPRECATED = {
    "commit_order": "pass SinkGroup({...}, commit_order=[...]) as the sink",
    "columns": "pass SinkGroup({...}, columns={...}) as the sink",
}
STREAM_DEPRECATED = {
    **GROUP_DEPRECATED,
    "pipelined_commits": "pass commits='behind' (for True) or commits='inline' (for False)",
}
INTERVAL_MICROS_SQL = ("SELECT unix_micros(TIMESTAMP'2000-01-01' + try_cast(:interval AS INTERVAL))"
                       " - unix_micros(TIMESTAMP'2000-01-01')")


def write_stream(
    df: DataFrame,
    sink: TwoPhaseCommitSink[Any] | Mapping[str, TwoPhaseCommitSink[Any]],
    *,
    checkpoint_location: str,
    namespace: str | None = None,
    state_location: str | None = None,
    state_options: Mapping[str, Any] | None = None,
    trigger: Mapping[str, Any] | None = None,
    query_name: str | None = None,
    retry: RetryPolicy | None = None,
    commits: Commits = COMMITS_AUTO,
    accept_lost_state: bool = False,
    metrics_port: int | str | None = None,
    route_by_key: int | bool = True,
    foreach_batch: bool | None = None,
    **deprecated: Any,
) -> StreamingQuery:
    """Start a streaming query that writes ``df`` into ``sink`` exactly once.

    Args:
        df: a streaming DataFrame whose columns the sink accepts (checked before the start).
        sink: the sink, e.g. ``sinks.sqlite.SQLiteSink(...)``; or several, by name
            (``{"orders": table_sink, "events": topic_sink}``): a :class:`~twophase.SinkGroup`,
            every batch decided once for all of them and committed member by member.
        checkpoint_location: Spark's checkpoint directory; the state file lives inside it,
            whether it is local (or a shared mount) or on S3 (``s3://``, ``s3a://``).
        namespace: prefix of every transaction id (default: derived from the sink's target).
            Keep it stable for the life of the checkpoint: recovery finds transactions by it.
        state_location: a directory or ``s3://bucket/prefix`` for the state file, if not
            inside the checkpoint (required for a checkpoint on HDFS or another file system).
        state_options: for a state on S3, any of :data:`twophase.kit.s3.S3_OPTIONS`
            (``endpoint_url``, ``region``, ``path_style``, credentials (default: boto3's
            chain), ``checksums``, the timeouts).
        trigger: keyword arguments of ``DataStreamWriter.trigger``, e.g.
            ``{"processingTime": "10 seconds"}`` or ``{"availableNow": True}``.
        query_name: Spark's query name.
        retry: how retryable errors are retried (default: :class:`RetryPolicy`).
        commits: when a batch's transactions commit once it is decided: ``"behind"`` the next
            batch (Spark goes on to the next batch while the batch commits: docs/how-it-works.md,
            "Latency"), ``"inline"`` (before Spark goes on), or ``"auto"`` (the default):
            behind for a query that runs until stopped (no trigger, or ``processingTime``) in
            classic Spark, inline for one that ends by itself (``availableNow``, ``once``)
            and over Spark Connect, where behind is refused. Behind with a trigger that ends
            by itself runs the query through ``foreachBatch``, whose commits behind run in
            this process and which ``awaitTermination`` waits for. A query that commits
            behind is returned as a :class:`PipelinedQuery`: its ``stop``,
            ``awaitTermination`` and ``processAllAvailable`` return once every batch it
            decided is visible.
        accept_lost_state: start although the checkpoint has batches the state file does not
            know (it was deleted, or restored from an older backup). A batch that was decided
            but not done may then be written twice: only for someone who accepts that.
        metrics_port: serve Prometheus metrics of the query on this port (or ``"HOST:PORT"``)
            from this process (see :mod:`twophase.metrics`; needs ``twophase[metrics]``).
        route_by_key: for a sink that needs every key of a batch in one task (``mode="keyed"``
            into MySQL XA or PostgreSQL prepared transactions, or a Kafka changelog: see
            ``route_key``), how rows are routed by key before the writer: ``True`` (the
            default) into as many partitions as ``spark.default.parallelism`` (classic Spark:
            the cores), a number into that many (never ``spark.sql.shuffle.partitions``,
            which the checkpoint pins), ``False`` for a stream that is keyed already (each key
            in one partition of every batch: if it is not, a task waits on another's lock
            until the lock timeout names it). One shuffle; a sink without a ``route_key`` is
            never routed.
        foreach_batch: an escape hatch; leave it out. Which of Spark's two ways runs the
            sink is chosen for you: Spark's ``foreachBatch`` (each partition written by a task
            from Arrow, ``mapInArrow``, or from Spark's Rows on a driver without pyarrow; the
            batch decided in this process) in classic Spark before PySpark 4.3, where it is
            the faster way (docs/PERFORMANCE.md), and for ``commits="behind"`` with a trigger
            that ends by itself; the Python Data Source API otherwise (PySpark 4.3 and later,
            Spark Connect, a ``continuous`` or ``realTime`` trigger). ``True`` or ``False``
            forces one of them, to work around a problem of the other.

    Deprecated, removed in 0.6.0 (each with a :class:`DeprecationWarning`):
    ``pipelined_commits=True``/``False`` (use ``commits="behind"``/``"inline"``), and
    ``commit_order=`` and ``columns=`` (pass ``SinkGroup({...}, commit_order=...,
    columns=...)`` as the sink).

    Everything that can be checked is checked before this run takes the query over from an
    earlier one (fencing it): the options, the trigger, the state against the checkpoint, and
    the rows' columns against the target. A failed check raises ConfigurationError or
    SchemaMismatchError and leaves a live run of the query untouched. Then decided batches of
    earlier runs are committed and their undecided transactions aborted (an unreachable server
    is raised here), and the query starts. From a Spark Connect client the checks against the
    checkpoint, the state and the target, and the takeover, run in a Spark task on the
    server's side (the driver's), and their errors are raised here as in classic mode.
    """
    if not checkpoint_location:
        raise ConfigurationError("write_stream needs checkpoint_location.",
                                 fix="pass checkpoint_location='/path/to/checkpoint'")
    options = _deprecated_options("write_stream", deprecated, STREAM_DEPRECATED)
    sink = as_sink(sink, commit_order=options.get("commit_order"), columns=options.get("columns"))
    df = routed_by_key(df, sink, route_by_key)
    plan = _plan(_commits_of(commits, options), trigger, connect=is_connect(df),
                 foreach_batch=foreach_batch)
    writer = _stream_writer(df, checkpoint_location, trigger=trigger, query_name=query_name)
    store = (StateStore(state_location, state_options) if state_location
             else StateStore.for_checkpoint(checkpoint_location, state_options))
    takeover = _takeover(df, sink, store, namespace=namespace, retry=retry,
                         settings={"trigger": dict(trigger or {}), "kind": "stream"},
                         checkpoint=checkpoint_location, accept_lost_state=accept_lost_state)
    config = replace(_where_the_driver_is(df, takeover.of_stream), sink=sink,
                     pipelined=plan.behind, worker_tuning=worker_tuning_on())
    _serve_metrics(metrics_port, store, sink.kind)
    if plan.foreach_batch:
        writer = writer.foreachBatch(ForeachBatchWriter(config))
    else:
        writer = writer.format(register_data_source(df, config))
    query = _started(writer, config)
    _where_the_driver_is(df, partial(_record_query, config, str(query.id)))
    log_commits(df.sparkSession, str(query.id), store)
    log.info("started query %s into %r (namespace %s, epoch %d, state %s, commits %s, "
             "through %s)", query.id, sink, config.namespace, config.epoch, store.path,
             "behind the next batch" if plan.behind else "in each batch",
             "foreachBatch" if plan.foreach_batch else "the Python data source")
    return PipelinedQuery(query, config) if plan.behind else query


def write(
    df: DataFrame,
    sink: TwoPhaseCommitSink[Any] | Mapping[str, TwoPhaseCommitSink[Any]],
    *,
    state_location: str,
    state_options: Mapping[str, Any] | None = None,
    namespace: str | None = None,
    retry: RetryPolicy | None = None,
    metrics_port: int | str | None = None,
    route_by_key: int | bool = True,
    **deprecated: Any,
) -> None:
    """Write a (batch) DataFrame into ``sink`` as one all-or-nothing transaction set.

    Each call is one batch of the "query" that ``state_location`` identifies: its transactions
    are decided together, and a later call first finishes a call that crashed after deciding.
    ``metrics_port`` serves its metrics as for :func:`write_stream`, while this process runs;
    several sinks by name make a group (a :class:`~twophase.SinkGroup` of its own options
    passed as the sink, too), and ``route_by_key`` routes a keyed sink's rows, as there.
    ``commit_order=`` and ``columns=`` are deprecated as there.
    """
    if not state_location:
        raise ConfigurationError("write needs state_location (a directory or S3 prefix).",
                                 fix="pass state_location='/path/to/state' or 's3://b/state'")
    options = _deprecated_options("write", deprecated, GROUP_DEPRECATED)
    sink = as_sink(sink, commit_order=options.get("commit_order"), columns=options.get("columns"))
    df = routed_by_key(df, sink, route_by_key)
    if df.isStreaming:
        raise ConfigurationError("twophase.spark.write got a streaming DataFrame.",
                                 fix="use twophase.spark.write_stream for streams")
    store = StateStore(state_location, state_options)
    _serve_metrics(metrics_port, store, sink.kind)
    takeover = _takeover(df, sink, store, namespace=namespace, retry=retry,
                         settings={"kind": "batch"})
    config = replace(_where_the_driver_is(df, takeover.of_job), sink=sink,
                     worker_tuning=worker_tuning_on())
    df.write.format(register_data_source(df, config)).mode("append").save()


def routed_by_key(df: DataFrame, sink: TwoPhaseCommitSink[Any],
                  route_by_key: int | bool) -> DataFrame:
    """``df`` repartitioned by the sink's :meth:`~twophase.TwoPhaseCommitSink.route_key` into
    ``route_by_key`` partitions (``True``: the session's default parallelism), unchanged when
    the sink needs no routing or ``route_by_key`` is False (see :func:`write_stream`)."""
    if isinstance(route_by_key, bool) or (isinstance(route_by_key, int) and route_by_key > 0):
        key = sink.route_key()
    else:
        raise ConfigurationError(
            f"route_by_key={route_by_key!r} is neither a number of partitions nor a bool.",
            fix="leave it True (the default parallelism), pass a positive int, or False for "
                "a stream already keyed")
    if key is None or route_by_key is False:
        return df
    partitions = default_parallelism(df) if route_by_key is True else route_by_key
    if missing := [column for column in key if column not in df.columns]:
        raise SchemaMismatchError(
            f"the rows are routed by the key {list(key)}, but the DataFrame has no column "
            f"{', '.join(map(repr, missing))} (its columns: {', '.join(df.columns)}).",
            fix="select the key columns in the DataFrame")
    log.info("routing rows by %s into %d partitions (every key of a batch in one task)",
             list(key), partitions)
    return df.repartition(partitions, *key)


def default_parallelism(df: DataFrame) -> int:
    """``spark.default.parallelism`` if set, else classic Spark's default (the cores of a local
    session, the executors' cores of a cluster), else :data:`DEFAULT_KEY_PARTITIONS`."""
    spark = df.sparkSession
    if configured := spark.conf.get("spark.default.parallelism", None):
        return int(configured)
    if is_connect(df):
        return DEFAULT_KEY_PARTITIONS
    return int(spark.sparkContext.defaultParallelism)


@dataclass(frozen=True)
class _Plan:
    """How a stream runs: its commits behind the next batch or inline, and through
    ``foreachBatch`` or Spark's Python data source."""

    behind: bool
    foreach_batch: bool


def _plan(commits: Commits, trigger: Mapping[str, Any] | None, *, connect: bool,
          foreach_batch: bool | None, pyspark: tuple[int, int] | None = None) -> _Plan:
    """When a stream's commits run (``commits``) and which way of Spark's runs the sink
    (``foreach_batch``, None: chosen here), or ConfigurationError for what cannot work.

    Commits behind need a process that outlives the batch: not over Spark Connect (the commit
    callback runs in a Python process of the server that does not outlive it), and for a
    query that ends by itself only through ``foreachBatch`` in classic Spark, whose commits
    behind run in this process and which the returned query's ``awaitTermination`` waits
    for (on the data source path the last one would run in a Python worker of Spark's,
    which may be gone once the query has ended).
    """
    if commits not in COMMITS:
        raise ConfigurationError(
            f"commits={commits!r} is none of {', '.join(map(repr, COMMITS))}.",
            fix="leave it out (auto: behind the next batch for a query that runs until "
                "stopped in classic Spark, inline otherwise), or pass 'behind' or 'inline'")
    ends = any((trigger or {}).get(name) for name in ENDING_TRIGGERS)
    if commits == COMMITS_BEHIND and connect:
        raise ConfigurationError(
            "commits='behind' over Spark Connect: the commit callback runs in a Python "
            "process of the server that does not outlive it, so nothing could commit a batch "
            "behind the next one.",
            fix="leave commits out (over Spark Connect each batch commits inline)")
    if commits == COMMITS_BEHIND and ends and foreach_batch is False:
        raise ConfigurationError(
            f"commits='behind' with the trigger {dict(trigger or {})!r} and "
            "foreach_batch=False: the query ends by itself after its last batch, whose commit "
            "behind would run in a Python worker of Spark's that may be gone by then.",
            fix="leave foreach_batch out (the commits behind then run in this process "
                "through foreachBatch, and awaitTermination waits for the last one), or "
                "leave commits out")
    if foreach_batch is None:
        micro_batches = not any((trigger or {}).get(name) for name in NOT_MICRO_BATCH_TRIGGERS)
        older = (pyspark or _pyspark_version()) < DATA_SOURCE_REUSES_WORKERS
        foreach_batch = (commits == COMMITS_BEHIND and ends) or (
            not connect and micro_batches and older)
    behind = commits == COMMITS_BEHIND or (commits == COMMITS_AUTO and not (ends or connect))
    return _Plan(behind=behind, foreach_batch=foreach_batch)


def _pyspark_version() -> tuple[int, int]:
    """This process's PySpark, as (major, minor)."""
    import pyspark  # noqa: PLC0415 - its version only

    major, minor = (int(part) for part in re.findall(r"\d+", pyspark.__version__)[:2])
    return major, minor


def _commits_of(commits: Commits, options: Mapping[str, Any]) -> Commits:
    """``commits``, or what the deprecated ``pipelined_commits`` asks for."""
    if options.get("pipelined_commits") is None:
        return commits
    if commits != COMMITS_AUTO:
        raise ConfigurationError(
            f"write_stream got commits={commits!r} and the deprecated pipelined_commits=.",
            fix="pass commits= alone")
    return COMMITS_BEHIND if options["pipelined_commits"] else COMMITS_INLINE


def _deprecated_options(function: str, given: Mapping[str, Any],
                        accepted: Mapping[str, str]) -> dict[str, Any]:
    """The deprecated keywords ``function`` was given, each warned about with its replacement;
    any other keyword is a TypeError, as Python's for a keyword the signature lacks."""
    for name in given:
        if name not in accepted:
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r}")
        warnings.warn(f"{function}(..., {name}=) is deprecated and is removed in 0.6.0: "
                      f"{accepted[name]}", DeprecationWarning, stacklevel=3)
    return dict(given)


class PipelinedQuery(StreamingQuery):
    """A stream whose batches commit behind the next one: its ``stop``,
    ``awaitTermination`` and ``processAllAvailable`` return once every batch it decided is
    visible (they wait for the commit behind; a batch left pending by a process that died is
    committed here)."""

    def __init__(self, query: StreamingQuery, config: RunConfig) -> None:
        super().__init__(query._jsq)
        self._config = config

    def stop(self) -> None:
        super().stop()
        self._drain()

    def awaitTermination(self, timeout: int | None = None) -> bool | None:  # noqa: N802
        try:
            ended = super().awaitTermination(timeout)
        except BaseException:
            self._drain()
            raise
        if ended is not False:
            self._drain()
        return ended

    def processAllAvailable(self) -> None:  # noqa: N802
        super().processAllAvailable()
        wait_for_commits(self._config.store())

    def _drain(self) -> None:
        """After the query ended: every decided batch committed (here, if still pending)."""
        config = self._config
        committed_here = drop_pipeline(config.run_key())  # foreachBatch: this process
        if wait_for_commits(config.store(), wait_s=0 if committed_here else
                            COMMITTING_ELSEWHERE_WAIT_S):
            return
        try:
            with config.coordinator() as coordinator:
                coordinator.recover()
        except TwoPhaseError as exc:
            log.warning("query %s ended with a decided batch that could not be committed "
                        "now (the next start commits it): %s", self.id, exc)


def _serve_metrics(listen: int | str | None, store: StateStore, sink: str) -> None:
    """``metrics_port=``: serve this process's metrics on ``listen`` and report the query
    whose state is ``store`` there (nothing if ``listen`` is None)."""
    if listen is None:
        return
    try:
        from twophase import metrics  # noqa: PLC0415 - prometheus_client is an extra
    except ImportError as exc:
        raise ConfigurationError("metrics_port needs prometheus_client, which is not installed.",
                                 fix="pip install 'twophase[metrics]'") from exc
    metrics.serve(listen)
    metrics.watch(store, sink=sink)


def as_sink(sink: object, *, commit_order: Sequence[str] | None = None,
            columns: Mapping[str, Sequence[str]] | None = None) -> TwoPhaseCommitSink[Any]:
    """The sink a job names: a sink, or a group of named sinks (a mapping)."""
    if isinstance(sink, Mapping):
        return SinkGroup(sink, commit_order=commit_order, columns=columns)
    if not isinstance(sink, TwoPhaseCommitSink):
        raise ConfigurationError(f"{sink!r} is not a TwoPhaseCommitSink.",
                                 fix="pass a sink object, e.g. sinks.sqlite.SQLiteSink(...), or "
                                 "several by name: {'orders': ..., 'events': ...}")
    if commit_order is not None or columns is not None:
        raise ConfigurationError("commit_order and columns are for several sinks (a group).",
                                 fix="pass the sinks by name, {'orders': ..., 'events': ...}, "
                                 "or leave commit_order and columns out")
    return sink


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
            if is_connect(df):
                _parse_intervals_on_server(df.sparkSession, trigger)
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


def _parse_intervals_on_server(spark: SparkSession, trigger: Mapping[str, Any]) -> None:
    """A Spark Connect client sends a trigger's interval as text, which the server parses
    only when the query starts, after the takeover: parse it there now, as Spark's trigger
    does (an interval, not negative)."""
    for key in INTERVAL_TRIGGERS:
        value = trigger.get(key)
        if isinstance(value, str):
            row = spark.sql(INTERVAL_MICROS_SQL, args={"interval": value}).first()
            if row is None or row[0] is None or row[0] < 0:
                raise ValueError(f"{key}={value!r} is not an interval of zero or more")


def _require_not_running(running: frozenset[str], query_id: str | None) -> None:
    """Refuse to take over a query that runs in this very Spark session (Spark would refuse
    to start it anyway, but only after the takeover had fenced the live run)."""
    if query_id is not None and query_id in running:
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


def _takeover(
    df: DataFrame,
    sink: TwoPhaseCommitSink[Any],
    store: StateStore,
    *,
    namespace: str | None,
    retry: RetryPolicy | None,
    settings: dict[str, Any],
    checkpoint: str | None = None,
    accept_lost_state: bool = False,
) -> _Takeover:
    """What the caller's Spark session tells of the run (checked here), for the takeover."""
    _require_no_speculation(df)
    require_executor_imports(df.sparkSession, sink)
    running = (frozenset(str(query.id) for query in df.sparkSession.streams.active)
               if checkpoint is not None else frozenset())
    return _Takeover(sink=sink, state_location=store.location, state_options=store.options,
                     namespace=namespace, retry=retry or RetryPolicy(),
                     columns=columns_of(df.schema), settings=settings,
                     tasks_read_state=_tasks_read_state(df, store), running=running,
                     checkpoint=checkpoint, accept_lost_state=accept_lost_state)


@dataclass(frozen=True)
class _Takeover:
    """A run's checks against the checkpoint, the state and the target, then its takeover of
    the query (fencing earlier runs, finishing what they decided): all in one step, run where
    the driver is (see :func:`_where_the_driver_is`), which sees the checkpoint, the state
    and the sink's servers as the run's commits will."""

    sink: TwoPhaseCommitSink[Any]
    state_location: str
    state_options: dict[str, Any]
    namespace: str | None
    retry: RetryPolicy
    columns: tuple[Column, ...]
    settings: dict[str, Any]
    tasks_read_state: bool
    #: The ids of the queries running in the caller's Spark session.
    running: frozenset[str]
    #: A stream's checkpoint location (None: a batch job).
    checkpoint: str | None = None
    accept_lost_state: bool = False

    def of_stream(self) -> RunConfig:
        if self.checkpoint is None:
            raise FatalError("a stream's takeover has no checkpoint.",
                             fix="report this as a twophase bug")
        store = StateStore(self.state_location, self.state_options)
        query_id = _same_query(store, self.checkpoint, accept_lost_state=self.accept_lost_state)
        _require_not_running(self.running, query_id)
        config = self._begin_run(store, query_id)
        with config.coordinator() as coordinator:
            coordinator.start(query_id)
        return config

    def of_job(self) -> RunConfig:
        """A batch job: one batch of the "query" of its state location, with an id chosen here."""
        store = StateStore(self.state_location, self.state_options)
        existing = store.read()
        config = self._begin_run(store, existing.query_id if existing else None)
        state = store.update(_with_job_query_id, epoch=config.epoch)
        with config.coordinator() as coordinator:
            coordinator.start(state.query_id)
        return replace(config, query_id=state.query_id, batch=state.last_decided_batch + 1)

    def _begin_run(self, store: StateStore, query_id: str | None) -> RunConfig:
        """Check the namespace and the rows' columns, then fence older runs."""
        sink = self.sink
        namespace, former = _namespaces(sink, self.namespace)
        _check_schema(sink, self.columns, store, query_id=query_id, retry=self.retry)
        state = store.start_run(namespace, {**self.settings, "sink": sink.kind,
                                            "sink_class": sink_class_name(sink)},
                                keeping=former)
        if state.namespace != namespace:
            log.info("the state was started under namespace %r, this sink's former default: "
                     "it keeps it (a new checkpoint gets %r)", state.namespace, namespace)
        return RunConfig(sink=sink, state_location=store.location, namespace=state.namespace,
                         epoch=state.epoch, columns=self.columns, retry=self.retry,
                         checkpoint=self.checkpoint, state_options=store.options,
                         decided_through=state.last_decided_batch,
                         tasks_read_state=self.tasks_read_state)


def _namespaces(sink: TwoPhaseCommitSink[Any], given: str | None) -> tuple[str, tuple[str, ...]]:
    """The run's namespace (``given``, else the sink's default) and the namespaces a saved
    state may keep instead: the sink's former defaults when the job names none (0.5.0 added
    where the target is to the defaults: a running query's namespace stays)."""
    if given:
        return validate_namespace(given), ()
    return (fitted_namespace(sink.default_namespace()),
            tuple(fitted_namespace(name) for name in sink.former_default_namespaces()))


def _where_the_driver_is(df: DataFrame, action: Callable[[], T]) -> T:
    """``action()`` in this process if it is the Spark driver; for a Spark Connect client,
    in a task on the server's side, where the checkpoint, the state and the sink's servers
    are as the driver sees them (the client may share neither disk nor network with it)."""
    return on_spark_side(df.sparkSession, action) if is_connect(df) else action()


def _record_query(config: RunConfig, query_id: str) -> None:
    with config.coordinator() as coordinator:
        coordinator.record_query(query_id)


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

    A server that cannot be reached is retried as ``retry`` says (a query started while its
    server restarts waits for it). A redeploy that changes the schema is refused until the
    target is changed; but prepared transactions of a crashed run's decided batch hold locks
    that the change (an ALTER TABLE) would wait for. Finishing them takes no takeover: it is
    safe beside a live run.
    """
    try:
        retry.call(lambda: sink.check_schema(columns), what="checking the target's schema")
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
