"""``python -m twophase.status LOCATION``: what the state file of a query says.

LOCATION is a checkpoint location (its ``twophase/`` state directory is read) or a state
directory. Shows the fencing epoch, the last completed batch, every decided batch still pending
(with its transactions: these are the ones an operator may need), and recent batches.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from twophase._state import State, StateStore
from twophase.errors import TwoPhaseError

RECENT_BATCHES = 10


def store_for(location: str) -> StateStore:
    nested = StateStore.for_checkpoint(location)
    return nested if nested.path.exists() else StateStore(location)


def describe(store: StateStore, state: State, now: float) -> str:
    lines = [
        f"state      {store.path}",
        f"namespace  {state.namespace}   query {state.query_id or '(none yet)'}   "
        f"epoch {state.epoch}",
        f"last done  batch {state.last_done_batch}",
    ]
    if not state.pending:
        lines.append("pending    none")
    for decision in state.pending:
        lines.append(f"pending    batch {decision.batch}, decided {now - decision.decided_at:.0f}s "
                     f"ago by epoch {decision.epoch}, {len(decision.handles)} transactions, "
                     f"{sum(h.rows for h in decision.handles)} rows")
        lines.extend(f"             {handle.txn_id} ({handle.sink}, {handle.rows} rows)"
                     for handle in decision.handles)
    for record in state.history[-RECENT_BATCHES:]:
        lines.append(f"done       batch {record.batch}: {record.rows} rows in {record.txns} txns, "
                     f"decision {record.decision_ms:.1f} ms, commit {record.commit_ms:.1f} ms")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m twophase.status", description=__doc__)
    parser.add_argument("location", help="checkpoint location or state directory")
    parser.add_argument("--json", action="store_true", help="print the state as JSON")
    args = parser.parse_args(argv)
    store = store_for(args.location)
    try:
        state = store.read()
    except TwoPhaseError as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    if state is None:
        sys.stderr.write(f"no state file at {store.path}\n")
        return 1
    output = json.dumps(state.to_json(), indent=1) if args.json else describe(store, state,
                                                                              time.time())
    sys.stdout.write(output + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
