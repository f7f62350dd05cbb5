"""A crashable streaming driver, for the demo, the crash tests and the chaos runs.

:func:`launch` starts ``python -m twophase.testing.driver <spec.json>`` in a session of its own
(so a crash point can SIGKILL the driver, its JVM and its Python workers together, like
``kill -9`` of a job), optionally armed at a crash point, and returns how it ended. The driver
streams a generated order-status feed (JSON files, ``files_per_batch`` per micro-batch) through
:func:`twophase.spark.write_stream` into the sink that ``sink_factory`` builds, until every file
is consumed (``availableNow``). With ``source_kafka`` it reads the same feed from a Kafka topic
instead (:func:`read_kafka_feed`, ``max_offsets_per_trigger`` records per micro-batch; Spark's
Kafka source jars in ``spark_conf["spark.jars"]``).
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.functions import col, from_json

from twophase._crash import (
    CRASH_ENV,
    CRASH_ONCE_ENV,
    CRASH_SCOPE_ENV,
    EXECUTOR_SCOPE,
    kill_session,
)
from twophase._loader import build_sink
from twophase._state import StateStore
from twophase.sink import TwoPhaseCommitSink
from twophase.spark import Commits, write, write_stream
from twophase.testing.jvm import C1_ONLY, java_options
from twophase.testing.target import Target

ORDER_STATUSES = ("created", "paid", "packed", "shipped", "delivered", "cancelled")
FEED_SCHEMA = "event_id BIGINT, order_id BIGINT, status STRING, ts TIMESTAMP"
FEED_START = datetime(2026, 11, 1, tzinfo=UTC)
DRIVER_TIMEOUT_S = 600.0
POLL_INTERVAL_S = 0.5
PIPELINED_COMMITS_DEPRECATED = (
    "{name}'s pipelined_commits is deprecated and is removed in 0.6.0: set commits='behind' "
    "(for True) or commits='inline' (for False), write_stream's option")
AVAILABLE_NOW = {"availableNow": True}
SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.extraJavaOptions": C1_ONLY,
    "spark.sql.streaming.minBatchesToRetain": "10",
}


@dataclass(frozen=True)
class DriverSpec:
    """Everything a driver process needs; written to JSON and read by the child."""

    input_dir: str
    checkpoint: str
    sink_factory: str  # "module:callable", called with sink_kwargs
    sink_kwargs: dict[str, Any] = field(default_factory=dict)
    files_per_batch: int = 1
    partitions: int = 2
    #: Local mode's task slots (``local[cores]``); None: one per partition.
    cores: int | None = None
    #: ``write_stream``'s ``foreach_batch`` (None: chosen by ``write_stream``).
    foreach_batch: bool | None = None
    log_level: str = "INFO"
    #: Where the state lives if not inside the checkpoint (a directory or ``s3://``), and
    #: its options (see :class:`~twophase._state.StateStore`).
    state_location: str | None = None
    state_options: dict[str, Any] = field(default_factory=dict)
    #: Spark settings; with ``spark.master`` the driver runs on that cluster, and an armed
    #: crash point reached in a task kills that task's executor, once (see twophase._crash).
    spark_conf: dict[str, str] = field(default_factory=dict)
    #: Read the feed from Kafka instead of ``input_dir``: the keyword arguments of
    #: :func:`read_kafka_feed` (``bootstrap_servers``, ``topic``, ``max_offsets_per_trigger``,
    #: ``options``).
    source_kafka: dict[str, Any] | None = None
    #: A Spark Connect URL (``sc://host:port``): the driver is a Connect client of that
    #: server (the Spark driver, whose Python workers import the sink); ``spark_conf`` is
    #: then the server's business and ignored here.
    remote: str | None = None
    #: Write the whole feed as one batch job (:func:`twophase.spark.write`, the state in
    #: ``state_location``) instead of streaming it.
    batch: bool = False
    #: The stream's trigger (by default it ends once every file is consumed).
    trigger: dict[str, Any] = field(default_factory=lambda: dict(AVAILABLE_NOW))
    #: Stop the query once every file of the feed is written (``processAllAvailable``, then
    #: ``stop``): for a trigger that runs until stopped, as ``processingTime``.
    stop_when_done: bool = False
    #: ``write_stream``'s ``commits`` (``"auto"``: chosen for the trigger).
    commits: Commits = "auto"
    #: Serve the query's Prometheus metrics on this port while the driver runs.
    metrics_port: int | None = None
    #: The Python that Spark starts its Python workers with (``PYSPARK_PYTHON``), on the
    #: executors and on the driver (where a data source's planning and commit run), say
    #: ``./environment/bin/python`` of a packed virtualenv shipped by ``spark.archives``: a
    #: relative path starts from each one's working directory (an executor's, where Spark
    #: unpacks the archive; the driver's). None: the driver's own Python.
    pyspark_python: str | None = None
    #: Deprecated, removed in 0.6.0: ``commits="behind"`` (True) or ``"inline"`` (False).
    pipelined_commits: bool | None = None

    def __post_init__(self) -> None:
        if self.pipelined_commits is None:
            return
        warnings.warn(PIPELINED_COMMITS_DEPRECATED.format(name="DriverSpec"),
                      DeprecationWarning, stacklevel=3)
        object.__setattr__(self, "commits", "behind" if self.pipelined_commits else "inline")
        object.__setattr__(self, "pipelined_commits", None)

    @classmethod
    def into(cls, target: Target, workdir: Path, **settings: Any) -> DriverSpec:
        """A driver streaming the feed in ``workdir/feed`` into ``target``, its checkpoint
        in ``workdir/ckpt`` (``settings``: any other field)."""
        settings.setdefault("input_dir", str(workdir / "feed"))
        settings.setdefault("checkpoint", str(workdir / "ckpt"))
        return cls(sink_factory=target.factory, sink_kwargs=target.options, **settings)

    def build_sink(self) -> TwoPhaseCommitSink[Any]:
        return build_sink(self.sink_factory, self.sink_kwargs)

    def fields_set(self) -> dict[str, Any]:
        """The fields whose values are not their defaults (what the child is told)."""
        values = asdict(self)
        return {f.name: values[f.name] for f in fields(self) if values[f.name] != _default(f)}

    def state_store(self) -> StateStore:
        if self.state_location:
            return StateStore(self.state_location, self.state_options)
        return StateStore.for_checkpoint(self.checkpoint, self.state_options)


def _default(spec_field: Field[Any]) -> Any:
    if spec_field.default_factory is not MISSING:
        return spec_field.default_factory()
    return spec_field.default


def generate_feed(input_dir: Path, *, files: int, rows_per_file: int, seed: int = 7) -> int:
    """Write ``files`` JSON files of order events with unique ``event_id``; return the row count.

    Spark's file source takes files in modification-time order: each file gets a time one
    second after the previous one, so batch ``n`` always holds file ``n``.
    """
    input_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)  # noqa: S311 - test data, not secrets
    event_id = 0
    first_mtime = int(time.time()) - files
    for number in range(files):
        path = input_dir / f"orders-{number:05d}.json"
        with path.open("w") as out:
            for _ in range(rows_per_file):
                out.write(json.dumps(_order_event(rng, event_id)) + "\n")
                event_id += 1
        os.utime(path, (first_mtime + number, first_mtime + number))
    return event_id


#: The keys of a keyed feed: few, so that one batch changes a key several times.
KEYED_FEED_KEYS = 40
#: The ``status`` that marks a delete in a keyed feed (Debezium's ``op`` for one).
KEYED_FEED_DELETE = "d"


@dataclass(frozen=True)
class KeyedFeed:
    """What a keyed feed must leave in a table: ``newest``, ``order_id -> event_id`` of each
    key's newest change whose newest change is no delete; and ``upserts``, every
    ``(order_id, event_id)`` the feed writes (a row a reader may see before the end)."""

    newest: dict[int, int]
    upserts: frozenset[tuple[int, int]]


def generate_keyed_feed(input_dir: Path, *, files: int, rows_per_file: int,
                        seed: int = 47) -> KeyedFeed:
    """Write ``files`` JSON files of changes (:data:`FEED_SCHEMA`: ``order_id`` the key, one of
    :data:`KEYED_FEED_KEYS`, ``event_id`` its version, ``status`` ``'d'`` a delete) the way a
    change stream delivers them: each file's rows out of order, one change in ten late (in
    the next file or the one after), one in twenty delivered again in a later file. Return
    the reference computed from the feed (:class:`KeyedFeed`)."""
    input_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)  # noqa: S311 - test data, not secrets
    placed: list[list[dict[str, Any]]] = [[] for _ in range(files)]
    newest: dict[int, dict[str, Any]] = {}
    for event_id in range(files * rows_per_file):
        change = {**_order_event(rng, event_id), "order_id": rng.randrange(KEYED_FEED_KEYS)}
        if rng.random() < 0.2:
            change["status"] = KEYED_FEED_DELETE
        newest[change["order_id"]] = change
        home = event_id // rows_per_file
        late = rng.choice((1, 2)) if rng.random() < 0.1 else 0
        placed[min(files - 1, home + late)].append(change)
        if rng.random() < 0.05 and home + 1 < files:
            placed[rng.randrange(home + 1, files)].append(change)
    first_mtime = int(time.time()) - files
    for number, changes in enumerate(placed):
        rng.shuffle(changes)
        path = input_dir / f"changes-{number:05d}.json"
        path.write_text("".join(json.dumps(change) + "\n" for change in changes))
        os.utime(path, (first_mtime + number, first_mtime + number))
    return KeyedFeed(
        newest={key: change["event_id"] for key, change in newest.items()
                if change["status"] != KEYED_FEED_DELETE},
        upserts=frozenset((change["order_id"], change["event_id"]) for changes in placed
                          for change in changes if change["status"] != KEYED_FEED_DELETE))


def _order_event(rng: random.Random, event_id: int) -> dict[str, Any]:
    ts = FEED_START + timedelta(seconds=event_id)
    return {
        "event_id": event_id,
        "order_id": rng.randrange(1, 50_000),
        "status": rng.choice(ORDER_STATUSES),
        "ts": ts.isoformat(),
    }


@dataclass(frozen=True)
class RunResult:
    returncode: int
    crashed: bool  # killed by SIGKILL, as an armed crash point does
    log: Path


def launch(spec: DriverSpec, *, workdir: Path, crash_at: str | None = None,
           timeout_s: float = DRIVER_TIMEOUT_S,
           while_running: Callable[[], None] | None = None,
           on_start: Callable[[int], None] | None = None,
           python_path: Sequence[Path] = ()) -> RunResult:
    """Run one driver to its end (or its crash point) in a session of its own.

    The driver runs in ``workdir`` and keeps its local files there (its temporary directory
    and Spark's ``spark.local.dir``): as if on a host of its own. ``while_running`` is called
    about every ``POLL_INTERVAL_S`` until the driver exits; ``on_start`` with the driver's pid
    (its session's and process group's id) once it is started. ``python_path`` goes first on
    the path of the driver and its Python workers: a directory holding another release of
    twophase runs that release's driver (the spec names only the fields set, which a release
    that knows fewer fields reads as well).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path = workdir / "driver-spec.json"
    spec_path.write_text(json.dumps(spec.fields_set()))
    env = driver_environment(workdir, python_path)
    if crash_at:
        env[CRASH_ENV] = crash_at
    log_path = workdir / "driver.log"
    with log_path.open("a") as log_file:
        log_file.write(f"\n=== driver run, crash point {crash_at or 'none'} ===\n")
        log_file.flush()
        process = subprocess.Popen(
            [sys.executable, "-m", "twophase.testing.driver", str(spec_path)], cwd=workdir,
            env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            if on_start is not None:
                on_start(process.pid)
            returncode = _wait(process, timeout_s, while_running)
        finally:
            kill_session(process.pid)  # what is left: a JVM whose Python parent died, say
    return RunResult(returncode, returncode == -signal.SIGKILL, log_path)


def driver_environment(workdir: Path, python_path: Sequence[Path] = ()) -> dict[str, str]:
    """The environment of a driver run in ``workdir`` (unarmed): its temporary directory
    there, ``python_path`` first on its path, then the caller's modules (a sink factory in
    its test package), from any directory."""
    scratch = workdir / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    path = [*map(str, python_path), os.getcwd(), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "TMPDIR": str(scratch),
           "PYTHONPATH": os.pathsep.join(filter(None, path))}
    env.pop(CRASH_ENV, None)
    return env


def _wait(process: subprocess.Popen[bytes], timeout_s: float,
          while_running: Callable[[], None] | None) -> int:
    deadline = time.monotonic() + timeout_s
    while (returncode := process.poll()) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"driver {process.pid} still running after {timeout_s:.0f}s")
        if while_running is not None:
            while_running()
        time.sleep(POLL_INTERVAL_S)
    if while_running is not None:
        while_running()
    return returncode


# -- the child ----------------------------------------------------------------------------


def local_session(app_name: str, cores: int = 2, conf: dict[str, str] | None = None,
                  python: str | None = None) -> SparkSession:
    """A SparkSession tuned for small machines, with workers on this Python (or ``python``):
    local with ``cores``, unless ``conf`` names a ``spark.master``."""
    os.environ["PYSPARK_PYTHON"] = python or sys.executable
    builder = SparkSession.builder.master(f"local[{cores}]").appName(app_name)
    settings = {**SPARK_CONF, **(conf or {})}
    if "spark.driver.extraJavaOptions" not in (conf or {}):  # else the caller's own JVM
        settings["spark.driver.extraJavaOptions"] = java_options()
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def read_feed(spark: SparkSession, input_dir: str | Path, *, files_per_batch: int = 1,
              partitions: int = 2) -> DataFrame:
    """The order feed as a stream: ``files_per_batch`` files per micro-batch."""
    return (spark.readStream.schema(FEED_SCHEMA).option("maxFilesPerTrigger", files_per_batch)
            .json(str(input_dir)).repartition(partitions))


def read_kafka_feed(spark: SparkSession, *, bootstrap_servers: str, topic: str,
                    max_offsets_per_trigger: int | None = None,
                    options: Mapping[str, str] | None = None, partitions: int = 2) -> DataFrame:
    """The order feed as a stream from a Kafka topic of JSON records (as :func:`generate_feed`
    writes them, one record a line), from its earliest offsets: at most
    ``max_offsets_per_trigger`` records per micro-batch; ``options`` are more of the source's
    (``kafka.security.protocol``, ...). Needs Spark's Kafka source jars."""
    reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap_servers)
              .options(**(options or {})).option("subscribe", topic)
              .option("startingOffsets", "earliest"))
    if max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", max_offsets_per_trigger)
    records = reader.load().select(from_json(col("value").cast("string"), FEED_SCHEMA).alias("e"))
    return records.select("e.*").repartition(partitions)


def run_driver(spec: DriverSpec) -> None:
    """Stream every file of the feed into the sink, then return."""
    spark = _session(spec)
    if spec.batch:
        write(spark.read.schema(FEED_SCHEMA).json(spec.input_dir), spec.build_sink(),
              state_location=spec.state_store().location, state_options=spec.state_options)
        spark.stop()
        return
    if spec.source_kafka is not None:
        feed = read_kafka_feed(spark, **spec.source_kafka, partitions=spec.partitions)
    else:
        feed = read_feed(spark, spec.input_dir, files_per_batch=spec.files_per_batch,
                         partitions=spec.partitions)
    query = write_stream(feed, spec.build_sink(), checkpoint_location=spec.checkpoint,
                         state_location=spec.state_location,
                         state_options=spec.state_options or None,
                         trigger=spec.trigger, foreach_batch=spec.foreach_batch,
                         metrics_port=spec.metrics_port, commits=spec.commits)
    if spec.stop_when_done:
        query.processAllAvailable()
        query.stop()
    else:
        query.awaitTermination()
    spark.stop()


def _session(spec: DriverSpec) -> SparkSession:
    """A Connect client session of ``spec.remote``, or a local (or cluster) driver's."""
    if spec.remote is not None:
        return SparkSession.builder.remote(spec.remote).getOrCreate()
    conf = {"spark.local.dir": tempfile.gettempdir(), **spec.spark_conf}
    if "spark.master" in spec.spark_conf and CRASH_ENV in os.environ:
        conf.update(executor_crash_conf(os.environ[CRASH_ENV], Path(tempfile.gettempdir())))
    return local_session("twophase-driver", spec.cores or spec.partitions, conf,
                         python=spec.pyspark_python)


def executor_crash_conf(crash_at: str, scratch: Path) -> dict[str, str]:
    """Arm the executors too: the first task to reach the point kills its executor."""
    return {f"spark.executorEnv.{CRASH_ENV}": crash_at,
            f"spark.executorEnv.{CRASH_SCOPE_ENV}": EXECUTOR_SCOPE,
            f"spark.executorEnv.{CRASH_ONCE_ENV}": str(crash_marker(scratch.parent))}


def crash_marker(workdir: Path) -> Path:
    """The file the executor that crashed created (see TWOPHASE_CRASH_ONCE)."""
    return workdir / "executor-crashed"


def main(argv: list[str]) -> int:
    spec = DriverSpec(**json.loads(Path(argv[0]).read_text()))
    logging.basicConfig(level=spec.log_level, stream=sys.stdout,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_driver(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
