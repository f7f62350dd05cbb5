"""Transaction ids and handles: the two small values that cross process boundaries.

A :class:`TxnId` names one sink transaction deterministically, so that recovery and cleanup can
find every transaction a query ever opened by listing the external system, also the ones whose
handle never reached the driver. Its text form is::

    <namespace>.<query>.<epoch>.<batch>.<partition>.<attempt>.<created>

``query`` is the first 16 hex digits of the query id, ``epoch`` the fencing epoch of the run that
opened it (so a sweep never touches a newer run's transactions, and ids stay unique when a state
file is restored from a backup), ``attempt`` the Spark task attempt id, ``created`` the opening
time in Unix seconds (external systems rarely keep one we can read; cleanup judges age by it).
The first four fields form the *global* part, at most 59 characters, the rest the *branch* part:
systems with short id fields (MySQL XA: 64-byte gtrid and bqual) store them separately.

A :class:`Handle` is what ``pre_commit`` returns: the transaction id, the sink kind, the row count
and a small sink-specific mapping, versioned and JSON-serialisable. It is written into the state
file, so every handle format ever written must stay loadable (see ``_HANDLE_UPGRADES``).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from twophase.errors import ConfigurationError, StateCorruptError, StateNewerError

NAMESPACE_MAX_LENGTH = 24
QUERY_DIGITS = 16
HANDLE_FORMAT_VERSION = 1
#: The longest text form of a transaction id: namespace, 16 query digits, and the widest
#: epoch (6), batch (10), partition (6), attempt (12) and creation time (12), dot-separated.
TXN_ID_MAX_LENGTH = NAMESPACE_MAX_LENGTH + QUERY_DIGITS + 6 + 10 + 6 + 12 + 12 + 6

#: The query id of preflight probe transactions (``python -m twophase.check``): the nil UUID,
#: which Spark never gives a query (its ids are random, version 4) and which
#: :func:`query_key` refuses, so that no run, recovery or cleanup ever takes a probe for one
#: of its query's transactions, and none is ever decided (a decision names a query's ids only).
PROBE_QUERY_ID = "00000000-0000-0000-0000-000000000000"
PROBE_QUERY_KEY = "0" * QUERY_DIGITS
#: A probe's partition: the widest the id holds, so that what a sink derives from it (Kafka's
#: pooled transactional ids) is apart from every real partition's.
PROBE_PARTITION = 999_999

#: Hex digits of the hash that keeps a shortened derived namespace distinct.
FITTED_HASH_DIGITS = 8

UNSAFE_IN_NAMESPACE = re.compile(r"[^A-Za-z0-9_-]")
_NAMESPACE_RE = re.compile(rf"^[A-Za-z0-9_-]{{1,{NAMESPACE_MAX_LENGTH}}}$")
_TXN_RE = re.compile(
    rf"^(?P<namespace>[A-Za-z0-9_-]{{1,{NAMESPACE_MAX_LENGTH}}})"
    rf"\.(?P<query>[0-9a-f]{{{QUERY_DIGITS}}})"
    r"\.(?P<epoch>\d{1,6})\.(?P<batch>\d{1,10})"
    r"\.(?P<partition>\d{1,6})\.(?P<attempt>\d{1,12})\.(?P<created>\d{1,12})$"
)

#: Where a composite handle (a sink group's) keeps the handles it stands for, by label.
PARTS_KEY = "members"

JSON = Any  # a value json.dumps accepts; mypy cannot express the recursive type usefully


def validate_namespace(namespace: str) -> str:
    """Return ``namespace`` if it can prefix transaction ids, else raise ConfigurationError."""
    if not _NAMESPACE_RE.match(namespace):
        raise ConfigurationError(
            f"namespace {namespace!r} is not usable in transaction ids.",
            fix=f"use 1-{NAMESPACE_MAX_LENGTH} characters from A-Z a-z 0-9 _ -",
        )
    return namespace


def fitted_namespace(derived: str) -> str:
    """A namespace twophase derived itself (a sink's default, a group member's): ``derived``
    if it is usable, else a stable shortening of it that is, so that no default is ever
    refused. A usable name is kept as it is: no running query's namespace changes."""
    if _NAMESPACE_RE.match(derived):
        return derived
    digest = hashlib.sha256(derived.encode()).hexdigest()[:FITTED_HASH_DIGITS]
    head = UNSAFE_IN_NAMESPACE.sub("_", derived)[:NAMESPACE_MAX_LENGTH - FITTED_HASH_DIGITS - 1]
    return f"{head}-{digest}"


def qualified_namespace(name: str, *where: str) -> str:
    """A target's default namespace: its ``name`` (reduced to ``[A-Za-z0-9_-]``, shortened)
    and a digest of the name with ``where`` it is (a database, a schema, a path), so that two
    targets of one name in two places never share a namespace."""
    head = UNSAFE_IN_NAMESPACE.sub("_", name)[:NAMESPACE_MAX_LENGTH - FITTED_HASH_DIGITS - 1]
    digest = hashlib.sha256("\0".join((*where, name)).encode()).hexdigest()
    return f"{head or 'target'}-{digest[:FITTED_HASH_DIGITS]}"


def query_key(query_id: str) -> str:
    """The part of a (UUID) query id that goes into transaction ids."""
    digits = query_id.replace("-", "").lower()
    if len(digits) < QUERY_DIGITS or not re.fullmatch(r"[0-9a-f]+", digits):
        raise ValueError(f"query id {query_id!r} is not a UUID")
    if digits[:QUERY_DIGITS] == PROBE_QUERY_KEY:
        raise ValueError(f"query id {query_id!r} is reserved for preflight probes")
    return digits[:QUERY_DIGITS]


@dataclass(frozen=True, order=True)
class TxnId:
    """The deterministic name of one sink transaction (see the module docstring)."""

    namespace: str
    query: str
    epoch: int
    batch: int
    partition: int
    attempt: int
    created: int

    @classmethod
    def open(
        cls,
        *,
        namespace: str,
        query_id: str,
        epoch: int,
        batch: int,
        partition: int,
        attempt: int,
        clock: Callable[[], float] = time.time,
    ) -> TxnId:
        """A new id for a transaction opened now."""
        return cls(
            validate_namespace(namespace),
            query_key(query_id),
            epoch,
            batch,
            partition,
            attempt,
            int(clock()),
        )

    @classmethod
    def probe(cls, namespace: str, *, attempt: int = 0,
              clock: Callable[[], float] = time.time) -> TxnId:
        """The id of a preflight probe transaction of ``namespace``, opened now (see
        :data:`PROBE_QUERY_ID`): epoch 0, which no run holds, batch 0, the probe partition;
        ``attempt`` tells apart probes made at once (the driver's 0, each executor's own)."""
        return cls(validate_namespace(namespace), PROBE_QUERY_KEY, 0, 0, PROBE_PARTITION,
                   attempt, int(clock()))

    @property
    def is_probe(self) -> bool:
        """Whether this is a preflight probe's id (never a query's)."""
        return self.query == PROBE_QUERY_KEY

    @classmethod
    def parse(cls, text: str) -> TxnId:
        """Parse the text form; raises ValueError for anything else."""
        match = _TXN_RE.match(text)
        if match is None:
            raise ValueError(f"not a twophase transaction id: {text!r}")
        fields = match.groupdict()
        return cls(
            fields["namespace"],
            fields["query"],
            *(int(fields[name]) for name in ("epoch", "batch", "partition", "attempt", "created")),
        )

    @property
    def global_part(self) -> str:
        """``namespace.query.epoch.batch``: at most 59 characters."""
        return f"{self.namespace}.{self.query}.{self.epoch}.{self.batch}"

    @property
    def branch_part(self) -> str:
        """``partition.attempt.created``."""
        return f"{self.partition}.{self.attempt}.{self.created}"

    @classmethod
    def from_parts(cls, global_part: str, branch_part: str) -> TxnId:
        return cls.parse(f"{global_part}.{branch_part}")

    def belongs_to(self, namespace: str, query_id: str) -> bool:
        return self.namespace == namespace and self.query == query_key(query_id)

    def __str__(self) -> str:
        return f"{self.global_part}.{self.branch_part}"


@dataclass(frozen=True)
class Handle:
    """A pre-committed transaction: durable in the external system, not yet visible.

    ``data`` holds what the sink needs to commit or abort it from another process (an upload id,
    a producer id and epoch, ...). Keep it small: it is stored in the state file.
    """

    txn_id: TxnId
    sink: str
    rows: int = 0
    data: Mapping[str, JSON] = field(default_factory=dict)

    def to_json(self) -> dict[str, JSON]:
        return {
            "v": HANDLE_FORMAT_VERSION,
            "sink": self.sink,
            "txn": str(self.txn_id),
            "rows": self.rows,
            "data": dict(self.data),
        }

    def parts(self) -> dict[str, Handle]:
        """The handles this one stands for, by label (a sink group's: one per member), as
        the state file holds them; empty for a handle of one transaction."""
        parts = self.data.get(PARTS_KEY)
        if not isinstance(parts, Mapping):
            return {}
        return {str(label): Handle.from_json(part) for label, part in parts.items()}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, obj: Mapping[str, JSON]) -> Handle:
        """Load a handle written by this or any earlier version of twophase."""
        version = obj.get("v")
        if not isinstance(version, int) or version > HANDLE_FORMAT_VERSION:
            error = StateNewerError if isinstance(version, int) else StateCorruptError
            raise error(
                f"handle format {version!r} is unknown to this twophase "
                f"(which reads up to {HANDLE_FORMAT_VERSION}): {dict(obj)!r}.",
                fix="run the newer twophase version that wrote it",
            )
        current = dict(obj)
        while current["v"] < HANDLE_FORMAT_VERSION:
            current = _HANDLE_UPGRADES[current["v"]](current)
        return cls(
            txn_id=TxnId.parse(current["txn"]),
            sink=current["sink"],
            rows=int(current["rows"]),
            data=current["data"],
        )

    @classmethod
    def loads(cls, text: str) -> Handle:
        return cls.from_json(json.loads(text))


# Upgrades from each older handle format to the next one. A format change adds an entry here and
# a golden file under tests/data/handles/; the golden files of every older format must keep
# loading. There is only one format so far.
_HANDLE_UPGRADES: dict[int, Callable[[dict[str, JSON]], dict[str, JSON]]] = {}
