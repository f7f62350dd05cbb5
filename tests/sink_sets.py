"""Tests that run over every sink: the set of registered setups (:data:`setups.SETUPS`) as one
parameter.

In CI every sink of the every-sink group (each setup whose ``every_sink`` is true) runs at
once, as the members of one :class:`~twophase.SinkGroup` (one driver run serves every system
of the group: the group's transactions are each member's own, under its own namespace, judged
by each member's reader and server); under ``-m long`` each of them also runs alone. A sink outside
the group runs alone in CI. A test parametrises ``sinks`` by :data:`SINK_SETS` (or
:func:`sink_sets` of :func:`shipped_in` a release), builds a :class:`Sinks` from the fixtures
with :meth:`Sinks.of`, and judges each of its ``members``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from _pytest.mark import ParameterSet
from packaging.version import Version

from setups import SETUPS, SinkSetup
from twophase._eligibility import undecided_handles
from twophase._state import State
from twophase.group import member_handles
from twophase.testing import GroupTarget, Target
from twophase.testing.contract import list_in_doubt

Registry = Mapping[str, type[SinkSetup]]


def fixture_of(name: str) -> str:
    """The fixture of a registered sink's setup (``tests/conftest.py`` makes one for each)."""
    return f"{name}_setup"


def shipped_in(release: str, setups: Registry = SETUPS) -> dict[str, type[SinkSetup]]:
    """The registered setups of the sinks that ``release`` has (``since`` it or earlier)."""
    return {name: setup for name, setup in setups.items()
            if Version(setup.since) <= Version(release)}


def sink_sets(setups: Registry = SETUPS) -> list[ParameterSet]:
    """The every-sink group together (CI), then each sink alone (``-m long`` for the group's
    members, CI for a sink outside it)."""
    group = tuple(name for name, setup in setups.items() if setup.every_sink)
    return [pytest.param(group, id="every-sink"),
            *(pytest.param((name,), id=name, marks=[pytest.mark.long] if name in group else [])
              for name in setups)]


#: Every registered sink: the group together (CI), then each alone.
SINK_SETS = sink_sets()


@dataclass(frozen=True)
class Sinks:
    """The target a driver writes into, and each sink's own target in it, by setup name."""

    target: Target
    members: dict[str, Target]

    @classmethod
    def of(cls, request: pytest.FixtureRequest, names: tuple[str, ...]) -> Sinks:
        """A fresh target of each setup named (its fixture :func:`fixture_of`); several as one
        group, in the order named."""
        members = {name: request.getfixturevalue(fixture_of(name)).new_target()
                   for name in names}
        if len(members) == 1:
            return cls(next(iter(members.values())), members)
        return cls(GroupTarget.of(members), members)

    def visible(self) -> dict[str, list[int]]:
        """What each sink's reader sees (sorted event ids)."""
        return {name: member.visible() for name, member in self.members.items()}

    def in_doubt(self) -> dict[str, list[Any]]:
        """What each sink's server still holds open for its target."""
        return {name: member.in_doubt() for name, member in self.members.items()}

    def expecting(self, rows: list[int]) -> dict[str, list[int]]:
        """``rows`` seen by every sink's reader."""
        return dict.fromkeys(self.members, rows)

    def nothing(self) -> dict[str, list[Any]]:
        """Nothing held open by any sink's server."""
        return {name: [] for name in self.members}


def undecided(sinks: Sinks, state: State) -> dict[str, int]:
    """How many transactions of the query each sink holds that no decision names (orphans,
    until a sweep aborts them), by the sinks' own listings and ``status``'s rule."""
    handles = undecided_handles(list_in_doubt(sinks.target.build(), state.namespace), state)
    if not isinstance(sinks.target, GroupTarget):
        return dict.fromkeys(sinks.members, len(handles))
    held = Counter(name for handle in handles for name, _ in member_handles(handle))
    return {name: held[name] for name in sinks.members}
