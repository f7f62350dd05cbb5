"""``python -m twophase.status LOCATION``: what the state file of a query says.

LOCATION is a checkpoint location (its ``twophase/`` state directory is read) or a state
directory. Shows the fencing epoch, the last completed batch, every decided batch still pending
(with its transactions: these are the ones an operator may need), and recent batches.

With ``--sink module:Class --options JSON`` (as cleanup takes them) it also lists the query's
undecided transactions still in the target (a crashed or failed run's). Prepared transactions,
decided or not, hold locks on the target that a schema change (``ALTER TABLE``) waits for:
status names them and the command that releases them (``python -m twophase.cleanup
--settle``, with the query stopped; see docs/operating.md, "Changing the target's schema").

``--unverified`` shows what a file that cannot be trusted (a checksum mismatch, a torn or
hand-edited file, an unknown format) holds, as JSON, with the reason it was refused: enough to
decide between restoring a backup and re-delivering a batch. Nothing acts on it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime

from twophase._eligibility import undecided_handles
from twophase._handle import Handle
from twophase._loader import build_sink
from twophase._secrets import resolved
from twophase._state import State, StateStore
from twophase.errors import TwoPhaseError

RECENT_BATCHES = 10
UNKNOWN_SINK = "MODULE:CLASS"


def store_for(location: str) -> StateStore:
    """The state of a checkpoint location, or the state location itself (path or URL)."""
    nested = StateStore.for_checkpoint(location)
    return nested if nested.exists() else StateStore(location)


def release_command(store: StateStore, state: State) -> str:
    """The command that commits or aborts every prepared transaction of the query."""
    sink = state.settings.get("sink_class", UNKNOWN_SINK)
    return (f"python -m twophase.cleanup --settle --sink {sink} --options '<the sink options "
            f"as JSON>' --state {store.location}")


def describe(store: StateStore, state: State, now: float,
             undecided: list[Handle] | None = None) -> str:
    lines = [
        f"state      {store.path}",
        f"namespace  {state.namespace}   query {state.query_id or '(none yet)'}   "
        f"epoch {state.epoch}",
        f"last done  batch {state.last_done_batch}" + (
            f"   gave up on batch {state.aborted_batch}"
            if state.aborted_batch > state.last_done_batch else ""),
    ]
    if not state.pending:
        lines.append("pending    none")
    for decision in state.pending:
        lines.append(f"pending    batch {decision.batch}, decided {now - decision.decided_at:.0f}s "
                     f"ago by epoch {decision.epoch}, {len(decision.handles)} transactions, "
                     f"{sum(h.rows for h in decision.handles)} rows")
        for handle in decision.handles:
            lines.append(f"             {handle.txn_id} ({handle.sink}, {handle.rows} rows)")
            lines.extend(f"               member {name}: {part.txn_id} ({part.sink}, "
                         f"{part.rows} rows)" for name, part in handle.parts().items())
    for handle in undecided or ():
        lines.append(f"undecided  {handle.txn_id} ({handle.sink}): left by a crashed or failed "
                     "run")
        lines.extend(f"             member {name}: {part.txn_id} ({part.sink})"
                     for name, part in handle.parts().items())
    if state.pending or undecided:
        lines.append("locks      the transactions above are prepared in the target and hold its "
                     "locks (a schema change waits for them); with the query stopped, release "
                     f"them: {release_command(store, state)}")
    for record in state.history[-RECENT_BATCHES:]:
        lines.append(f"done       batch {record.batch}: {record.rows} rows in {record.txns} txns, "
                     f"decision {record.decision_ms:.1f} ms, commit {record.commit_ms:.1f} ms")
    return "\n".join(lines)


def show_unverified(store: StateStore) -> int:
    """Print the file's content and verdict; exit 0 if intact, 1 if not (or missing)."""
    try:
        content, verdict = store.read_unverified()
    except OSError as exc:
        sys.stderr.write(f"cannot read {store.path}: {exc.strerror or exc}\n")
        return 1
    sys.stderr.write(f"{store.path}: {verdict}"
                     + ("" if verdict == "intact" else " -- UNVERIFIED, do not act on it "
                        "blindly") + "\n")
    sys.stdout.write((content if isinstance(content, str) else json.dumps(content, indent=1))
                     + "\n")
    return 0 if verdict == "intact" else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m twophase.status", description=__doc__)
    parser.add_argument("location", help="checkpoint location or state directory")
    parser.add_argument("--json", action="store_true", help="print the state as JSON")
    parser.add_argument("--unverified", action="store_true",
                        help="show what a damaged state file holds, without trusting it")
    parser.add_argument("--sink", help="module:Class of the query's sink, to list its "
                        "undecided transactions in the target")
    parser.add_argument("--options", default="{}", help="JSON keyword arguments of the sink; "
                        'a secret as a reference: {"password": {"env": "DB_PASSWORD"}}')
    args = parser.parse_args(argv)
    store = store_for(args.location)
    if args.unverified:
        return show_unverified(store)
    try:
        state = store.read()
    except TwoPhaseError as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    if state is None:
        sys.stderr.write(f"no state file at {store.path}\n")
        return 1
    try:
        options = resolved(json.loads(args.options))
        undecided, tombstones = (_in_target(state, args.sink, options) if args.sink
                                 else (None, (0, None)))
    except (TwoPhaseError, ValueError) as exc:
        sys.stderr.write(f"cannot list the target's transactions: {exc}\n")
        return 1
    output = (json.dumps(state.to_json(), indent=1) if args.json
              else describe(store, state, time.time(), undecided)
              + describe_tombstones(*tombstones, time.time()))
    sys.stdout.write(output + "\n")
    return 0


def _in_target(state: State, sink_class: str, options: dict[str, object]
               ) -> tuple[list[Handle], tuple[int, datetime | None]]:
    """The query's transactions in the target that no decision references, and the keyed
    mode's tombstones (count, oldest)."""
    with build_sink(sink_class, options).committer() as committer:
        undecided = undecided_handles(committer.list_in_doubt(state.namespace), state)
        return undecided, committer.tombstones()


def describe_tombstones(count: int, oldest: datetime | None, now: float) -> str:
    """A line on the keyed mode's tombstones ("" where the sink keeps none)."""
    if not count or oldest is None:
        return ""
    age_h = (now - oldest.timestamp()) / 3600
    return (f"\ntombstones: {count} deleted keys remembered, the oldest deleted {age_h:.1f} h "
            "ago (purged by python -m twophase.cleanup after the sink's "
            "tombstone_retention_s)")


if __name__ == "__main__":
    sys.exit(main())
