"""One local transaction for several members: a database table and a lake table (whose catalog
lives in the same database) made visible in the same instant.

A database makes ONE transaction visible at once. A group whose members commit one by one
(``COMMIT PREPARED`` per partition, then the catalog's swap) shows a reader of both a batch in
one and not yet in the other. When consecutive members of a group publish into the same
database, their committers can instead settle the batch inside one local transaction of that
database, committed once: the staged rows moved into the table, the proof written, and the
lake catalog's pointer swapped (compare-and-swap), all visible together or not at all.

The capability is the committer's: a committer that has it answers ``local_commit()`` with a
:class:`LocalCommitMember` (None: not now, say a sink not in its staged mode):

========================  ==========================================================================
method                    meaning
========================  ==========================================================================
``local_domain()``        the identity of the database it publishes into (for PostgreSQL
                          ``postgresql://host:port/dbname``), or None: no local commit. Members
                          whose domains are equal (the same string) share one transaction.
``local_transaction()``   a context manager: a new connection of that domain in a transaction,
                          committed when the block ends without an error, rolled back (and
                          closed) otherwise. The group opens it through the first member of a run.
``settle_in(conn, hs)``   prove or publish ``hs`` (one batch's transactions of this member)
                          inside ``conn``'s transaction, commit nothing; each handle's outcome.
                          A proof of an earlier commit first (recovery settles again), read in
                          the same transaction; a lost transaction raises (the whole local
                          transaction rolls back: nothing of the batch is published).
========================  ==========================================================================

For ``postgresql://`` domains the connection is a psycopg 3 connection (autocommit off).

:class:`LocalCommitStage` is the committer of such a run's commit stage: it commits the stage's
handles (``commit_handles``) in ONE settle, one local transaction. A crash before that
transaction's commit leaves every member as it was (recovery settles again); after it, every
member's proof holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from twophase._handle import Handle, TxnId
from twophase.errors import FatalError
from twophase.sink import AbortOutcome, CommitOutcome, Committer, StageCommits


@runtime_checkable
class LocalCommitMember(Protocol):
    """A committer's capability to publish inside a shared local transaction (module
    docstring)."""

    def local_domain(self) -> str | None:
        """The database it publishes into (members with the same domain share a transaction)."""

    def local_transaction(self) -> AbstractContextManager[Any]:
        """A new connection of the domain in a transaction: committed at the end of the block,
        rolled back on an error."""

    def settle_in(self, connection: Any, handles: Sequence[Handle]
                  ) -> Mapping[TxnId, CommitOutcome]:
        """Prove or publish ``handles`` inside ``connection``'s transaction (no commit)."""


def local_commit_of(committer: Committer) -> LocalCommitMember | None:
    """``committer.local_commit()`` if the committer has the capability and offers it now."""
    offer = getattr(committer, "local_commit", None)
    member = offer() if callable(offer) else None
    return member if isinstance(member, LocalCommitMember) else None


@dataclass(frozen=True)
class LocalPart:
    """One member of a local run: its name, its committer, its capability, its handles."""

    name: str
    committer: Committer
    local: LocalCommitMember
    handles: tuple[Handle, ...]


class LocalCommitStage(Committer):
    """The committer of one commit stage made of several members settled in ONE local
    transaction (module docstring). ``parts`` in commit order; every part's domain is the
    same."""

    def __init__(self, parts: Sequence[LocalPart]) -> None:
        super().__init__(parts[0].committer.sink)
        self.parts = tuple(parts)
        self._owner = {handle.txn_id: part for part in self.parts for handle in part.handles}

    @property
    def handles(self) -> tuple[Handle, ...]:
        return tuple(handle for part in self.parts for handle in part.handles)

    @property
    def label(self) -> str:
        return "+".join(part.name for part in self.parts)

    def commit_handles(self, handles: Sequence[Handle], commits: StageCommits
                       ) -> list[CommitOutcome]:
        """Every part's handles among ``handles`` in one local transaction."""
        return commits.at_once(lambda: self._settle(handles), handles)

    def commit(self, handle: Handle) -> CommitOutcome:
        """One transaction in a local transaction of its own."""
        return self._settle([handle])[handle.txn_id]

    def abort(self, handle: Handle) -> AbortOutcome:
        """Through the member that owns the transaction."""
        return self._part_of(handle).committer.abort(handle)

    def _part_of(self, handle: Handle) -> LocalPart:
        if handle.txn_id not in self._owner:
            raise FatalError(f"transaction {handle.txn_id} is not one of the local commit of "
                             f"members {self.label}.", fix="this is a bug in twophase: report it")
        return self._owner[handle.txn_id]

    def _settle(self, handles: Sequence[Handle]) -> dict[TxnId, CommitOutcome]:
        """``handles``, part by part in commit order, in one local transaction opened through
        the first part and committed once (an error anywhere rolls back every part)."""
        owned = {handle.txn_id: self._part_of(handle) for handle in handles}
        outcomes: dict[TxnId, CommitOutcome] = {}
        with self.parts[0].local.local_transaction() as connection:
            for part in self.parts:
                if mine := [handle for handle in handles if owned[handle.txn_id] is part]:
                    outcomes.update(part.local.settle_in(connection, mine))
        return outcomes
