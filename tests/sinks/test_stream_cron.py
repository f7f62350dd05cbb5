"""The cron commands (``twophase.status``, ``twophase.cleanup`` and its ``--settle``) against
the stream sinks, Redis Streams and NATS JetStream: a decided batch rolled forward, an orphan of
an earlier run aborted, the crashed current run's undecided transaction settled; each stream
read by its setup's own reader (``redis-cli``, a nats-py consumer), nothing staged left."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from setups.lake import YOUNG_ENOUGH, commit_batch
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

STATUS_TIMEOUT_S = 120


@pytest.mark.parametrize(("where", "kind"), [("redis_setup", "redis"), ("nats_setup", "nats")])
def test_cleanup_and_status_know_stream_handles_and_settle_leaves_nothing_in_doubt(
        where: str, kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    setup = request.getfixturevalue(where)
    target = setup.new_target()
    sink = target.build()
    assert sink.kind == kind
    sink.check_schema(ORDER_COLUMNS)
    store = running_query(tmp_path, epoch_bumps=2)
    commit_batch(sink, [prepare(sink, orders(0, 2), epoch=2, batch=0)])
    decided = prepare(sink, orders(10, 3), epoch=2, batch=1)
    store.update(lambda s: replace(s, last_done_batch=0,
                                   pending=(Decision(1, 2, OPENED_AT, (decided,)),)), epoch=None)
    orphan = prepare(sink, orders(40, 1), epoch=1, batch=7)
    undecided = prepare(sink, orders(50, 1), epoch=2, batch=2)
    argv = ["--sink", target.factory, "--options", json.dumps(target.options),
            "--state", str(store.location), "--older-than", YOUNG_ENOUGH]

    status = subprocess.run([sys.executable, "-m", "twophase.status", str(store.location),
                             *argv[:4]], capture_output=True, text=True, check=True,
                            timeout=STATUS_TIMEOUT_S)
    assert f"{decided.txn_id} ({kind}, 3 rows)" in status.stdout
    assert f"undecided  {undecided.txn_id}" in status.stdout
    assert str(orphan.txn_id) in status.stdout

    assert cleanup.main(argv) in (cleanup.EXIT_OK, cleanup.EXIT_ATTENTION)
    assert {str(h.txn_id) for h in list_in_doubt(sink, NAMESPACE)} == {str(undecided.txn_id)}
    assert cleanup.main([*argv, "--settle"]) == cleanup.EXIT_OK

    assert list_in_doubt(sink, NAMESPACE) == []
    assert setup.in_doubt(target) == []
    assert sorted(setup.visible(target)) == [0, 1, 10, 11, 12]
