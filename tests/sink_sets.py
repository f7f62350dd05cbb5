"""Tests that run over every sink: the set of setups as one parameter.

In CI every sink runs at once, as the members of one :class:`~twophase.SinkGroup` (one driver
run serves six systems: the group's transactions are each member's own, under its own
namespace, judged by each member's reader and server); under ``-m long`` each sink also runs
alone. A test parametrises ``sinks`` by :data:`SINK_SETS`, builds a :class:`Sinks` from the
fixtures with :meth:`Sinks.of`, and judges each of its ``members``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest

from setups import SETUPS
from twophase._state import State
from twophase.group import member_handles
from twophase.testing import GroupTarget, Target

#: Every sink together (CI), then each alone (``-m long``).
SINK_SETS = [pytest.param(tuple(SETUPS), id="every-sink"),
             *(pytest.param((name,), id=name, marks=pytest.mark.long) for name in SETUPS)]


@dataclass(frozen=True)
class Sinks:
    """The target a driver writes into, and each sink's own target in it, by setup name."""

    target: Target
    members: dict[str, Target]

    @classmethod
    def of(cls, request: pytest.FixtureRequest, names: tuple[str, ...]) -> Sinks:
        """A fresh target of each setup named (its fixture ``<name>_setup``); several as one
        group, in the order named."""
        members = {name: request.getfixturevalue(f"{name}_setup").new_target()
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
    until a sweep aborts them), by the sinks' own listings."""
    handles = [handle for handle in sinks.target.build().list_in_doubt(state.namespace)
               if handle.txn_id not in state.decided_txns()]
    if not isinstance(sinks.target, GroupTarget):
        return dict.fromkeys(sinks.members, len(handles))
    held = Counter(name for handle in handles for name, _ in member_handles(handle))
    return {name: held[name] for name in sinks.members}
