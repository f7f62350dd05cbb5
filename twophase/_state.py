"""The state file: the authority on which batches are decided.

One JSON file per query, by default ``<checkpointLocation>/twophase/state.json``, so it moves with
Spark's checkpoint, wherever that lives: a local (or mounted) file system, or S3. It holds the
fencing epoch, the last batch whose transactions are all committed, every decided-but-not-done
batch with its handles, a bounded history (its size is bounded by the pending batches), and
the query's cumulative metrics (counts merged into the writes above, see
:mod:`twophase._metrics`; a write that lost races counts them itself).

Durability and atomicity: every change is a read-modify-write that replaces the whole file
only if nobody replaced it meanwhile (:mod:`twophase._storage`: ``flock`` and an fsynced rename
locally, a conditional ``PutObject`` on S3). A reader therefore sees the old or the new state,
never a torn one; the body also carries a SHA-256 checksum, so a file damaged any other way is
refused (``StateCorruptError``) instead of being read as "nothing decided".

Fencing: each run bumps the epoch when it starts. Every change a run makes names the epoch it
holds; a run whose epoch is older than the file's is a zombie and gets ``FencedError``.

Versions: the body's ``format`` (:data:`STATE_FORMAT_VERSION`) and each handle's ``v``
(:data:`twophase._handle.HANDLE_FORMAT_VERSION`) version what is written; the rules:

* A twophase reads every format any earlier release wrote (:data:`READABLE_STATE_FORMATS`;
  handles through ``_HANDLE_UPGRADES``): upgrading with batches pending is a restart, and the
  new code commits what the old one decided. The first write of the new code writes its own
  format, so a downgrade after it is refused (below).
* A format newer than the code knows is refused with :class:`StateNewerError`, naming both
  versions, never read as what an older format would mean: fields it does not know could be
  what decides a batch. The fix is to run that newer twophase (or a later one).
* A change that older code may safely ignore (a field added with a default, like
  ``metrics``) keeps the format; a change that older code would misread (a field it must not
  ignore, a meaning changed) bumps it and adds the old format to the readable ones.
* Every release's state stays covered by a test: ``tests/test_upgrade.py`` recovers, with
  the current code, a state (and the transactions in each sink's server) that the previous
  release wrote with a decided batch pending and orphans left, from the release's checked-in
  wheel and state files (``tests/data/releases/``; ``scripts/release-fixture`` makes them).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import random
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from twophase._handle import Handle, TxnId
from twophase._metrics import STATE_WRITE_RACES, Counts, merged
from twophase._storage import Versioned, join, storage_at
from twophase.errors import (
    ConfigurationError,
    FatalError,
    FencedError,
    RetryableError,
    StateCorruptError,
    StateNewerError,
)

log = logging.getLogger(__name__)

STATE_FORMAT_VERSION = 2
#: Formats this version reads: 1 lacks ``aborted_batch`` (read as none aborted).
READABLE_STATE_FORMATS = (1, 2)
STATE_DIR_NAME = "twophase"
STATE_FILE_NAME = "state.json"
HISTORY_LIMIT = 100
NO_BATCH = -1
#: How often one change is applied again after another writer won the race (S3), and the
#: random wait before each time (doubling up to a maximum).
MAX_WRITE_RACES = 20
RACE_BACKOFF_S = 0.005
RACE_BACKOFF_MAX_S = 0.5


@dataclass(frozen=True)
class Decision:
    """A decided batch: its handles must all end up committed."""

    batch: int
    epoch: int
    decided_at: float
    handles: tuple[Handle, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "epoch": self.epoch,
            "decided_at": self.decided_at,
            "handles": [handle.to_json() for handle in self.handles],
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Decision:
        return cls(
            batch=int(obj["batch"]),
            epoch=int(obj["epoch"]),
            decided_at=float(obj["decided_at"]),
            handles=tuple(Handle.from_json(handle) for handle in obj["handles"]),
        )


@dataclass(frozen=True)
class BatchRecord:
    """What the history remembers of a completed batch (for status, the demo and benchmarks)."""

    batch: int
    epoch: int
    txns: int
    rows: int
    already_committed: int
    decided_at: float
    done_at: float
    decision_ms: float
    commit_ms: float


@dataclass(frozen=True)
class State:
    namespace: str
    epoch: int = 0
    query_id: str | None = None
    last_done_batch: int = NO_BATCH
    #: The highest batch this epoch's run gave up on (Spark aborted it, it was not decided):
    #: every undecided transaction of this epoch up to it is an orphan.
    aborted_batch: int = NO_BATCH
    pending: tuple[Decision, ...] = ()
    history: tuple[BatchRecord, ...] = ()
    settings: dict[str, Any] = field(default_factory=dict)
    #: The query's cumulative counts (see :mod:`twophase._metrics`): older versions ignore
    #: them, so the format stays readable both ways.
    metrics: dict[str, float] = field(default_factory=dict)

    def counted(self, counts: Counts) -> State:
        """This state with ``counts`` added to its metrics."""
        return replace(self, metrics=merged(self.metrics, counts)) if counts else self

    def decision(self, batch: int) -> Decision | None:
        return next((d for d in self.pending if d.batch == batch), None)

    def is_decided(self, batch: int) -> bool:
        """True if ``batch`` is decided: pending, or done (every batch up to the last done one)."""
        return batch <= self.last_done_batch or self.decision(batch) is not None

    def decided_txns(self) -> frozenset[TxnId]:
        return frozenset(h.txn_id for d in self.pending for h in d.handles)

    @property
    def last_decided_batch(self) -> int:
        """The highest batch decided: done or pending."""
        return max([self.last_done_batch, *(d.batch for d in self.pending)])

    @property
    def settled_batch(self) -> int:
        """Every undecided transaction of this epoch up to this batch is an orphan."""
        return max(self.last_done_batch, self.aborted_batch)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT_VERSION,
            "namespace": self.namespace,
            "epoch": self.epoch,
            "query_id": self.query_id,
            "last_done_batch": self.last_done_batch,
            "aborted_batch": self.aborted_batch,
            "pending": [d.to_json() for d in self.pending],
            "history": [vars(r) for r in self.history],
            "settings": self.settings,
            "metrics": self.metrics,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> State:
        return cls(
            namespace=obj["namespace"],
            epoch=int(obj["epoch"]),
            query_id=obj["query_id"],
            last_done_batch=int(obj["last_done_batch"]),
            aborted_batch=int(obj.get("aborted_batch", NO_BATCH)),
            pending=tuple(Decision.from_json(d) for d in obj["pending"]),
            history=tuple(BatchRecord(**r) for r in obj["history"]),
            settings=dict(obj["settings"]),
            metrics={name: float(value) for name, value in obj.get("metrics", {}).items()},
        )


def _checksum(body: dict[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


class StateStore:
    """Reads and atomically replaces one query's state file, local or on S3 (see
    :mod:`twophase._storage`): ``location`` is the directory or S3 prefix holding it."""

    def __init__(self, location: str | os.PathLike[str],
                 options: Mapping[str, Any] | None = None) -> None:
        self.location = os.fspath(location)
        self.options = dict(options or {})
        self.storage = storage_at(self.location, STATE_FILE_NAME, self.options)
        #: The state file, as messages name it.
        self.path = self.storage.location
        #: What this object last read or wrote: with conditional writes, an update starts
        #: from it instead of reading again (a stale one loses the race and is read anew).
        self._known: Versioned | None = None

    @classmethod
    def for_checkpoint(cls, checkpoint_location: str | os.PathLike[str],
                       options: Mapping[str, Any] | None = None) -> StateStore:
        """The store of the query whose Spark checkpoint is ``checkpoint_location``."""
        return cls(join(os.fspath(checkpoint_location), STATE_DIR_NAME), options)

    def exists(self) -> bool:
        return self.storage.read() is not None

    # -- reading ---------------------------------------------------------------------------

    def read(self) -> State | None:
        """The current state, or None if there is no state file yet."""
        found = self._known = self.storage.read()
        return None if found is None else self._decode(found.data)

    def _decode(self, raw: bytes) -> State:
        try:
            envelope = json.loads(raw)
            body = envelope["state"]
            intact = envelope["checksum"] == _checksum(body)
        except (ValueError, KeyError, TypeError) as exc:
            raise self._corrupt(f"it is not a twophase state file ({exc})") from exc
        if not intact:
            raise self._corrupt("its checksum does not match its content")
        found = body.get("format")
        if isinstance(found, int) and found > STATE_FORMAT_VERSION:
            raise self._newer(found)
        if found not in READABLE_STATE_FORMATS:
            raise self._corrupt(f"its format {found!r} is unknown to this version")
        return State.from_json(body)

    def _newer(self, found: int) -> StateNewerError:
        return StateNewerError(
            f"state file {self.path} was written by a newer twophase (state format {found}); "
            f"this twophase {_version()} reads formats up to {STATE_FORMAT_VERSION}. It is "
            "not read: what it records in fields this version does not know may decide a "
            "batch.",
            fix="upgrade twophase to the version that wrote it, or a later one, on every "
            "process using this state (driver, cleanup, status); never delete the file")

    def read_unverified(self) -> tuple[Any, str]:
        """What the file holds, checked or not, and the verdict on it (for ``status``).

        For an operator deciding what to do with a damaged file: the parsed body if it parses
        (else its raw text), and "intact" or why it cannot be trusted. Never used to decide.
        """
        found = self.storage.read()
        if found is None:
            raise FileNotFoundError(errno.ENOENT, "no state file", self.path)
        try:
            self._decode(found.data)
            verdict = "intact"
        except StateCorruptError as exc:
            verdict = exc.cause
        try:
            envelope = json.loads(found.data)
        except ValueError:
            return found.data.decode(errors="replace"), verdict
        body = envelope.get("state", envelope) if isinstance(envelope, dict) else envelope
        return body, verdict

    def _corrupt(self, why: str) -> StateCorruptError:
        return StateCorruptError(
            f"state file {self.path} cannot be trusted: {why}. It records which batches were "
            "decided; guessing could commit a batch twice or lose one.",
            fix="restore the file from a backup of the checkpoint; see what it holds with "
            f"`python -m twophase.status --unverified {self.location}`; never delete it while "
            "transactions are pending",
        )

    # -- changing --------------------------------------------------------------------------

    def update(self, change: Callable[[State], State], *, epoch: int | None) -> State:
        """Apply ``change`` and replace the file atomically.

        ``epoch`` is the epoch the caller holds; if the file has moved on, the caller is a zombie
        and gets FencedError without anything being written. ``None`` skips the check (for
        changes that are safe from any process, like marking a batch done). ``change`` may be
        applied more than once (a concurrent writer won a race): it must depend on its argument
        only.
        """
        return self._update(lambda current: change(self._existing(current)), epoch=epoch)

    def read_existing(self) -> State:
        """The current state; a missing file is an error (the run must have started)."""
        return self._existing(self.read())

    def check_epoch(self, state: State, epoch: int) -> None:
        """Raise FencedError if ``state`` belongs to a newer run than the one holding ``epoch``."""
        if state.epoch != epoch:
            raise FencedError(
                f"this run (epoch {epoch}) was fenced and stopped without committing: another "
                f"start of this query took it over (the state file {self.path} is at epoch "
                f"{state.epoch}). Decided batches stay decided; whichever run of the query "
                "starts next commits them.",
                fix="keep one run per query; if the run that took over is not running (a start "
                "that failed after the takeover), start the query again",
            )

    def _existing(self, current: State | None) -> State:
        if current is None:
            raise FatalError(
                f"there is no state file {self.path}, but this run of its query started.",
                fix="restore it from a backup of the checkpoint; never delete it",
            )
        return current

    def _update(self, change: Callable[[State | None], State], *, epoch: int | None) -> State:
        """Read, change, and write only if nobody wrote meanwhile; else again, a few times."""
        for race in range(MAX_WRITE_RACES):
            if race:  # another writer won: let it finish, then apply the change to its state
                ceiling = min(RACE_BACKOFF_MAX_S, RACE_BACKOFF_S * 2**race)
                time.sleep(random.uniform(0, ceiling))  # noqa: S311 - jitter, not secrecy
            with self.storage.exclusive():
                found = self._known if race == 0 and self.storage.conditional else None
                found = found or self.storage.read()
                current = None if found is None else self._decode(found.data)
                if epoch is not None and current is not None:
                    self.check_epoch(current, epoch)
                new = change(current).counted({STATE_WRITE_RACES: race} if race else {})
                data = _encode(new)
                version = self.storage.replace(data, None if found is None else found.version)
                self._known = None if version is None else Versioned(data, version)
                if version is not None:
                    return new
        raise RetryableError(
            f"the state file {self.path} kept changing while this process updated it "
            f"({MAX_WRITE_RACES} times): more than one run of the query writes it.",
            fix="keep one run per query; the newest run fences the others")

    def start_run(self, namespace: str, settings: dict[str, Any], *,
                  keeping: Collection[str] = ()) -> State:
        """Bump the epoch (fencing every older run) and return the new state. A state started
        under ``namespace``, or under one of ``keeping`` (a sink's former defaults), keeps its
        own; any other is refused."""

        def bump(current: State | None) -> State:
            if current is None:
                return State(namespace=namespace, epoch=1, settings=settings)
            if current.namespace != namespace and current.namespace not in keeping:
                raise ConfigurationError(
                    f"state file {self.path} belongs to namespace {current.namespace!r}, "
                    f"not {namespace!r}; its in-doubt transactions would be orphaned.",
                    fix=f"keep namespace={current.namespace!r} for this checkpoint, or start "
                    "the new namespace with a new checkpoint location",
                )
            return replace(current, epoch=current.epoch + 1, aborted_batch=NO_BATCH,
                           settings=settings)

        state = self._update(bump, epoch=None)
        self.storage.tidy()
        return state


def _version() -> str:
    """This twophase's version, for messages (imported late: the package imports this)."""
    from twophase import __version__  # noqa: PLC0415

    return __version__


def _encode(state: State) -> bytes:
    body = state.to_json()
    # One line, by json's C encoder: indent would take its pure-Python one, most of a batch's
    # overhead with a full history (python -m twophase.status prints the state indented).
    return json.dumps({"checksum": _checksum(body), "state": body}).encode()
