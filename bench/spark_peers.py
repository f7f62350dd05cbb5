"""Each sink against what users would pick instead, through the same Spark stream, in one run.

Run from the repository root (never in CI; the peers' jars come from Maven Central, cached by
``scripts/bench-jars``)::

    nice .venv/bin/python -m bench.spark_peers mysql s3 sqlite http \\
        [--files 4] [--rows-per-file 100000] [--rounds 3] [--foreach-batch]
        [--data-source | --commits-behind] [--json RESULTS]

(``python -m bench.publish`` runs every contest, each in its environment, and publishes them.)

The stream: ``--files`` Parquet files of order rows (``twophase.testing.driver.FEED_SCHEMA``:
``event_id`` unique, ``order_id``, ``status``, ``ts``), generated once before any clock starts,
read with ``maxFilesPerTrigger=1`` and ``availableNow`` (one micro-batch per file),
repartitioned to 2 partitions, in one ``local[2]`` SparkSession for every writer. Per sink,
after one warm-up round, ``--rounds`` rounds of three writers, the order turning every round:
the twophase sink (exactly-once), its peer (at-least-once, or a floor), and Spark's ``noop``
(reading and shuffling only). Every run writes into a fresh, empty target of the same private
server (the sink's test setup, ``setups``) and counts only if a reader of the target then sees
exactly the rows of the stream.

Printed per sink (markdown): median rows/s of each writer, every round's rate, CPU seconds per
million rows of the Spark JVM, its Python workers (where the sinks' tasks run), the driver
(this process) and the server process (from ``/proc``: user + system time over the run), and
the paired ratio sink / peer (per round, then the median). ``--json``: the same runs and the
session's provenance as a results file (:func:`contest_record`).

Plugging a sink in: a module ``bench/peer_<name>.py`` defines ``PEER = Peer(...)``:

* ``jars()``: the jars the peer needs in ``spark.jars`` (fetched and cached; may be empty);
* ``conf()`` (optional): other static settings of the one SparkSession the peer needs (Delta's
  session extension and catalog), set for every writer alike;
* ``start(spark, workdir, stack)``: starts the sink's test setup over a private server
  (``setups.<Name>Setup.started``, its stop registered on the ``contextlib.ExitStack``) and
  returns a :class:`Contest`;
* :class:`Contest`: the sink's test setup (``setups.<name>``, a
  :class:`twophase.testing.target.Setup`) and the ``peer`` writer, ``(feed, target,
  checkpoint)`` running a query to its end (``availableNow``) into the target its destination
  name comes from (``target.options``: the table, topic, database file, bucket and prefix, URL);
  ``overrides`` of the setup's sink options (so the sink is built as a user would leave it);
  ``server_pid``, the process whose CPU is the "server" column (None: not counted);
  ``peer_visible`` when the target's own reader cannot read what the peer wrote; ``discard``
  freeing a target once checked (dropping its table, deleting its database file).

Every run gets a fresh target, ``setup.new_target(**overrides)``; the twophase writer is
:func:`twophase` (``write_stream`` into ``target.build()``); a run counts only if a reader then
sees exactly the stream's event ids, each once (``target.visible()``).

``python -m bench.spark_peers NAME`` imports ``bench.peer_NAME`` (:func:`peer_module`; without
a name, every registered sink's, :data:`setups.SETUPS`: ``tests/repo/test_registry.py`` checks that
each has one). :func:`run_writer` and the ``/proc`` helpers are for modules that drive their
own rounds: a contest of more than two writers (``bench/peer_group.py``) sets ``Peer.rounds``,
which runs its rounds over the :class:`Contest` of its ``start`` and returns its own markdown
report.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from bench.session import bench_session, provenance, provenance_of
from setups import SETUPS
from twophase.spark import write_stream
from twophase.testing import Target
from twophase.testing.driver import FEED_SCHEMA, generate_feed
from twophase.testing.target import Setup

PARTITIONS = 2
DEFAULT_FILES = 4
DEFAULT_ROWS_PER_FILE = 100_000
DEFAULT_ROUNDS = 3
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
TWOPHASE, PEER, NOOP = "twophase", "peer", "noop"
#: The options that name a target (the rest are addresses and secrets).
WHERE = ("path", "table", "topic", "bucket", "prefix", "url")

#: ``(feed, target, checkpoint)``: run one query over the whole stream into ``target``, to its
#: end.
Writer = Callable[[DataFrame, Target, str], None]


@dataclass
class Contest:
    """One sink and its peer, writing into fresh targets of the sink's setup."""

    sink: str
    peer_name: str
    setup: Setup
    peer: Writer
    server_pid: int | None = None
    #: Over the setup's sink options, for every target (``setup.new_target(**overrides)``).
    overrides: dict[str, Any] = field(default_factory=dict)
    #: The event ids a reader sees of what the peer wrote, when ``target.visible()`` can't
    #: read it (Spark's file sink: its metadata log says which files count).
    peer_visible: Callable[[Target], list[int]] | None = None
    #: Frees a target once checked (drops its table), so no run leaves work to the next.
    discard: Callable[[Target], object] | None = None


@dataclass(frozen=True)
class Peer:
    """What ``bench/peer_<name>.py`` gives the harness (see the module docstring)."""

    jars: Callable[[], list[str]]
    start: Callable[[SparkSession, Path, contextlib.ExitStack], Contest]
    #: ``(spark, contest, feed, workdir, expected, rounds)`` -> the report, for a contest that
    #: drives its own rounds (None: :func:`contest_rounds` and :func:`report`).
    rounds: Callable[[SparkSession, Contest, DataFrame, Path, int, int], str] | None = None
    #: Static settings of the session beyond ``spark.jars`` (every writer runs under them).
    conf: Callable[[], dict[str, str]] = dict


@dataclass
class Run:
    writer: str
    seconds: float
    cpu: dict[str, float] = field(default_factory=dict)
    round: int = 0


def bench_jars(*patterns: str) -> list[str]:
    """The cached peer jars matching ``patterns`` (fetched once by ``scripts/bench-jars``)."""
    folder = Path(subprocess.run([str(SCRIPTS / "bench-jars")], check=True, text=True,
                                 stdout=subprocess.PIPE).stdout.strip())
    jars = [str(jar) for pattern in patterns for jar in sorted(folder.glob(pattern))]
    if len(jars) < len(patterns):
        raise SystemExit(f"{folder} lacks one of {patterns}: rerun scripts/bench-jars")
    return jars


def peer_module(name: str) -> str:
    """The module of a sink's peer (``bench/peer_<name>.py``)."""
    return f"bench.peer_{name}"


def load_peer(name: str) -> Peer:
    """``bench.peer_<name>.PEER``."""
    module = importlib.import_module(peer_module(name))
    peer: Peer = module.PEER
    return peer


# --- CPU from /proc ---------------------------------------------------------------------------

def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def cpu_seconds(pid: int, *, reaped: bool = False) -> float:
    """User + system CPU seconds of ``pid`` (plus its waited-for children's if ``reaped``;
    0 if it is gone)."""
    fields = _stat(pid)
    if fields is None:
        return 0.0
    last = 15 if reaped else 13  # utime stime [cutime cstime]
    return sum(int(value) for value in fields[11:last]) / CLOCK_TICKS


def descendants(pid: int) -> list[int]:
    """Every living process below ``pid``."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat(int(stat.parent.name))
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo += children.get(child, [])
    return found


def _command(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return b""


def cpu_snapshot(jvm: int, server_pid: int | None) -> dict[str, float]:
    """CPU seconds so far of the JVM, its Python workers (live ones and those they reaped),
    this driver and the server."""
    workers = [pid for pid in descendants(jvm) if b"python" in _command(pid)]
    return {"JVM": cpu_seconds(jvm),
            "Python workers": sum(cpu_seconds(pid, reaped=True) for pid in workers),
            "driver": sum(os.times()[:2]),
            "server": server_cpu_seconds(server_pid) if server_pid else 0.0}


def server_cpu_seconds(pid: int) -> float:
    """CPU seconds of a server: its process, the children it reaped and the living ones (a
    process-per-connection server such as PostgreSQL does its work in its children)."""
    return cpu_seconds(pid, reaped=True) + sum(cpu_seconds(child) for child in descendants(pid))


def jvm_pid(spark: SparkSession) -> int:
    pid: int = spark.sparkContext._gateway.proc.pid  # type: ignore[union-attr]
    return pid


# --- the stream -------------------------------------------------------------------------------

def make_parquet_feed(spark: SparkSession, workdir: Path, files: int, rows_per_file: int) -> int:
    """``files`` Parquet files of order rows in ``workdir/feed``, modification times in order
    (Spark's file source reads them oldest first); returns the number of rows."""
    rows = generate_feed(workdir / "json", files=files, rows_per_file=rows_per_file)
    feed = workdir / "feed"
    feed.mkdir()
    for number, path in enumerate(sorted((workdir / "json").glob("*.json"))):
        staged = workdir / "parquet" / f"part-{number:05d}"
        spark.read.schema(FEED_SCHEMA).json(str(path)).coalesce(1).write.parquet(str(staged))
        (data,) = staged.glob("*.parquet")
        target = feed / f"orders-{number:05d}.parquet"
        data.rename(target)
        os.utime(target, (time.time() - files + number,) * 2)
    return rows


def read_parquet_feed(spark: SparkSession, workdir: Path) -> DataFrame:
    return (spark.readStream.schema(FEED_SCHEMA).option("maxFilesPerTrigger", 1)
            .parquet(str(workdir / "feed")).repartition(PARTITIONS))


#: ``write_stream``'s options of the twophase writer (``--foreach-batch`` and ``--data-source``:
#: ``foreach_batch`` True and False, else chosen by the PySpark; ``--commits-behind``:
#: ``commits="behind"``, which runs the stream through foreachBatch).
TWOPHASE_OPTIONS: dict[str, Any] = {}


def twophase(feed: DataFrame, target: Target, checkpoint: str) -> None:
    """The twophase writer: ``write_stream`` of the feed into ``target.build()``."""
    write_stream(feed, target.build(), checkpoint_location=checkpoint,
                 trigger={"availableNow": True}, **TWOPHASE_OPTIONS).awaitTermination()


#: Rows per JDBC batch of the JDBC peers (as a user would tune it).
JDBC_BATCH_SIZE = 10_000


def jdbc_writer(url: str, driver: str, user: str, password: str) -> Writer:
    """Spark's JDBC writer in ``foreachBatch`` (at least once), appending to the target's
    table (``target.options["table"]``) with ``batchsize`` JDBC_BATCH_SIZE and READ_COMMITTED."""
    def write(feed: DataFrame, target: Target, checkpoint: str) -> None:
        table = target.options["table"]

        def write_batch(batch: DataFrame, _batch_id: int) -> None:
            (batch.write.format("jdbc").option("url", url).option("dbtable", table)
             .option("user", user).option("password", password).option("driver", driver)
             .option("batchsize", JDBC_BATCH_SIZE).option("isolationLevel", "READ_COMMITTED")
             .mode("append").save())

        (feed.writeStream.foreachBatch(write_batch).option("checkpointLocation", checkpoint)
         .trigger(availableNow=True).start().awaitTermination())
    return write


def noop(feed: DataFrame, _target: Target, checkpoint: str) -> None:
    """Spark's ``noop`` sink: the floor every writer starts from."""
    (feed.writeStream.format("noop").option("checkpointLocation", checkpoint)
     .trigger(availableNow=True).start().awaitTermination())


# --- rounds -----------------------------------------------------------------------------------

def run_writer(writer: Writer, feed: DataFrame, target: Target, checkpoint: str, *,
               jvm: int, server_pid: int | None) -> Run:
    """One timed run of ``writer`` with the CPU each process spent on it."""
    before = cpu_snapshot(jvm, server_pid)
    started = time.perf_counter()
    writer(feed, target, checkpoint)
    seconds = time.perf_counter() - started
    after = cpu_snapshot(jvm, server_pid)
    return Run("", seconds, {key: after[key] - before[key] for key in after})


def contest_rounds(spark: SparkSession, contest: Contest, feed: DataFrame, workdir: Path, *,
                   expected: int, rounds: int) -> list[Run]:
    """Round 0 warms up; then ``rounds`` rounds, the writers' order turning every round; the
    checkpoints in ``workdir``, the contest's own (two contests may run one sink: MySQL plain
    and over TLS)."""
    writers: dict[str, Writer] = {TWOPHASE: twophase, PEER: contest.peer, NOOP: noop}
    order = list(writers)
    jvm = jvm_pid(spark)
    runs: list[Run] = []
    for number in range(rounds + 1):
        turn = number % len(order)
        for name in order[turn:] + order[:turn]:
            target = contest.setup.new_target(**contest.overrides)
            checkpoint = str(workdir / f"ckpt-{name}-{number}")
            run = run_writer(writers[name], feed, target, checkpoint, jvm=jvm,
                             server_pid=contest.server_pid)
            if name != NOOP:
                check(contest, name, target, expected)
            if contest.discard is not None:
                contest.discard(target)
            if number:
                run.writer, run.round = name, number
                runs.append(run)
    return runs


def check(contest: Contest, writer: str, target: Target, expected: int) -> None:
    """Exit unless a reader of ``target`` sees ``expected`` rows, each event id once."""
    read = contest.peer_visible if writer == PEER and contest.peer_visible else None
    seen = read(target) if read is not None else target.visible()
    if len(seen) != expected or len(set(seen)) != expected:
        where = {key: value for key, value in target.options.items() if key in WHERE}
        raise SystemExit(f"{contest.sink}, {writer}: {len(seen)} rows ({len(set(seen))} "
                         f"distinct) visible in {where}, {expected} written")


#: How the report names the twophase writer's options.
OPTION_LABELS = {("foreach_batch", True): "foreachBatch", ("foreach_batch", False): "data source",
                 ("commits", "behind"): "commits behind"}


@dataclass(frozen=True)
class Measured:
    """One writer's runs of a contest: every round's seconds, in round order, and the median CPU
    seconds per 1M rows of each process."""

    rows: int
    seconds: list[float]
    cpu: dict[str, float]

    @property
    def rates(self) -> list[float]:
        """Every round's rows/s, in round order."""
        return [self.rows / seconds for seconds in self.seconds]

    @property
    def rate(self) -> float:
        return statistics.median(self.rates)


def measured(record: dict[str, Any]) -> dict[str, Measured]:
    """Each writer of a contest as the results file keeps it (:func:`contest_record`), in the
    order they first ran."""
    runs = sorted(record["runs"], key=lambda run: run["round"])
    rows: int = record["rows"]
    by_writer = {writer: [run for run in runs if run["writer"] == writer]
                 for writer in dict.fromkeys(run["writer"] for run in runs)}
    return {writer: Measured(rows, [run["seconds"] for run in group],
                             {process: statistics.median(run["cpu"][process] for run in group)
                              * 1e6 / rows for process in group[0]["cpu"]})
            for writer, group in by_writer.items()}


def writer_rows(labels: dict[str, str], found: dict[str, Measured]) -> list[str]:
    """A report's table row per writer: median rate, every round's, median CPU per 1M rows."""
    return [f"| {label} | {found[name].rate:,.0f} | "
            f"{', '.join(f'{v:,.0f}' for v in found[name].rates)} | "
            f"{' / '.join(f'{v:.1f}' for v in found[name].cpu.values())} |"
            for name, label in labels.items()]


def ratio_row(label: str, rates: list[float], others: list[float],
              floor: float | None = None) -> str:
    """A report's row of the paired ratios ``rates / others``: their median (marked if under
    ``floor``), then each."""
    paired = [a / b for a, b in zip(rates, others, strict=True)]
    median = statistics.median(paired)
    return (f"| **{label}** | **{median:.3f}**{floor_mark(median, floor)} | "
            f"{', '.join(f'{v:.3f}' for v in paired)} | |")


def floor_mark(ratio: float, floor: float | None) -> str:
    """What follows a ratio under ``floor`` (exactly-once never slower than its peer)."""
    return " (below the floor)" if floor is not None and ratio < floor else ""


def rounds_of(record: dict[str, Any]) -> int:
    """How many rounds a contest's record counts (after its warm-up)."""
    return len({run["round"] for run in record["runs"]})


def report(record: dict[str, Any]) -> str:
    """The markdown table of one contest, from its record (:func:`contest_record`)."""
    sink = record["sink"] + "".join(f" ({label})" for (option, value), label
                                    in OPTION_LABELS.items()
                                    if record["options"].get(option) == value)
    labels = {TWOPHASE: sink, PEER: record["peer"], NOOP: "Spark noop"}
    found = measured(record)
    lines = [f"{sink}: {record['rows']:,} rows, {record['partitions']} partitions, "
             f"{rounds_of(record)} rounds (median; every round)", "",
             "| writer | rows/s | rounds | CPU s per 1M rows: JVM / Python workers / driver / "
             "server |", "|---|---|---|---|"]
    lines += writer_rows(labels, found)
    lines.append(ratio_row(f"ratio {sink} / {record['peer']}", found[TWOPHASE].rates,
                           found[PEER].rates))
    return "\n".join(lines)


def contest_record(name: str, sink: str, peer: str, runs: list[Run], rows: int,
                   **details: Any) -> dict[str, Any]:
    """One contest as the results file keeps it (``--json``; ``bench/publish.py`` renders the
    docs' tables from it): who ran, every run's seconds and CPU by process, and the
    ``details`` of the contest (the twophase writer's ``options`` here)."""
    return {"name": name, "sink": sink, "peer": peer, "rows": rows, "partitions": PARTITIONS,
            **details, "runs": [{"writer": run.writer, "round": run.round,
                                 "seconds": run.seconds, "cpu": run.cpu} for run in runs]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sinks", nargs="*", default=list(SETUPS),
                        help="names of bench/peer_<name>.py modules (default: every registered "
                             "sink's)")
    parser.add_argument("--files", type=int, default=DEFAULT_FILES)
    parser.add_argument("--rows-per-file", type=int, default=DEFAULT_ROWS_PER_FILE)
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    path = parser.add_mutually_exclusive_group()
    path.add_argument("--foreach-batch", action="store_true",
                      help="the twophase writer through foreachBatch (foreach_batch=True; "
                           "by default PySpark before 4.3 takes it)")
    path.add_argument("--data-source", action="store_true",
                      help="the twophase writer through the Python data source "
                           "(foreach_batch=False; by default PySpark 4.3 and later take it)")
    parser.add_argument("--commits-behind", action="store_true",
                        help="each batch commits behind the next (commits='behind': the "
                             "streams end by themselves, so through foreachBatch)")
    parser.add_argument("--json", type=Path,
                        help="also write the run's provenance and every contest's runs here "
                             "(the results file of bench/publish.py)")
    args = parser.parse_args()
    if args.commits_behind and args.data_source:
        parser.error("--commits-behind runs through foreachBatch (the streams end by "
                     "themselves): leave --data-source out")
    if args.foreach_batch or args.data_source:
        TWOPHASE_OPTIONS["foreach_batch"] = bool(args.foreach_batch)
    if args.commits_behind:
        TWOPHASE_OPTIONS["commits"] = "behind"
    peers = {name: load_peer(name) for name in args.sinks}
    jars = [jar for peer in peers.values() for jar in peer.jars()]
    conf = {key: value for peer in peers.values() for key, value in peer.conf().items()}
    if jars:
        conf["spark.jars"] = ",".join(jars)
    spark = bench_session("twophase-spark-peers", PARTITIONS, conf or None)
    print(provenance(spark), "\n", flush=True)
    results: dict[str, Any] = {"provenance": provenance_of(spark), "contests": []}
    with tempfile.TemporaryDirectory(prefix="twophase-peers-") as tmp:
        workdir = Path(tmp)
        expected = make_parquet_feed(spark, workdir, args.files, args.rows_per_file)
        feed = read_parquet_feed(spark, workdir)
        for name, peer in peers.items():
            with contextlib.ExitStack() as stack:
                contest = peer.start(spark, workdir / name, stack)
                if peer.rounds is not None:
                    table = peer.rounds(spark, contest, feed, workdir / name, expected,
                                        args.rounds)
                else:
                    runs = contest_rounds(spark, contest, feed, workdir / name,
                                          expected=expected,
                                          rounds=args.rounds)
                    record = contest_record(name, contest.sink, contest.peer_name, runs,
                                            expected, options=dict(TWOPHASE_OPTIONS))
                    table = report(record)
                    results["contests"].append(record)
            print(table, "\n", flush=True)
            if args.json:
                args.json.write_text(json.dumps(results, indent=1))
    spark.stop()


if __name__ == "__main__":
    main()
