"""The soak of issue 28 through Spark: one streaming query per sink for thousands of
micro-batches, the driver SIGKILLed at a random crash point every few hundred batches, cleanup
run between restarts, and what could grow with the number of batches sampled as it runs.

Run from the repository root (never in CI)::

    .venv/bin/python -m bench.soak_spark --sink sqlite --batches 10000 [--restart-every 300]
        [--rows-per-second 200] [--sample-every 100] [--source rate] [--out docs/soak]
    .venv/bin/python -m bench.soak_spark --sink mysql,postgres,kafka,s3 --batches 2000 ...

The driver is a child process in a session of its own (``--child``). For each sink named
(one, or several as several queries of one driver, as an application runs them), Spark's
``rate`` source (deterministic after a restart from the checkpoint: its ``value`` is the
event id) mapped to the orders columns, written by :func:`twophase.spark.write_stream` with
the fastest trigger into a fresh target of the sink's setup (a private server of its own),
with its own checkpoint, state and ``/metrics`` endpoint on a free port. Each query runs
until its last batch reaches ``--batches``, then stops. Each child is armed at a random
crash point of a random batch within ``--restart-every`` (``TWOPHASE_CRASH_AT``: the first
query to reach it is the real SIGKILL of the whole session, JVM, Python workers and the other
queries with it); ``python -m twophase.cleanup`` runs after each child (a short retention, so
proofs of commit are purged as a production cron does).

The ``rate`` source makes at most one batch a second (its offsets are whole seconds);
``--source rate-micro-batch`` makes ``--rows-per-second`` rows a batch, as fast as the query
goes (its rows and timestamps are as deterministic).

Every ``--sample-every`` batches (read from the state file's history, polled) a JSON line:
decide + commit p50/p99 of those batches, the driver's RSS (its Python process and JVM) and
the Python workers' (the driver's, shared by its queries), the state file's and the
checkpoint's size, the ``/metrics`` scrape time, and the sink's bookkeeping
(:data:`BOOKKEEPING`), per query. At the end every event id up to the highest must be
visible exactly once in every sink and nothing left in doubt (exit 1 otherwise).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.soak import (
    NAMESPACE,
    Restart,
    cleanup,
    fresh_target,
    latency_percentiles,
    plot,
    rss_mb,
    size,
    verdict,
)
from setups import SETUPS
from setups.base import Target
from setups.servers.local import free_port
from twophase.testing.crash_points import CRASH_ENV, CRASH_POINTS, kill_session
from twophase.testing.driver import driver_environment
from twophase.testing.protocol import BatchRecord, StateStore

log = logging.getLogger("bench.soak_spark")

DEFAULT_BATCHES = 10_000
DEFAULT_RESTART_EVERY = 300
DEFAULT_ROWS_PER_SECOND = 200
DEFAULT_SAMPLE_EVERY = 100
DEFAULT_PARTITIONS = 2
#: Kafka: the registry's segments roll (and its markers go) after a minute, not an hour and a
#: day, so that a soak of minutes shows the bound that compaction keeps it at.
DEFAULT_REGISTRY_SEGMENT_MS = 60_000
SOURCES = ("rate", "rate-micro-batch")
FASTEST_TRIGGER = {"processingTime": "0 seconds"}
#: Proofs of commit older than this are purged by each cleanup (production: days).
CLEANUP_RETENTION = "60s"
#: How often the parent reads the state file (and the child the query's progress).
POLL_S = 0.5
#: A child that made no batch for this long is stuck (the soak fails).
STALL_TIMEOUT_S = 600.0
METRICS_TIMEOUT_S = 10.0
ORDERS_PER_CUSTOMER = 1000
MB = 1024.0


@dataclass(frozen=True)
class Query:
    """One query of the soak: its sink, checkpoint, state and ``/metrics`` port."""

    sink: str
    factory: str
    options: dict[str, Any]
    checkpoint: str
    state: str
    metrics_port: int

    @classmethod
    def into(cls, target: Target, workdir: Path) -> Query:
        folder = workdir / target.setup.name
        return cls(target.setup.name, target.factory, dict(target.options),
                   str(folder / "ckpt"), str(folder / "state"), free_port())


@dataclass(frozen=True)
class Plan:
    """What a child runs (passed as JSON on its command line)."""

    queries: list[Query]
    batches: int
    source: str
    rows_per_second: int
    partitions: int

    @classmethod
    def from_json(cls, text: str) -> Plan:
        fields = json.loads(text)
        return cls(**{**fields, "queries": [Query(**query) for query in fields["queries"]]})


# -- the child: one run of the query ----------------------------------------------------------


def run_child(plan: Plan) -> None:
    """Stream the rate source into each sink until its query's batch ``plan.batches - 1``."""
    from bench.session import bench_session, provenance  # noqa: PLC0415 - the child's only

    spark = bench_session("twophase-soak", plan.partitions,
                          {"spark.local.dir": tempfile.gettempdir()})
    print(provenance(spark), flush=True)
    running = [_started(spark, plan, query) for query in plan.queries]
    while running:
        for query in list(running):
            if not query.isActive:
                raise RuntimeError(f"the query failed: {query.exception()}")
            if _last_batch(query.lastProgress) >= plan.batches - 1:
                query.stop()
                running.remove(query)
        time.sleep(POLL_S)
    spark.stop()


def _started(spark: Any, plan: Plan, query: Query) -> Any:
    from pyspark.sql import functions as f  # noqa: PLC0415

    from twophase.spark import write_stream  # noqa: PLC0415
    from twophase.testing.protocol import build_sink  # noqa: PLC0415

    events = _source(spark.readStream, plan).load().select(
        f.col("value").alias("event_id"),
        (f.col("value") % ORDERS_PER_CUSTOMER).alias("order_id"),
        f.lit("paid").alias("status"), f.col("timestamp").alias("ts"))
    return write_stream(events, build_sink(query.factory, query.options),
                        checkpoint_location=query.checkpoint, state_location=query.state,
                        namespace=NAMESPACE, trigger=FASTEST_TRIGGER,
                        metrics_port=query.metrics_port, query_name=f"soak-{query.sink}")


def _source(reader: Any, plan: Plan) -> Any:
    reader = reader.format(plan.source).option("numPartitions", plan.partitions)
    if plan.source == "rate-micro-batch":
        return reader.option("rowsPerBatch", plan.rows_per_second)
    return reader.option("rowsPerSecond", plan.rows_per_second)


def _last_batch(progress: dict[str, Any] | None) -> int:
    return int(progress["batchId"]) if progress else -1


# -- the parent: restarts, samples, the verdict -----------------------------------------------


@dataclass
class Sampler:
    """Samples every ``every`` batches of the state's history (a JSON line each): the
    history holds the last batches done (a bounded number), so it is polled often and the
    records of each batch since the last sample kept until the next."""

    query: Query
    target: Target
    every: int
    out: Path
    next_at: int = 0
    seen: dict[int, BatchRecord] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.next_at = self.every

    def poll(self, child: int | None) -> int:
        """Take in the state's history; sample if a sample's batch is reached. Returns the
        last batch done (-1: none)."""
        state = StateStore(self.query.state).read()
        if state is None:
            return -1
        floor = self.next_at - self.every  # the batches before it are in a sample already
        self.seen.update((r.batch, r) for r in state.history if r.batch >= floor)
        while state.last_done_batch + 1 >= self.next_at:
            self._write(self._sample(self.next_at, child))
            self.next_at += self.every
        return state.last_done_batch

    def _sample(self, batch: int, child: int | None) -> dict[str, Any]:
        records = [self.seen.pop(b) for b in sorted(self.seen) if b < batch]
        latencies = [r.decision_ms + r.commit_ms for r in records]
        processes = session_rss_mb(child) if child is not None else {}
        return {"batch": batch, "t": round(time.time(), 3), "batches_in": len(records),
                **latency_percentiles(latencies), **processes,
                # the file alone: a write's temporary beside it would count twice
                "state_bytes": size(Path(StateStore(self.query.state).path)),
                "checkpoint_bytes": size(Path(self.query.checkpoint)),
                "metrics_ms": scrape_ms(self.query.metrics_port) if child is not None else None,
                **bookkeeping(self.target)}

    def _write(self, sample: dict[str, Any]) -> None:
        with self.out.open("a") as samples:
            samples.write(json.dumps(sample) + "\n")
        log.info("sample %s %s", self.query.sink, json.dumps(sample))


def samples_file(workdir: Path, sink: str) -> Path:
    return workdir / f"samples-{sink}.jsonl"


def soak(targets: Sequence[Target], workdir: Path, plan: Plan, *, restart_every: int,
         sample_every: int, rng: random.Random) -> list[Restart]:
    samplers = [Sampler(query, target, sample_every, samples_file(workdir, query.sink))
                for query, target in zip(plan.queries, targets, strict=True)]
    restarts: list[Restart] = []
    while _slowest(samplers) < plan.batches - 1:
        restarts.append(_one_child(plan, workdir, len(restarts), restart_every, rng, samplers))
        for query in plan.queries:
            cleanup(query.factory, query.options, query.state, CLEANUP_RETENTION)
        log.info("restart %d: %s at batch %d (%.1fs)", restarts[-1].number, restarts[-1].how,
                 restarts[-1].spark_batch, restarts[-1].seconds)
    return restarts


def _slowest(samplers: Sequence[Sampler]) -> int:
    """The last batch done by the query furthest behind (polling every query's state)."""
    return min(sampler.poll(None) for sampler in samplers)


def _leading(samplers: Sequence[Sampler], batches: int) -> int:
    """The last batch done by the query furthest ahead of those not done: the next crash is
    armed after it (armed after the slowest's, the fastest would reach it at once)."""
    return max(last for sampler in samplers if (last := sampler.poll(None)) < batches - 1)


def _unfinished(plan: Plan, samplers: Sequence[Sampler]) -> Plan:
    """The plan of the queries not done yet (a done one started again would go on)."""
    return replace(plan, queries=[sampler.query for sampler in samplers
                                  if sampler.poll(None) < plan.batches - 1])


def _one_child(plan: Plan, workdir: Path, number: int, restart_every: int,
               rng: random.Random, samplers: Sequence[Sampler]) -> Restart:
    first = _leading(samplers, plan.batches) + 1
    env = driver_environment(workdir)
    point, at = rng.choice(CRASH_POINTS), first + rng.randrange(restart_every)
    if at < plan.batches:
        env[CRASH_ENV] = f"{point}@{at}"
    how = env.get(CRASH_ENV, "unarmed")
    started = time.monotonic()
    with (workdir / "driver.log").open("a") as driver_log:
        driver_log.write(f"\n=== child {number}, crash point {how} ===\n")
        driver_log.flush()
        child = subprocess.Popen(
            [sys.executable, "-m", "bench.soak_spark", "--child",
             json.dumps(asdict(_unfinished(plan, samplers)))],
            env=env, cwd=workdir, stdout=driver_log, stderr=subprocess.STDOUT,
            start_new_session=True)
        try:
            returncode = _watch(child, samplers, plan.batches)
        finally:
            kill_session(child.pid)  # a JVM or worker its killed driver left behind
    if returncode == 0:
        how = "finished"
    elif returncode != -signal.SIGKILL:
        raise RuntimeError(f"child {number} failed with exit code {returncode}; "
                           f"see {workdir / 'driver.log'}")
    return Restart(number, how, _slowest(samplers), time.monotonic() - started)


def _watch(child: subprocess.Popen[bytes], samplers: Sequence[Sampler], batches: int) -> int:
    """Poll every query's state (sampling) until the child exits; fail it if a query that
    is not done stalls."""
    last = {sampler.query.sink: -1 for sampler in samplers}
    moved = dict.fromkeys(last, time.monotonic())
    while (returncode := child.poll()) is None:
        for sampler in samplers:
            sink, batch = sampler.query.sink, sampler.poll(child.pid)
            if batch != last[sink] or batch >= batches - 1:
                last[sink], moved[sink] = batch, time.monotonic()
            elif time.monotonic() - moved[sink] > STALL_TIMEOUT_S:
                raise TimeoutError(f"{sink}: no batch done for {STALL_TIMEOUT_S:.0f}s after "
                                   f"batch {batch}")
        time.sleep(POLL_S)
    return returncode


# -- what is sampled --------------------------------------------------------------------------


def session_rss_mb(session: int) -> dict[str, float]:
    """The RSS of a driver's session: the driver (its Python process and its JVM, also
    apart: a leak of twophase's would be the Python process's) and the rest (the JVM's
    Python workers: pyspark's daemon and its forks)."""
    python = jvm = workers = 0.0
    for pid in _session_processes(session):
        resident = rss_mb(pid)
        if pid == session:
            python += resident
        elif _command(pid) == "java":
            jvm += resident
        else:
            workers += resident
    return {"driver_rss_mb": round(python + jvm, 1), "driver_python_rss_mb": round(python, 1),
            "driver_jvm_rss_mb": round(jvm, 1), "workers_rss_mb": round(workers, 1)}


def _session_processes(session: int) -> list[int]:
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # the fields after the command (which may hold spaces): state ppid pgrp session
            if int(stat.read_text().rsplit(")", 1)[1].split()[3]) == session:
                pids.append(int(stat.parent.name))
    return pids


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def scrape_ms(port: int) -> float | None:
    """How long a GET of the driver's ``/metrics`` takes (None: it did not answer)."""
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                    timeout=METRICS_TIMEOUT_S) as response:
            response.read()
    except OSError:
        return None
    return round((time.perf_counter() - started) * 1000, 2)


def _sqlite_rows(target: Target) -> dict[str, int]:
    import sqlite3  # noqa: PLC0415

    from sinks.sqlite import COMMITTED_TABLE, PREPARED_TABLE  # noqa: PLC0415
    counts = {}
    with contextlib.closing(sqlite3.connect(target.options["path"], timeout=30)) as connection:
        for key, table in (("committed_rows", COMMITTED_TABLE), ("prepared_rows", PREPARED_TABLE)):
            try:
                counts[key] = connection.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
            except sqlite3.OperationalError:  # not made yet
                counts[key] = 0
    return counts


def _mysql_markers(target: Target) -> dict[str, int]:
    query = target.setup.db.query  # type: ignore[attr-defined]
    table = target.options["marker_table"]
    rows = query("SELECT count(*) FROM information_schema.tables WHERE table_schema = "
                 "DATABASE() AND table_name = %s", (table,))
    if not rows[0][0]:  # not made yet
        return {"marker_rows": 0}
    return {"marker_rows": query(f"SELECT count(*) FROM `{table}`")[0][0]}


def _postgres_markers(target: Target) -> dict[str, int]:
    from psycopg import sql  # noqa: PLC0415
    from psycopg.errors import UndefinedTable  # noqa: PLC0415

    from sinks.postgres.markers import DEFAULT_MARKER_TABLE  # noqa: PLC0415
    from sinks.postgres.sink import DEFAULT_SCHEMA  # noqa: PLC0415
    table = sql.Identifier(target.options.get("schema", DEFAULT_SCHEMA),
                           target.options.get("marker_table", DEFAULT_MARKER_TABLE))
    try:
        rows = target.setup.view.query(  # type: ignore[attr-defined]
            sql.SQL("SELECT count(*) FROM {}").format(table))
    except UndefinedTable:  # not made yet
        return {"marker_rows": 0}
    return {"marker_rows": rows[0][0]}


def _kafka_ids(target: Target) -> dict[str, int]:
    """The transactional ids of the target's prefix the broker knows; the registry's offset
    span (every record ever written: compaction leaves the offsets), its live records (what a
    restarted driver reads) and its bytes on the broker's disk."""
    import re  # noqa: PLC0415

    broker = target.setup.broker  # type: ignore[attr-defined]
    admin = broker.admin()
    try:
        listed = admin.list_transactions(transactional_id_pattern=re.escape(
            target.options["transactional_id_prefix"]) + ".*")
        ids = {listing.transactional_id for listings in listed.values() for listing in listings}
        on_disk = _registry_bytes(admin, _registry_topic(target))
    finally:
        admin.close()
    return {"transactional_ids": len(ids), **_registry_records(target), "registry_bytes": on_disk}


def _registry_topic(target: Target) -> str:
    from sinks.kafka.registry import DEFAULT_REGISTRY_TOPIC  # noqa: PLC0415
    return str(target.options.get("registry_topic", DEFAULT_REGISTRY_TOPIC))


def _registry_records(target: Target) -> dict[str, int]:
    """The registry's offset span and the records still in it, read from its start (a
    restarted driver's first read), aborted ones included."""
    from kafka import KafkaConsumer, TopicPartition  # noqa: PLC0415

    from sinks.kafka.registry import REGISTRY_PARTITION  # noqa: PLC0415

    broker = target.setup.broker  # type: ignore[attr-defined]
    partition = TopicPartition(_registry_topic(target), REGISTRY_PARTITION)
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers,
                             isolation_level="read_uncommitted", enable_auto_commit=False,
                             **broker.client_configs())
    try:
        consumer.assign([partition])
        start = consumer.beginning_offsets([partition])[partition]
        end = consumer.end_offsets([partition])[partition]
        consumer.seek(partition, start)
        live = 0
        while consumer.position(partition) < end:
            live += sum(len(records) for records in consumer.poll(timeout_ms=200).values())
    finally:
        consumer.close()
    return {"registry_offsets": end - start, "registry_records": live}


def _registry_bytes(admin: Any, topic: str) -> int:
    """The registry's size on the broker's disks (every log directory, every replica)."""
    described = admin.describe_log_dirs(topic_partitions=[topic])
    return sum(partition["partition_size"] for broker in described
               for log_dir in broker["log_dirs"] for found in log_dir["topics"]
               if found["name"] == topic for partition in found["partitions"])


def compressed_registry(target: Target, segment_ms: int) -> None:
    """Create the Kafka registry topic as the sink would, but rolling its segments and
    dropping its transaction markers after ``segment_ms`` instead of an hour and a day: a
    soak of minutes then shows where compaction holds the registry, as months would."""
    from sinks.kafka.registry import REGISTRY_CONFIGS, ensure_topic  # noqa: PLC0415

    configs = {**REGISTRY_CONFIGS, "segment.ms": str(segment_ms),
               "delete.retention.ms": str(segment_ms)}
    admin = target.setup.broker.admin()  # type: ignore[attr-defined]
    try:
        ensure_topic(admin, _registry_topic(target), 1, configs)
    finally:
        admin.close()


def _s3_objects(target: Target) -> dict[str, int]:
    client = target.setup.client  # type: ignore[attr-defined]
    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket=target.options["bucket"], Prefix=target.options["prefix"])
    return {"objects": sum(page.get("KeyCount", 0) for page in pages)}


#: Per sink, its bookkeeping in the target: proofs of commit, markers, ids, objects.
BOOKKEEPING: dict[str, Callable[[Target], dict[str, int]]] = {
    "sqlite": _sqlite_rows, "mysql": _mysql_markers, "postgres": _postgres_markers,
    "kafka": _kafka_ids, "s3": _s3_objects}


def bookkeeping(target: Target) -> dict[str, int]:
    """The sink's bookkeeping counts (none for a sink without a probe; a failed probe is
    logged, not fatal: the soak goes on)."""
    probe = BOOKKEEPING.get(target.setup.name)
    if probe is None:
        return {}
    try:
        return probe(target)
    except Exception:
        log.warning("bookkeeping probe of %s failed", target.setup.name, exc_info=True)
        return {}


# -- the run ----------------------------------------------------------------------------------


def summary(sink: str, plan: Plan, restarts: list[Restart], seconds: float,
            target: Target) -> dict[str, Any]:
    visible = target.visible()
    return {"sink": sink, "batches": plan.batches, "source": plan.source,
            "rows_per_second": plan.rows_per_second,
            "queries_in_driver": [query.sink for query in plan.queries],
            "restarts": len(restarts),
            "seconds": round(seconds, 1), "batches_per_s": round(plan.batches / seconds, 3),
            **verdict(target, max(visible, default=-1) + 1),
            "restart_log": [asdict(r) for r in restarts]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--sink", type=_sinks, default=["sqlite"],
                        help=f"one of {', '.join(sorted(SETUPS))}, or several (a,b): one "
                        "query each, in one driver")
    parser.add_argument("--batches", type=int, default=DEFAULT_BATCHES)
    parser.add_argument("--restart-every", type=int, default=DEFAULT_RESTART_EVERY)
    parser.add_argument("--rows-per-second", type=int, default=DEFAULT_ROWS_PER_SECOND,
                        help="of the rate source (rate-micro-batch: rows a batch)")
    parser.add_argument("--source", choices=SOURCES, default="rate")
    parser.add_argument("--partitions", type=int, default=DEFAULT_PARTITIONS)
    parser.add_argument("--sample-every", type=int, default=DEFAULT_SAMPLE_EVERY)
    parser.add_argument("--seed", type=int, default=20261125)
    parser.add_argument("--out", type=Path, help="write the samples, summary and plot here")
    parser.add_argument("--registry-segment-ms", type=int, default=DEFAULT_REGISTRY_SEGMENT_MS,
                        help="Kafka: the registry's segment.ms and delete.retention.ms (0: "
                        "the sink's own, an hour and a day)")
    args = parser.parse_args()
    if args.child:
        logging.basicConfig(level=logging.WARNING)
        run_child(Plan.from_json(args.child))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for noisy in ("twophase", "sinks"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    logging.getLogger("kafka").setLevel(logging.CRITICAL)  # a starting broker refuses
    with tempfile.TemporaryDirectory(prefix="twophase-soak-spark-") as scratch, \
            contextlib.ExitStack() as servers:
        workdir = Path(scratch)
        targets = [servers.enter_context(fresh_target(sink, workdir / f"target-{sink}"))
                   for sink in args.sink]
        for target in targets:
            if target.setup.name == "kafka" and args.registry_segment_ms:
                compressed_registry(target, args.registry_segment_ms)
        plan = Plan([Query.into(target, workdir) for target in targets], args.batches,
                    args.source, args.rows_per_second, args.partitions)
        started = time.monotonic()
        restarts = soak(targets, workdir, plan, restart_every=args.restart_every,
                        sample_every=args.sample_every, rng=random.Random(args.seed))
        seconds = time.monotonic() - started
        results = [summary(query.sink, plan, restarts, seconds, target)
                   for query, target in zip(plan.queries, targets, strict=True)]
        for result in results:
            log.info("%s", json.dumps({k: v for k, v in result.items() if k != "restart_log"}))
            if args.out:
                _save(args.out, workdir, result)
    return 0 if all(r["duplicates"] == r["missing"] == r["in_doubt"] == 0 for r in results) else 1


def _sinks(names: str) -> list[str]:
    sinks = names.split(",")
    unknown = sorted(set(sinks) - set(SETUPS))
    if unknown or len(set(sinks)) != len(sinks):
        raise argparse.ArgumentTypeError(f"sinks are {', '.join(sorted(SETUPS))}, each once; "
                                         f"got {names!r}")
    return sinks


def _save(out: Path, workdir: Path, result: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    sink = result["sink"]
    samples = out / f"soak-spark-{sink}-samples.jsonl"
    samples.write_text(samples_file(workdir, sink).read_text())
    (out / f"soak-spark-{sink}.json").write_text(json.dumps(result, indent=1))
    with contextlib.suppress(ImportError):
        plot(samples, out / f"soak-spark-{sink}.png")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
