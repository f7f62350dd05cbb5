"""``python -m twophase.cleanup``: finish what was decided, abort what never will be (for cron).

For each target (a sink plus the state locations of the queries writing into it):

1. roll forward: commit every decided-but-not-done batch of each state file;
2. abort orphans: in-doubt transactions of the target's namespace that no decision references
   and that can never be decided: from an earlier run of their query, from a batch its query
   already finished, or older than ``older_than`` (default: twice the query's trigger interval,
   at least 10 minutes). Transactions of queries with no configured state are only reported,
   unless ``abort_unknown`` is set (they might belong to a query you did not list);
3. purge proofs of commit older than ``retention`` (default 7 days), and the keyed mode's
   tombstones older than the sink's own ``tombstone_retention_s`` (each member's in a group).

It never bumps an epoch, so it is safe while the queries run. One JSON line per action goes to
stdout, a log line per action to stderr. Exit codes: 0 all well, 1 an action failed, 2 bad
usage or configuration, 3 attention needed (a decided transaction is lost, or old in-doubt
transactions of unknown queries are left).

For monitoring (needs ``twophase[metrics]``): ``--metrics-file PATH`` writes the run's facts
and every listed query's metrics (as :mod:`twophase.metrics` serves them) for node_exporter's
textfile collector, atomically; ``--pushgateway URL`` pushes the same to a Pushgateway (job
``twophase_cleanup``). The run's own: ``twophase_cleanup_last_run_timestamp_seconds``,
``twophase_cleanup_exit_code``, ``twophase_cleanup_actions{action, outcome}`` (this run's),
and per target ``twophase_cleanup_in_doubt_transactions`` left undecided after the run, the
age of the oldest of them (``twophase_cleanup_oldest_in_doubt_age_seconds``) and the age from
which cleanup aborts them (``twophase_cleanup_orphan_age_limit_seconds``).

``--settle``, before a schema migration of the target (with the queries stopped): instead of
the above, for each listed state, fence any run of its query still alive (as a start does),
commit every decided batch and abort every undecided transaction of the query, whatever its
age: nothing of the query then holds a lock on the target. The query is not started; its
next start goes on from there.

Config file (TOML), one ``[[target]]`` per sink; an option written ``{ env = "NAME" }`` is read
from the environment and ``{ file = "/path" }`` from a file (keep passwords out of the config),
also in a sink group's members' options (``sink = "twophase:SinkGroup"``, ``options = {
members = { orders = { sink = ..., options = {...} }, ... }, commit_order = [...] }``: decided
batches roll forward member by member in that order)::

    [[target]]
    sink = "sinks.mysql:MySQLXASink"
    options = { host = "db", user = "etl", password = { env = "DB_PASSWORD" },
                database = "shop", table = "orders" }
    states = ["/checkpoints/orders/twophase", "s3://bucket/checkpoints/payments/twophase"]
    state_options = { region = "eu-west-1" }  # optional, for states on S3 (default: boto3's
                                              # chain: AWS_* variables, config files, a role)
    older_than = "15m"        # optional
    abort_unknown = false     # optional
    retention = "7d"          # optional
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from twophase._aborts import abort_through
from twophase._coordinator import Coordinator
from twophase._eligibility import is_orphan
from twophase._handle import Handle, validate_namespace
from twophase._keyed import Keyed
from twophase._loader import build_sink
from twophase._retry import DEFAULT_RETRY
from twophase._secrets import resolved
from twophase._state import State, StateStore
from twophase._storage import is_s3
from twophase.errors import (
    ConfigurationError,
    StateCorruptError,
    TransactionLostError,
    TwoPhaseError,
)
from twophase.group import GroupCommitter
from twophase.sink import Committer, TwoPhaseCommitSink

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_ATTENTION = 0, 1, 2, 3
DEFAULT_MIN_ORPHAN_AGE_S = 600.0
DEFAULT_RETENTION_S = 7 * 86_400.0
TRIGGER_INTERVALS_PER_ORPHAN_AGE = 2
METRICS_PREFIX = "twophase_cleanup_"
PUSH_JOB = "twophase_cleanup"
_IN_DOUBT_GAUGES = (
    ("in_doubt_transactions", "Undecided transactions left in doubt after the run."),
    ("oldest_in_doubt_age_seconds", "Age of the oldest of them (0: none)."),
    ("orphan_age_limit_seconds", "The age from which cleanup aborts an undecided transaction."),
)

_UNITS_S = {"ms": 0.001, "millisecond": 0.001, "s": 1.0, "sec": 1.0, "second": 1.0,
            "m": 60.0, "min": 60.0, "minute": 60.0, "h": 3600.0, "hour": 3600.0,
            "d": 86_400.0, "day": 86_400.0}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*$")


def parse_duration(text: str) -> float:
    """Seconds in ``"10m"``, ``"7d"``, ``"10 seconds"``, ``"500 ms"``."""
    match = _DURATION_RE.match(text.lower())
    unit = match.group(2) if match else ""
    unit = unit if unit in _UNITS_S else unit.removesuffix("s")  # "seconds", not "ms"
    if not match or unit not in _UNITS_S:
        raise ConfigurationError(f"cannot read {text!r} as a duration.",
                                 fix="write it like 30s, 10m, 2h or 7d")
    return float(match.group(1)) * _UNITS_S[unit]


@dataclass(frozen=True)
class Target:
    sink: TwoPhaseCommitSink[Any]
    states: tuple[StateStore, ...]
    namespace: str
    older_than_s: float | None = None
    abort_unknown: bool = False
    retention_s: float = DEFAULT_RETENTION_S


@dataclass
class Action:
    """One thing cleanup did (or, with --dry-run, would do)."""

    action: str
    namespace: str
    subject: str
    reason: str
    done: bool
    error: str | None = None


@dataclass(frozen=True)
class InDoubt:
    """A target's undecided transactions that cleanup left (young, or of unknown queries)."""

    sink: str
    count: int
    oldest_age_s: float
    age_limit_s: float


@dataclass
class Report:
    actions: list[Action] = field(default_factory=list)
    attention: bool = False
    #: Per namespace, what is left in doubt after the run.
    in_doubt: dict[str, InDoubt] = field(default_factory=dict)

    def add(self, action: Action) -> None:
        self.actions.append(action)
        level = logging.ERROR if action.error else logging.INFO
        log.log(level, "%s %s %s: %s%s", action.action, action.namespace, action.subject,
                action.reason, f" FAILED: {action.error}" if action.error else "")

    @property
    def exit_code(self) -> int:
        if self.attention:
            return EXIT_ATTENTION
        return EXIT_FAILED if any(a.error for a in self.actions) else EXIT_OK


def clean(target: Target, report: Report, *, dry_run: bool,
          clock: Callable[[], float] = time.time) -> None:
    states = [(store, store.read()) for store in target.states]
    known = [(store, state) for store, state in states if state is not None]
    for store, state in known:
        _roll_forward(target, store, state, report, dry_run=dry_run)
    with target.sink.committer() as committer:  # the orphans' and the purge's
        _abort_orphans(target, committer, [state for _, state in known], report,
                       dry_run=dry_run, now=clock())
        _purge(target, committer, report, dry_run=dry_run, now=clock())
        _purge_tombstones(target, committer, report, dry_run=dry_run, now=clock())


def _roll_forward(target: Target, store: StateStore, state: State, report: Report, *,
                  dry_run: bool) -> None:
    if not state.pending:
        return
    subject = f"batches {[d.batch for d in state.pending]} of {store.path}"
    action = Action("roll_forward", target.namespace, subject, "decided, not done", not dry_run)
    if not dry_run:
        try:
            with Coordinator(target.sink, store, namespace=state.namespace,
                             epoch=state.epoch) as coordinator:
                coordinator.recover()
        except TwoPhaseError as exc:
            action.done, action.error = False, str(exc)
            report.attention |= isinstance(exc, TransactionLostError)
    report.add(action)


def _abort_orphans(target: Target, committer: Committer, states: list[State], report: Report,
                   *, dry_run: bool, now: float) -> None:
    decided = frozenset().union(*(state.decided_txns() for state in states))
    left: list[Handle] = []
    for handle in committer.list_in_doubt(target.namespace):
        if handle.txn_id in decided:
            continue
        verdict = _orphan_verdict(target, states, handle, now)
        if verdict is None:
            left.append(handle)
            continue
        abort, reason = verdict
        if abort:
            action = _abort(target, committer, handle, reason, dry_run=dry_run)
            report.add(action)
            if not action.done:
                left.append(handle)
        else:
            report.attention = True
            left.append(handle)
            report.add(Action("keep_unknown", target.namespace, str(handle.txn_id), reason,
                              done=False))
    report.in_doubt[target.namespace] = InDoubt(
        sink=target.sink.kind, count=len(left),
        oldest_age_s=max((now - handle.txn_id.created for handle in left), default=0.0),
        age_limit_s=max(_older_than(target, state) for state in [*states, None]))


def _orphan_verdict(target: Target, states: list[State], handle: Handle,
                    now: float) -> tuple[bool, str] | None:
    """(abort it?, why) for an in-doubt transaction worth acting on or reporting, else None.

    (False, why) means: old, but it may be a query nobody told cleanup about; report it.
    """
    txn = handle.txn_id
    age = now - txn.created
    owners = [(s, s.query_id) for s in states
              if s.query_id is not None and txn.belongs_to(s.namespace, s.query_id)]
    if not owners:
        if age < _older_than(target, None):
            return None
        if target.abort_unknown or txn.is_probe:  # a probe: a preflight interrupted mid-way
            return True, (f"a probe of python -m twophase.check, {age:.0f}s old" if txn.is_probe
                          else f"query of no configured state, {age:.0f}s old (abort_unknown)")
        return False, (f"unknown query, {age:.0f}s old: list its state location, "
                       "or set abort_unknown")
    owner, query_id = owners[0]
    if is_orphan(txn, query_id=query_id, epoch=owner.epoch, up_to_batch=owner.settled_batch):
        return True, (f"undecided; its query finished or gave up batch {owner.settled_batch}, "
                      "or moved on")
    if age >= _older_than(target, owner):
        return True, f"undecided for {age:.0f}s"
    return None


def _abort(target: Target, committer: Committer, handle: Handle, reason: str, *,
           dry_run: bool) -> Action:
    action = Action("abort_orphan", target.namespace, str(handle.txn_id), reason, not dry_run)
    if not dry_run:
        try:
            abort_through(committer, handle, DEFAULT_RETRY)
        except TwoPhaseError as exc:
            action.done, action.error = False, str(exc)
    return action


def _older_than(target: Target, state: State | None) -> float:
    if target.older_than_s is not None:
        return target.older_than_s
    interval = _trigger_interval_s(state.settings) if state else 0.0
    return max(DEFAULT_MIN_ORPHAN_AGE_S, TRIGGER_INTERVALS_PER_ORPHAN_AGE * interval)


def _trigger_interval_s(settings: Mapping[str, Any]) -> float:
    interval = settings.get("trigger", {}).get("processingTime")
    try:
        return parse_duration(str(interval)) if interval else 0.0
    except ConfigurationError:
        return 0.0


def _purge(target: Target, committer: Committer, report: Report, *, dry_run: bool,
           now: float) -> None:
    before = datetime.fromtimestamp(now - target.retention_s, tz=UTC)
    action = Action("purge", target.namespace, f"commit records before {before.isoformat()}",
                    "past retention", not dry_run)
    if not dry_run:
        try:
            purged = committer.purge_commit_records(target.namespace, before)
            action.reason = f"{purged} purged"
        except TwoPhaseError as exc:
            action.done, action.error = False, str(exc)
    report.add(action)


def _purge_tombstones(target: Target, committer: Committer, report: Report, *, dry_run: bool,
                      now: float) -> None:
    for name, keyed, part in keyed_parts(target.sink, committer):
        before = datetime.fromtimestamp(now - keyed.tombstone_retention_s, tz=UTC)
        of = f" of member {name}" if name else ""
        action = Action("purge", target.namespace, f"tombstones{of} before {before.isoformat()}",
                        "past the tombstone retention", not dry_run)
        if not dry_run:
            try:
                action.reason = f"{part.purge_tombstones(before)} purged"
            except TwoPhaseError as exc:
                action.done, action.error = False, str(exc)
        report.add(action)


def keyed_parts(sink: TwoPhaseCommitSink[Any], committer: Committer
                ) -> list[tuple[str, Keyed, Committer]]:
    """The sink, or each member of a group, that keeps tombstones (the keyed mode): its name
    in the group ("" alone), its keyed mode and its committer."""
    if isinstance(committer, GroupCommitter):
        return [(name, keyed, committer.member(name))
                for name, member in committer.sink.members.items()
                if isinstance(keyed := getattr(member, "keyed", None), Keyed)]
    keyed = getattr(sink, "keyed", None)
    return [("", keyed, committer)] if isinstance(keyed, Keyed) else []


def settle(target: Target, report: Report) -> None:
    """Before a schema migration: finish every decided batch and abort every undecided
    transaction of each listed query, fencing any run of it still alive (see the module)."""
    for store in target.states:
        action = Action("settle", target.namespace, store.path,
                        "decided batches committed, undecided transactions aborted", True)
        try:
            state = store.read_existing()
            epoch = store.start_run(state.namespace, state.settings).epoch
            with Coordinator(target.sink, store, namespace=state.namespace,
                             epoch=epoch) as coordinator:
                coordinator.start(state.query_id)
        except TwoPhaseError as exc:
            action.done, action.error = False, str(exc)
            report.attention |= isinstance(exc, TransactionLostError)
        report.add(action)


def export_metrics(report: Report, targets: list[Target], *, metrics_file: str | None,
                   pushgateway: str | None, now: float) -> None:
    """Write the run's facts and the queries' metrics to a textfile and/or a Pushgateway."""
    if not (metrics_file or pushgateway):
        return
    try:
        from prometheus_client import (  # noqa: PLC0415 - an extra, for these options only
            CollectorRegistry,
            Gauge,
            push_to_gateway,
            write_to_textfile,
        )

        from twophase.metrics import StateCollector  # noqa: PLC0415
    except ImportError as exc:
        raise ConfigurationError("--metrics-file and --pushgateway need prometheus_client.",
                                 fix="pip install 'twophase[metrics]'") from exc
    registry = CollectorRegistry()
    queries = StateCollector()
    for target in targets:
        for store in target.states:
            queries.watch(store, sink=target.sink.kind)
    registry.register(queries)
    Gauge(f"{METRICS_PREFIX}last_run_timestamp_seconds", "When the cleanup run ended.",
          registry=registry).set(now)
    Gauge(f"{METRICS_PREFIX}exit_code", "The cleanup run's exit code (0: all well).",
          registry=registry).set(report.exit_code)
    actions = Gauge(f"{METRICS_PREFIX}actions", "Actions of this cleanup run.",
                    ["namespace", "action", "outcome"], registry=registry)
    for action in report.actions:
        actions.labels(action.namespace, action.action, _outcome(action)).inc()
    left = {name: Gauge(f"{METRICS_PREFIX}{name}", doc, ["namespace", "sink"], registry=registry)
            for name, doc in _IN_DOUBT_GAUGES}
    for namespace, in_doubt in report.in_doubt.items():
        for name, value in zip(left, (in_doubt.count, in_doubt.oldest_age_s,
                                      in_doubt.age_limit_s), strict=True):
            left[name].labels(namespace, in_doubt.sink).set(value)
    if metrics_file:
        write_to_textfile(metrics_file, registry)
    if pushgateway:
        push_to_gateway(pushgateway, job=PUSH_JOB, registry=registry)


def _outcome(action: Action) -> str:
    if action.error:
        return "failed"
    return "done" if action.done else "skipped"


def forget_batch(store: StateStore, batch: int) -> None:
    """Drop a decided batch whose transactions are lost, after its rows were re-delivered."""

    def forget(state: State) -> State:
        if state.decision(batch) is None:
            raise ConfigurationError(f"batch {batch} is not pending in {store.path}.",
                                     fix="see `python -m twophase.status` for pending batches")
        return replace(state, pending=tuple(d for d in state.pending if d.batch != batch),
                       last_done_batch=max(state.last_done_batch, batch))

    store.update(forget, epoch=None)
    log.warning("forgot decided batch %d of %s: its lost rows must be re-delivered by you",
                batch, store.path)


# -- configuration ---------------------------------------------------------------------------


def target_from(entry: Mapping[str, Any]) -> Target:
    sink = build_sink(entry["sink"], resolved(entry.get("options", {})))
    state_options = resolved(entry.get("state_options", {}))
    states = tuple(StateStore(path, state_options if is_s3(path) else None)
                   for path in entry.get("states", ()))
    namespace = entry.get("namespace") or _namespace_of(states) or sink.default_namespace()
    older = entry.get("older_than")
    return Target(
        sink=sink,
        states=states,
        namespace=validate_namespace(namespace),
        older_than_s=parse_duration(older) if older else None,
        abort_unknown=bool(entry.get("abort_unknown", False)),
        retention_s=parse_duration(entry.get("retention", "7d")),
    )


def _namespace_of(states: tuple[StateStore, ...]) -> str | None:
    namespaces = {state.namespace for store in states if (state := store.read())}
    if len(namespaces) > 1:
        raise ConfigurationError(f"the states of one target have namespaces {namespaces}.",
                                 fix="make one target per namespace")
    return next(iter(namespaces), None)


def _targets(args: argparse.Namespace) -> list[Target]:
    if args.config:
        entries = tomllib.loads(Path(args.config).read_text()).get("target", [])
        if not entries:
            raise ConfigurationError(f"{args.config} has no [[target]] table.",
                                     fix="see `python -m twophase.cleanup --help`")
        return [target_from(entry) for entry in entries]
    if not args.sink:
        raise ConfigurationError("no target given.",
                                 fix="pass --config FILE, or --sink and --state")
    return [target_from({
        "sink": args.sink, "options": json.loads(args.options), "states": args.state,
        "namespace": args.namespace, "older_than": args.older_than,
        "abort_unknown": args.abort_unknown, "retention": args.retention,
    })]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m twophase.cleanup", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="TOML file with [[target]] tables")
    parser.add_argument("--sink", help="module:Class of a single target's sink")
    parser.add_argument("--options", default="{}", help="JSON keyword arguments of the sink; "
                        'a secret as a reference: {"password": {"env": "DB_PASSWORD"}}')
    parser.add_argument("--state", action="append", default=[],
                        help="a state location: a directory or s3://bucket/prefix")
    parser.add_argument("--namespace")
    parser.add_argument("--older-than")
    parser.add_argument("--abort-unknown", action="store_true")
    parser.add_argument("--retention", default="7d")
    parser.add_argument("--dry-run", action="store_true", help="report, change nothing")
    parser.add_argument("--forget-batch", type=int, metavar="N",
                        help="drop lost decided batch N of the one --state (after re-delivery)")
    parser.add_argument("--settle", action="store_true",
                        help="before a schema migration: finish decided batches and abort "
                        "every undecided transaction of the (stopped) queries, then exit")
    parser.add_argument("--metrics-file", help="write metrics for node_exporter's textfile "
                        "collector here (atomically)")
    parser.add_argument("--pushgateway", metavar="URL", help="push metrics to this Pushgateway")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.forget_batch is not None:
            if len(args.state) != 1:
                raise ConfigurationError("--forget-batch needs exactly one --state.",
                                         fix="name the state location of that query")
            forget_batch(StateStore(args.state[0]), args.forget_batch)
            return EXIT_OK
        targets = _targets(args)
    except (ConfigurationError, StateCorruptError, tomllib.TOMLDecodeError,
            json.JSONDecodeError, OSError) as exc:  # a state it cannot read: named, no trace
        log.error("%s", exc)
        return EXIT_USAGE
    report = Report()
    for target in targets:
        try:
            if args.settle:
                settle(target, report)
            else:
                clean(target, report, dry_run=args.dry_run)
        except TwoPhaseError as exc:
            report.add(Action("target", target.namespace, repr(target.sink), "cleanup stopped",
                              done=False, error=str(exc)))
    for action in report.actions:
        sys.stdout.write(json.dumps(asdict(action)) + "\n")
    try:
        export_metrics(report, targets, metrics_file=args.metrics_file,
                       pushgateway=args.pushgateway, now=time.time())
    except (ConfigurationError, OSError) as exc:
        log.error("metrics not exported: %s", exc)
        return EXIT_FAILED if report.exit_code == EXIT_OK else report.exit_code
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
