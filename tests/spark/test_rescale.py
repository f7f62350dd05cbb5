"""Rescaling: the same query restarted with 2, then 4, then 1 partitions, a crash before each
change, for every sink (issue 28).

The driver writes batch 0 with 2 partitions and is SIGKILLed before the decision of batch 1
(its two transactions pre-committed: orphans once a newer run starts); restarted with 4
partitions (and ``spark.sql.shuffle.partitions`` 4) it aborts those, replays batch 1 and dies
again before deciding it (four orphans, three of partitions the next run does not have);
restarted with 1 partition it aborts them all and finishes the feed. Each sink's reader then
sees every row once and its server holds nothing open; the query's metrics count every orphan
found and aborted; Kafka's transactional ids stay within the pool's bound for the most
partitions run. The counts are logged (``-o log_cli=true`` shows them).
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from pathlib import Path

import pytest

from sinks.kafka.pool import pool_bound
from tests.sink_sets import SINK_SETS, Sinks, undecided
from twophase._crash import BEFORE_DECISION
from twophase._metrics import ORPHANS_ABORTED, ORPHANS_FOUND
from twophase._state import State
from twophase.testing.driver import DriverSpec, generate_feed, launch

pytestmark = [pytest.mark.spark, pytest.mark.crash]
log = logging.getLogger(__name__)

#: The partitions of each run, and the batch before whose decision it dies (None: it ends).
RUNS = ((2, 1), (4, 1), (1, None))
FILES, ROWS_PER_FILE = 3, 20
CORES = 2
KAFKA_ID = re.compile(r"\.(?P<partition>\d+)\.(?P<parity>\d)\.(?P<slot>\d+)$")


def run_with(spec: DriverSpec, partitions: int) -> DriverSpec:
    """``spec`` writing with ``partitions`` (shuffle partitions too), on this machine's cores:
    eight task slots would start eight Python workers, each importing every sink."""
    return replace(spec, partitions=partitions, cores=CORES,
                   spark_conf={"spark.sql.shuffle.partitions": str(partitions)})


@pytest.mark.parametrize("sinks", SINK_SETS)
def test_orphans_of_partitions_that_no_longer_exist_are_aborted_and_rows_land_once(
        request: pytest.FixtureRequest, sinks: tuple[str, ...], tmp_path: Path) -> None:
    system = Sinks.of(request, sinks)
    expected = list(range(generate_feed(tmp_path / "feed", files=FILES,
                                        rows_per_file=ROWS_PER_FILE)))
    spec = DriverSpec.into(system.target, tmp_path)
    left: list[dict[str, int]] = []
    for partitions, crash_batch in RUNS:
        run = launch(run_with(spec, partitions), workdir=tmp_path / "runs",
                     crash_at=f"{BEFORE_DECISION}@{crash_batch}" if crash_batch else None)
        if crash_batch is None:
            assert run.returncode == 0, f"the last run failed: see {run.log}"
            break
        assert run.crashed, f"the driver did not die before deciding {crash_batch}: {run.log}"
        left.append(undecided(system, state_of(spec)))
        assert left[-1] == dict.fromkeys(system.members, partitions), (
            f"every partition of batch {crash_batch} pre-committed, none decided")
    state = state_of(spec)
    found, aborted = state.metrics.get(ORPHANS_FOUND), state.metrics.get(ORPHANS_ABORTED)
    log.info("rescaled %s: orphans left per sink before each restart %s; the query's sweeps "
             "found %s and aborted %s", "+".join(sinks), left, found, aborted)
    assert found == aborted == sum(partitions for partitions, batch in RUNS if batch)
    assert system.visible() == system.expecting(expected), "rows lost or duplicated"
    assert system.in_doubt() == system.nothing(), "left open on a server"
    assert (state.pending, state.last_done_batch) == ((), FILES - 1)
    if "kafka" in system.members:
        assert_within_the_pool(request, system.members["kafka"].options,
                               max(partitions for partitions, _ in RUNS))


def state_of(spec: DriverSpec) -> State:
    return spec.state_store().read_existing()


def assert_within_the_pool(request: pytest.FixtureRequest, options: dict[str, object],
                           partitions: int) -> None:
    """The transactional ids the broker knows for the target stay within the pool's bound
    for ``partitions``, each of a partition that some run had."""
    broker = request.getfixturevalue("kafka_broker")
    prefix = str(options["transactional_id_prefix"])
    listed = broker.admin().list_transactions(
        transactional_id_pattern=f"{re.escape(prefix)}.*")
    known = {t.transactional_id for listings in listed.values() for t in listings}
    log.info("Kafka transactional ids known after rescaling: %d (bound %d)", len(known),
             pool_bound(partitions))
    assert 0 < len(known) <= pool_bound(partitions)
    matches = [KAFKA_ID.search(tid) for tid in known]
    assert all(matches), f"ids not of the pool: {sorted(known)}"
    assert {int(match["partition"]) for match in matches if match} <= set(range(partitions))
