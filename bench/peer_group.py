"""A sink group (MySQLXASink + KafkaSink, one twophase query, one decision per batch) against
the same two sinks as two separate twophase queries, and against Spark's own JDBC and Kafka
writers in one ``foreachBatch``, through the same stream into one private MariaDB
(``setups.mysql``) and one private Apache Kafka broker (``setups.kafka``).

    nice .venv/bin/python -m bench.spark_peers group [--files 4] [--rows-per-file 100000]

The writers, every round in a turning order, each into fresh targets (a fresh InnoDB orders
table, dropped once checked, and a fresh 3-partition topic):

* **group**: ``write_stream(feed, SinkGroup)`` of ``GroupTarget.of({"orders": table,
  "events": topic})`` (``commit_order`` orders, events; every column to both): the source is
  read once, each partition writes one transaction per member, one decision per batch, the
  table's transactions committed before the topic's;
* **separate**: ``write_stream(feed, MySQLXASink)`` to its end, then ``write_stream(feed,
  KafkaSink)`` to its end, each its own query and checkpoint over the same feed (the source is
  read twice): its rows/s is the stream's rows over the two runs' summed wall time, its CPU the
  two runs' sum (each run also has its own row);
* **Spark**: one ``foreachBatch`` query that persists the batch, appends it through Spark's
  JDBC writer (as ``bench/peer_mysql.py``: Connector/J, ``batchsize`` 10,000, READ_COMMITTED)
  and through Spark's Kafka sink (as ``bench/peer_kafka.py``: key ``order_id``, value
  ``to_json(struct(*))``), then unpersists it (at least once);
* **Spark noop**: the floor.

The sinks are built as ``bench/peer_mysql.py`` and ``bench/peer_kafka.py`` build them (no
fencing, the default marker table; ``min_commit_window_ms=0``, the default transaction
timeout). A run counts only if every member's reader then sees exactly the stream's event ids,
each once. CPU per process as ``bench.spark_peers``, the server split into MariaDB and the
Kafka broker. Besides: ``decision_ms`` and ``commit_ms`` (from the decision to the last
member's commit and the batch's publication) of every batch of the measured rounds, from each
twophase query's state file history (``StateStore.for_checkpoint``).
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from bench.spark_peers import (
    JDBC_BATCH_SIZE,
    NOOP,
    PARTITIONS,
    Contest,
    Peer,
    Writer,
    bench_jars,
    cpu_snapshot,
    jvm_pid,
    noop,
    server_cpu_seconds,
    twophase,
)
from setups import KafkaSetup, MySQLSetup
from setups.servers.kafka import spark_kafka_jars
from sinks.kafka.sink import DEFAULT_TRANSACTION_TIMEOUT_MS
from sinks.mysql.markers import DEFAULT_MARKER_TABLE
from twophase.testing import GroupTarget, Target
from twophase.testing.protocol import StateStore

ORDERS, EVENTS = "orders", "events"
GROUP, SEPARATE, SPARK = "group", "separate", "spark"
MYSQL_ALONE, KAFKA_ALONE = "MySQLXASink alone", "KafkaSink alone"
MYSQL_OVERRIDES: dict[str, Any] = {"fencing": False, "marker_table": DEFAULT_MARKER_TABLE}
KAFKA_OVERRIDES: dict[str, Any] = {"min_commit_window_ms": 0,
                                   "transaction_timeout_ms": DEFAULT_TRANSACTION_TIMEOUT_MS}
LABELS = {GROUP: "SinkGroup (MySQLXASink + KafkaSink), one query",
          SEPARATE: "separate: MySQLXASink query + KafkaSink query (sum)",
          MYSQL_ALONE: "↳ MySQLXASink alone", KAFKA_ALONE: "↳ KafkaSink alone",
          SPARK: "Spark JDBC + Kafka sink (foreachBatch)", NOOP: "Spark noop"}


@dataclass
class GroupSetup:
    """Fresh group targets over one MariaDB and one Kafka broker (a ``Setup``)."""

    mysql: MySQLSetup
    kafka: KafkaSetup
    jdbc_url: str

    def member(self, name: str) -> Target:
        """A fresh target of one member, its sink built as its own peer module builds it."""
        if name == ORDERS:
            return self.mysql.new_target(**MYSQL_OVERRIDES)
        return self.kafka.new_target(**KAFKA_OVERRIDES)

    def new_target(self, **_overrides: Any) -> GroupTarget:
        return GroupTarget.of({ORDERS: self.member(ORDERS), EVENTS: self.member(EVENTS)},
                              commit_order=[ORDERS, EVENTS])

    def discard(self, target: Target) -> None:
        """Drops the table of a member target (or of a group's orders member)."""
        if isinstance(target, GroupTarget):
            target = target.members[ORDERS]
        if "table" in target.options:
            self.mysql.db.query(f"DROP TABLE `{target.options['table']}`")


@dataclass
class GroupRun:
    writer: str
    seconds: float
    cpu: dict[str, float]
    #: ``(decision_ms, commit_ms)`` of every batch of a twophase query.
    batches: list[tuple[float, float]] = field(default_factory=list)


def jars() -> list[str]:
    return bench_jars("mariadb-java-client-*.jar") + spark_kafka_jars()


def start(_spark: SparkSession, workdir: Path, stack: contextlib.ExitStack) -> Contest:
    mysql = stack.enter_context(MySQLSetup.started(workdir / "mysql"))
    kafka = stack.enter_context(KafkaSetup.started(workdir / "kafka"))
    params = mysql.server.params
    url = (f"jdbc:mysql://{params.host}:{params.port}/{params.database}"
           "?permitMysqlScheme&rewriteBatchedStatements=true")
    setup = GroupSetup(mysql, kafka, url)
    return Contest(sink="SinkGroup", peer_name="Spark JDBC + Kafka sink", setup=setup,
                   peer=spark_writer(setup), discard=setup.discard)


def spark_writer(setup: GroupSetup) -> Writer:
    """Spark's JDBC writer and Kafka sink over each persisted batch, in one foreachBatch."""
    params = setup.mysql.server.params

    def write(feed: DataFrame, target: Target, checkpoint: str) -> None:
        assert isinstance(target, GroupTarget)
        table, topic = target.members[ORDERS].options, target.members[EVENTS].options

        def write_batch(batch: DataFrame, _batch_id: int) -> None:
            batch.persist()
            (batch.write.format("jdbc").option("url", setup.jdbc_url)
             .option("dbtable", table["table"]).option("user", params.user)
             .option("password", params.password).option("driver", "org.mariadb.jdbc.Driver")
             .option("batchsize", JDBC_BATCH_SIZE).option("isolationLevel", "READ_COMMITTED")
             .mode("append").save())
            (batch.selectExpr("CAST(order_id AS STRING) AS key", "to_json(struct(*)) AS value")
             .write.format("kafka")
             .option("kafka.bootstrap.servers", topic["bootstrap_servers"])
             .option("topic", topic["topic"]).save())
            batch.unpersist()

        (feed.writeStream.foreachBatch(write_batch).option("checkpointLocation", checkpoint)
         .trigger(availableNow=True).start().awaitTermination())
    return write


def _cpu(jvm: int, setup: GroupSetup) -> dict[str, float]:
    cpu = cpu_snapshot(jvm, None)
    del cpu["server"]
    assert setup.kafka.broker.process is not None
    return {**cpu, "MariaDB": server_cpu_seconds(setup.mysql.server.pid),
            "Kafka broker": server_cpu_seconds(setup.kafka.broker.process.pid)}


def _timed(writer: Writer, feed: DataFrame, target: Target, checkpoint: str, *, jvm: int,
           setup: GroupSetup, name: str) -> GroupRun:
    before = _cpu(jvm, setup)
    started = time.perf_counter()
    writer(feed, target, checkpoint)
    seconds = time.perf_counter() - started
    after = _cpu(jvm, setup)
    return GroupRun(name, seconds, {key: after[key] - before[key] for key in after})


def _history(checkpoint: str) -> list[tuple[float, float]]:
    state = StateStore.for_checkpoint(checkpoint).read()
    assert state is not None, f"no state file in {checkpoint}"
    return [(record.decision_ms, record.commit_ms) for record in state.history]


def _check(name: str, target: Target, expected: int) -> None:
    """Exit unless every member's reader sees ``expected`` rows, each event id once."""
    members = target.members if isinstance(target, GroupTarget) else {name: target}
    if isinstance(target, GroupTarget):
        target.visible()  # the group's promises: no repeats, the commit order kept
    for member, member_target in members.items():
        seen = member_target.visible()
        if len(seen) != expected or len(set(seen)) != expected:
            raise SystemExit(f"{name}, {member}: {len(seen)} rows ({len(set(seen))} distinct) "
                             f"visible, {expected} written")


def group_rounds(spark: SparkSession, contest: Contest, feed: DataFrame, workdir: Path,
                 expected: int, rounds: int) -> str:
    """Round 0 warms up; then ``rounds`` rounds, the writers' order turning every round."""
    setup = contest.setup
    assert isinstance(setup, GroupSetup)
    jvm = jvm_pid(spark)
    order = [GROUP, SEPARATE, SPARK, NOOP]
    runs: list[GroupRun] = []
    for number in range(rounds + 1):
        turn = number % len(order)
        for name in order[turn:] + order[:turn]:
            checkpoint = str(workdir / f"ckpt-group-{name}-{number}")
            measured: list[GroupRun] = []
            if name == SEPARATE:
                for alone, member in ((MYSQL_ALONE, ORDERS), (KAFKA_ALONE, EVENTS)):
                    target = setup.member(member)
                    run = _timed(twophase, feed, target, f"{checkpoint}-{member}", jvm=jvm,
                                 setup=setup, name=alone)
                    run.batches = _history(f"{checkpoint}-{member}")
                    _check(alone, target, expected)
                    setup.discard(target)
                    measured.append(run)
                measured.append(GroupRun(SEPARATE, sum(run.seconds for run in measured), {
                    key: sum(run.cpu[key] for run in measured) for key in measured[0].cpu}))
            else:
                group_target = setup.new_target()
                writer = {GROUP: twophase, SPARK: contest.peer, NOOP: noop}[name]
                run = _timed(writer, feed, group_target, checkpoint, jvm=jvm, setup=setup,
                             name=name)
                if name == GROUP:
                    run.batches = _history(checkpoint)
                if name != NOOP:
                    _check(name, group_target, expected)
                setup.discard(group_target)
                measured.append(run)
            if number:
                runs += measured
    return group_report(runs, expected)


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def group_report(runs: list[GroupRun], rows: int) -> str:
    by_writer = {name: [run for run in runs if run.writer == name] for name in LABELS}
    rates = {name: [rows / run.seconds for run in group] for name, group in by_writer.items()}
    first = by_writer[GROUP][0].cpu
    lines = [f"SinkGroup (MySQL + Kafka): {rows:,} rows, {PARTITIONS} partitions, "
             f"{len(rates[GROUP])} rounds (median; every round)", "",
             f"| writer | rows/s | rounds | CPU s per 1M rows: {' / '.join(first)} |",
             "|---|---|---|---|"]
    for name, values in rates.items():
        cpu = [statistics.median(run.cpu[key] for run in by_writer[name]) * 1e6 / rows
               for key in first]
        lines.append(f"| {LABELS[name]} | {statistics.median(values):,.0f} | "
                     f"{', '.join(f'{v:,.0f}' for v in values)} | "
                     f"{' / '.join(f'{v:.1f}' for v in cpu)} |")
    for other, label in ((SEPARATE, "separate"), (SPARK, "Spark")):
        paired = [a / b for a, b in zip(rates[GROUP], rates[other], strict=True)]
        lines.append(f"| **ratio group / {label}** | **{statistics.median(paired):.3f}** | "
                     f"{', '.join(f'{v:.3f}' for v in paired)} | |")
    lines += ["", "From each batch's decision to its last member's commit (state file history, "
              "every batch of the measured rounds; nearest-rank percentiles)", "",
              "| query | batches | decision_ms p50 | commit_ms p50 | commit_ms p99 |",
              "|---|---|---|---|---|"]
    for name in (GROUP, MYSQL_ALONE, KAFKA_ALONE):
        batches = [batch for run in by_writer[name] for batch in run.batches]
        commits = [commit for _, commit in batches]
        lines.append(f"| {LABELS[name].lstrip('↳ ')} | {len(batches)} | "
                     f"{statistics.median(d for d, _ in batches):.1f} | "
                     f"{percentile(commits, 50):.1f} | {percentile(commits, 99):.1f} |")
    return "\n".join(lines)


PEER = Peer(jars=jars, start=start, rounds=group_rounds)
