"""The one test target every shipped suite takes: a fresh, empty target of a sink.

A :class:`Target` is one table, topic, bucket prefix or directory, empty, whose rows have
:data:`~twophase.testing.contract.ORDER_COLUMNS`. It names the sink over it as a driver process
rebuilds it (``factory``, ``"module:Class"``, and its keyword ``options``: plain, picklable
values), and says what a reader of it sees and what its server still holds in doubt. The
contract suite, the crash suite and the model take it; the chaos suite and the benchmarks too
(through ``setups``). A sink's tests subclass it and read their system in :meth:`visible`::

    from twophase.testing import Target

    class MyTarget(Target):
        def visible(self):                  # the event_id of every row a reader sees,
            return sorted(...)              # sorted, repeats included (they are duplicates)

    MyTarget("my_package.sinks:MySink", {"directory": str(tmp_path / "out")})

A :class:`Setup` makes fresh targets on a running external system (``setups.SinkSetup`` is
one): a suite class that names a fixture of it in ``setup_fixture`` gets a new target of it
per test (see :class:`twophase.testing.suite.TargetSuite`).
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from twophase._loader import build_sink
from twophase.sink import TwoPhaseCommitSink


@dataclass(eq=False)
class Target(ABC):
    """One fresh, empty target of a sink: how to build the sink over it, what a reader of it
    sees, what its server holds in doubt."""

    #: ``"module:Class"`` (or a factory) of the sink: the crash suite's driver imports it.
    factory: str
    #: The keyword options the sink is built from (they cross to a driver process).
    options: dict[str, Any]

    def build(self) -> TwoPhaseCommitSink[Any]:
        """A new sink object over this target, built as a driver process builds it."""
        return build_sink(self.factory, self.options)

    @abstractmethod
    def visible(self) -> list[int]:
        """The sorted event_id of every row a reader of the target sees, repeats included."""

    def in_doubt(self) -> list[Any]:
        """What the server itself still holds open for this target (prepared transactions,
        open uploads, open Kafka transactions): empty once every batch is finished. None by
        default: the sink's committer's ``list_in_doubt`` is checked besides."""
        return []


class Setup(Protocol):
    """A running external system that makes fresh targets (``setups.SinkSetup`` is one)."""

    def new_target(self, **overrides: Any) -> Target:
        """A fresh, empty target; ``overrides`` go over the sink's default options."""
        ...


@dataclass(eq=False)
class GroupTarget(Target):
    """Fresh targets of several sinks as one :class:`~twophase.SinkGroup` (a target itself):
    a reader of each member must see the same rows, and what is in doubt is every member's.

    ``GroupTarget.of({"orders": table_target, "events": topic_target})`` commits the members
    in that order (or ``commit_order``); ``columns`` as for the group.
    """

    members: dict[str, Target] = field(default_factory=dict)

    @classmethod
    def of(cls, members: Mapping[str, Target], *, commit_order: Sequence[str] | None = None,
           columns: Mapping[str, Sequence[str]] | None = None) -> GroupTarget:
        options: dict[str, Any] = {"members": {
            name: {"sink": target.factory, "options": target.options}
            for name, target in members.items()}}
        if commit_order is not None:
            options["commit_order"] = list(commit_order)
        if columns is not None:
            options["columns"] = {name: list(names) for name, names in columns.items()}
        return cls("twophase:SinkGroup", options, dict(members))

    def visible(self) -> list[int]:
        """What a reader of the member that commits first sees, once every member was checked
        for the group's promises: no member shows a row twice, and no member shows a row that
        the member committing before it does not (the declared order). Between the first and
        the last member's commit the later members show less: :meth:`in_doubt` names them."""
        seen = self._seen()
        return seen[self.commit_order[0]]

    def in_doubt(self) -> list[Any]:
        """Every member's own, and each member that shows fewer rows than the first (its
        commits are still to come)."""
        seen = self._seen()
        first = set(seen[self.commit_order[0]])
        behind = [(name, "behind", len(first - set(rows))) for name, rows in seen.items()
                  if first - set(rows)]
        return behind + [(name, held) for name, target in self.members.items()
                         for held in target.in_doubt()]

    @property
    def commit_order(self) -> list[str]:
        return list(self.options.get("commit_order") or self.members)

    def _seen(self) -> dict[str, list[int]]:
        seen = {name: self.members[name].visible() for name in self.commit_order}
        for name, rows in seen.items():
            if len(rows) != len(set(rows)):
                raise ExactlyOnceError(f"member {name!r} shows a row twice")
        for earlier, later in itertools.pairwise(seen):
            if ahead := sorted(set(seen[later]) - set(seen[earlier])):
                raise ExactlyOnceError(
                    f"member {later!r} shows {len(ahead)} rows that {earlier!r}, which commits "
                    f"before it, does not: {ahead[:10]}")
        return seen


class ExactlyOnceError(AssertionError):
    """What the external system shows is not exactly the rows of the decided batches."""
