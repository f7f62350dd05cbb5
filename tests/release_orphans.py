"""``python -m tests.release_orphans <driver-spec.json> <count>``: run under a release of
twophase (its directory first on the path), leave ``count`` orphans of the query in its sink.

An orphan here is what a lost task attempt of the query's last decided batch leaves: a
transaction of the query's current run, pre-committed with rows the feed does not have
(``event_id`` from :data:`ORPHAN_EVENT_IDS`), that no decision names. Only this release's own
code opens them (its sink, its transaction ids, its handles), as a crashed job of that release
would; the query is read from the release's own state file. Prints one JSON line: the
transaction ids and the module file of the twophase that ran (to prove which one it was).

Only what every release since 0.1.0 has is used: ``twophase.TxnId``, ``TransactionContext``,
``Column``, the sink's ``begin_transaction``, ``write``, ``pre_commit``, and the state store.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import twophase
from twophase import Column, TransactionContext, TxnId
from twophase._loader import build_sink
from twophase._state import StateStore

#: Far above the feed's: an orphan that became visible shows up in the target's rows.
ORPHAN_EVENT_IDS = 1_000_000
#: Attempt ids of the lost attempts, far above any a test's Spark hands out.
LOST_ATTEMPT = 900_000
COLUMNS = (Column("event_id", "bigint"), Column("order_id", "bigint"),
           Column("status", "string"), Column("ts", "timestamp"))


def leave_orphans(spec: dict[str, Any], count: int) -> list[str]:
    """Pre-commit ``count`` transactions of the query's last decided batch, one per partition."""
    store = StateStore.for_checkpoint(spec["checkpoint"])
    state = store.read_existing()
    assert state.query_id is not None and state.pending, "no decided batch pending"
    batch = max(decision.batch for decision in state.pending)
    sink = build_sink(spec["sink_factory"], spec.get("sink_kwargs", {}))
    left = []
    for partition in range(count):
        txn_id = TxnId.open(namespace=state.namespace, query_id=state.query_id,
                            epoch=state.epoch, batch=batch, partition=partition,
                            attempt=LOST_ATTEMPT + partition)
        txn = sink.begin_transaction(TransactionContext(txn_id, COLUMNS))
        event_id = ORPHAN_EVENT_IDS + partition
        sink.write(txn, [(event_id, event_id, "created", datetime.now(UTC))])
        left.append(str(sink.pre_commit(txn).txn_id))
    return left


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    left = leave_orphans(spec, int(argv[1]))
    sys.stdout.write(json.dumps({"orphans": left, "twophase": twophase.__file__}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
