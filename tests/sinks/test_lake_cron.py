"""The cron commands (``twophase.status``, ``twophase.cleanup`` and its ``--settle``) against a
lake table, Delta and Iceberg, local and on S3: one test, each format's maintenance and its own
leftovers given by a :class:`LakeFormat`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from setups import IcebergSetup, Target
from setups.lake import YOUNG_ENOUGH, commit_batch
from sinks.delta import DeltaSink
from sinks.iceberg import IcebergSink
from tests.unit.test_cleanup import running_query
from twophase import cleanup
from twophase._state import Decision
from twophase.testing.contract import (
    NAMESPACE,
    OPENED_AT,
    ORDER_COLUMNS,
    list_in_doubt,
    orders,
    prepare,
)


def delta_table(sink: DeltaSink) -> DeltaTable:
    return DeltaTable(sink.table_uri, storage_options=sink.storage_options or None)


def delta_optimize(_setup: Any, _target: Target, sink: DeltaSink) -> None:
    delta_table(sink).optimize.compact()


def delta_tombstones(_setup: Any, _target: Target, sink: DeltaSink) -> list[str]:
    """What VACUUM would delete now: the files an OPTIMIZE removed from the table."""
    return sorted(delta_table(sink).vacuum(retention_hours=0, dry_run=True,
                                           enforce_retention_duration=False))


def iceberg_rewrite(setup: IcebergSetup, target: Target, _sink: IcebergSink) -> None:
    """An overwrite of the table with its own rows (as ``rewrite_data_files`` replaces files)."""
    table = setup.table(target)
    assert table is not None
    table.overwrite(table.scan().to_arrow())


def iceberg_files(setup: IcebergSetup, target: Target, _sink: IcebergSink) -> list[str]:
    table = setup.table(target)
    assert table is not None
    return sorted(setup.files_under(table.location()))


def nothing(_setup: Any, _target: Target, _sink: Any) -> list[str]:
    return []


@dataclass(frozen=True)
class LakeFormat:
    """How one lake format's table is compacted between batches, and what is then left."""

    #: The format's compaction of the table's committed batches.
    compact: Callable[[Any, Target, Any], None]
    #: The files the compaction left for the format's own maintenance to delete (Delta's
    #: VACUUM): what the setup may still list in doubt, none of them twophase's.
    left_for_maintenance: Callable[[Any, Target, Any], list[str]]
    #: Every file name of the table that an orphan's could be among.
    files: Callable[[Any, Target, Any], list[str]]
    #: How many files ``left_for_maintenance`` lists after the test's compaction.
    left_after_compaction: int


FORMATS = {
    "delta": LakeFormat(delta_optimize, delta_tombstones, delta_tombstones, 3),
    "iceberg": LakeFormat(iceberg_rewrite, nothing, iceberg_files, 0),
}


@pytest.mark.parametrize(("where", "kind"), [
    ("delta_setup", "delta"), ("delta_s3_setup", "delta"),
    ("iceberg_setup", "iceberg"), ("iceberg_s3_setup", "iceberg"),
])
def test_cleanup_and_status_know_lake_handles_and_settle_leaves_nothing_in_doubt(
        where: str, kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """A decided batch rolled forward (after a compaction of the batches before it), an orphan
    of an earlier run aborted, then ``--settle`` aborts the crashed current run's undecided
    transaction; every committed row stays, once, and no compacted file is cleanup's."""
    lake = FORMATS[kind]
    setup = request.getfixturevalue(where)
    target = setup.new_target()
    sink = target.build()
    assert sink.kind == kind
    sink.check_schema(ORDER_COLUMNS)
    store = running_query(tmp_path, epoch_bumps=2)
    for batch in range(3):  # committed batches, then compacted
        commit_batch(sink, [prepare(sink, orders(10 * batch, 2), epoch=2, batch=batch)])
    lake.compact(setup, target, sink)
    decided = prepare(sink, orders(30, 3), epoch=2, batch=3)
    store.update(lambda s: replace(s, last_done_batch=2,
                                   pending=(Decision(3, 2, OPENED_AT, (decided,)),)), epoch=None)
    orphan = prepare(sink, orders(40, 1), epoch=1, batch=7)
    undecided = prepare(sink, orders(50, 1), epoch=2, batch=4)
    argv = ["--sink", target.factory, "--options",
            json.dumps({key: value for key, value in target.options.items()
                        if key != "create"}), "--state", str(store.location),
            "--older-than", YOUNG_ENOUGH]

    status = subprocess.run([sys.executable, "-m", "twophase.status", str(store.location),
                             *argv[:4]], capture_output=True, text=True, check=True)
    assert f"{decided.txn_id} ({kind}, 3 rows)" in status.stdout
    assert f"undecided  {undecided.txn_id}" in status.stdout

    assert cleanup.main(argv) in (cleanup.EXIT_OK, cleanup.EXIT_ATTENTION)
    assert {str(h.txn_id) for h in list_in_doubt(sink, NAMESPACE)} == {str(undecided.txn_id)}
    assert cleanup.main([*argv, "--settle"]) == cleanup.EXIT_OK

    assert list_in_doubt(sink, NAMESPACE) == []
    assert sorted(setup.visible(target)) == [0, 1, 10, 11, 20, 21, 30, 31, 32]
    maintenance = lake.left_for_maintenance(setup, target, sink)
    assert len(maintenance) == lake.left_after_compaction, "the compaction's own leftovers"
    assert sorted(setup.in_doubt(target)) == maintenance  # no orphan's file, no intent left
    assert str(orphan.txn_id) not in " ".join(lake.files(setup, target, sink))
