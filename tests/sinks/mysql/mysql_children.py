"""The child processes the MySQL crash tests SIGKILL, and how a test runs one.

A child is ``python -m tests.sinks.mysql.mysql_children <spec>``, the spec a JSON object naming its
``role`` (:func:`writer` or :func:`driver`), the server and table to write to, and the role's
own keys; the password travels in the environment, not on the command line. :func:`run_killed`
starts one and returns its output once it died of SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

from setups.servers.mariadb import ConnectionParams
from sinks.mysql import MySQLXASink
from tests import REPO
from tests.sinks.mysql.mysql_table import (
    COLUMNS,
    make_sink,
    prepare,
    prepare_batch,
    rows_for,
    start_run,
)
from twophase._crash import CRASH_ENV
from twophase.testing.contract import context

PASSWORD_ENV = "TWOPHASE_TEST_MYSQL_PASSWORD"
CHILD_TIMEOUT_S = 60


def run_killed(params: ConnectionParams, table: str, *, crash_at: str | None = None,
               **job: Any) -> str:
    """Run the child ``job`` describes (its ``role`` and the role's keys) over ``table``,
    ``crash_at`` armed (a crash point of :mod:`twophase._crash`, e.g. ``mid_commit@1``);
    assert that it died of SIGKILL and return what it printed."""
    connection = {name: value for name, value in params.kwargs().items() if name != "password"}
    env = {name: value for name, value in os.environ.items() if name != CRASH_ENV}
    env[PASSWORD_ENV] = params.password
    if crash_at is not None:
        env[CRASH_ENV] = crash_at
    spec = json.dumps({"connection": connection, "table": table, **job})
    done = subprocess.run([sys.executable, "-m", __name__, spec], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
                          start_new_session=True, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr
    return done.stdout


def child_sink(spec: dict[str, Any]) -> MySQLXASink:
    params = ConnectionParams(**spec["connection"], password=os.environ[PASSWORD_ENV])
    return make_sink(params, spec["table"])


def writer(spec: dict[str, Any]) -> None:
    """Prepare partitions, print their handles, then die like a killed executor, in the middle
    of writing one more partition (whose branch the server must roll back)."""
    sink, query = child_sink(spec), spec["query"]
    for partition in range(spec["partitions"]):
        handle = prepare(sink, query, rows_for(0, partition, spec["rows"]),
                         partition=partition)
        print(handle.dumps(), flush=True)
    unfinished = context(query_id=query, partition=spec["partitions"], columns=COLUMNS)
    txn = sink.begin_transaction(unfinished)
    sink.write(txn, rows_for(0, spec["partitions"], spec["rows"]))
    os.kill(os.getpid(), signal.SIGKILL)


def driver(spec: dict[str, Any]) -> None:
    """Run 1 of a query: batch 0 done, batch 1 decided, then the armed crash point kills it."""
    sink, query = child_sink(spec), spec["query"]
    coordinator = start_run(sink, spec["state"])
    epoch = coordinator.epoch
    coordinator.commit_batch(0, query, prepare_batch(sink, query, 0, epoch))
    prepare(sink, query, [(-1, "failed attempt", 0.0)], batch=1, partition=0, attempt=9,
            epoch=epoch)  # an orphan: run 1's sweep aborts it before deciding batch 1
    prepare(sink, query, [(-2, "next batch", 0.0)], batch=2, partition=0, attempt=0,
            epoch=epoch)  # a branch of batch 2 that run 1 never decides
    coordinator.commit_batch(1, query, prepare_batch(sink, query, 1, epoch))
    raise SystemExit("the crash point did not fire")


def main(argv: list[str]) -> None:
    spec = json.loads(argv[0])
    {"writer": writer, "driver": driver}[spec["role"]](spec)


if __name__ == "__main__":
    main(sys.argv[1:])
