"""The sinks' systems as a chaos scenario drives them: each sink's setup (:mod:`setups`)
started behind a fault proxy.

A :class:`System` starts the setup's real server (MariaDB, PostgreSQL, moto S3, a Kafka
broker, the HTTP receiver; SQLite has none) with a :class:`~chaos.proxy.FaultProxy` in front
of it, so that the sinks of its fresh targets reach the server through the proxy while a
reader reads straight from the server; it kills and restarts the server. Which faults apply
follows from the setup: a server kill where the server keeps its data across one, network
faults where the sink reaches it over TCP. A sink joins the chaos suite by joining
:data:`setups.SETUPS`.

A :class:`GroupSystem` is a :class:`~twophase.SinkGroup` of two or more of them (``mysql+kafka``:
the table commits before the topic): each member a :class:`System` of its own, a fresh
:class:`~twophase.testing.GroupTarget` per round, and the faults of every member, each struck
at one member (its server killed, the network to it cut through its proxy). A member with no
server (``delta``: a table on a local path; ``iceberg``: one in a local warehouse, its SQL
catalog an SQLite file; ``sqlite``) adds no fault of its own: over ``mysql+delta+kafka`` the
lake sees the driver kills (between members too) and the zombie drivers, MariaDB and Kafka
their server and network faults besides; over ``postgres+iceberg+kafka`` the same, PostgreSQL's
server and network faults in place of MariaDB's.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from chaos.proxy import HOST, FaultProxy
from setups import SETUPS, SinkSetup
from twophase.testing import GroupTarget, Target

#: The fault kinds a scenario injects (see chaos.scenario); which apply depends on the system.
DRIVER_KILL = "driver kill"
ZOMBIE = "zombie driver"
SERVER_KILL = "server kill"
NETWORK_CUT = "network cut"
NETWORK_RESET = "network reset"
NETWORK_SLOW = "network slowed"
NETWORK_FAULTS = (NETWORK_CUT, NETWORK_RESET, NETWORK_SLOW)
#: A group's member server stopped for longer than a batch (see chaos.scenario).
MEMBER_DOWN = "member down"


class System:
    """A sink's setup behind a fault proxy; :meth:`running` starts both."""

    proxy: FaultProxy | None = None
    setup: SinkSetup

    def __init__(self, setup_class: type[SinkSetup], scratch: Path) -> None:
        self.setup_class, self.scratch = setup_class, scratch
        self.name = setup_class.name
        #: Besides driver kills and zombies, which everyone gets.
        self.server_faults = ((SERVER_KILL,) if setup_class.killable else ()) + (
            NETWORK_FAULTS if setup_class.networked else ())

    @contextlib.contextmanager
    def running(self) -> Iterator[System]:
        relay = self._proxied if self.setup_class.networked else None
        with self.setup_class.started(self.scratch, relay) as self.setup:
            yield self

    @property
    def members(self) -> dict[str, System]:
        """The systems a fault strikes at: this one."""
        return {self.name: self}

    def new_target(self) -> Target:
        return self.setup.new_target()

    def kill_server(self) -> None:
        self.setup.kill_server()

    def start_server(self) -> None:
        """Start the server again after :meth:`kill_server` (a no-op if it runs)."""
        if self.setup_class.killable:
            self.setup.start_server()

    def _proxied(self, upstream_port: int) -> FaultProxy:
        self.proxy = FaultProxy((HOST, upstream_port))
        return self.proxy


class GroupSystem(System):
    """Member systems as one sink group, committed in the order named (``mysql+kafka``)."""

    def __init__(self, names: list[str], scratch: Path) -> None:
        self.scratch, self.name = scratch, "+".join(names)
        self._members = {name: System(SETUPS[name], scratch / name) for name in names}
        faults = [fault for member in self._members.values() for fault in member.server_faults]
        self.server_faults = tuple(dict.fromkeys(
            faults + ([MEMBER_DOWN] if SERVER_KILL in faults else [])))

    @property
    def members(self) -> dict[str, System]:
        return self._members

    @contextlib.contextmanager
    def running(self) -> Iterator[System]:
        with contextlib.ExitStack() as stack:
            for member in self._members.values():
                member.scratch.mkdir(parents=True, exist_ok=True)
                stack.enter_context(member.running())
            yield self

    def new_target(self) -> GroupTarget:
        return GroupTarget.of({name: member.new_target()
                               for name, member in self._members.items()})

    def kill_server(self) -> None:
        raise ValueError(f"{self.name}: a fault strikes at one member's server")

    def start_server(self) -> None:
        for member in self._members.values():
            member.start_server()


#: Groups the chaos suite names (any ``a+b`` of SETUPS is accepted too): a table before a topic
#: (the outbox), a table before objects, a local table before a webhook, a table before a
#: Delta table, or an Iceberg table, before a topic (the lake in the middle), a table before
#: its event in a Redis stream or a NATS JetStream subject.
GROUPS = ("mysql+kafka", "postgres+s3", "sqlite+http", "mysql+delta+kafka",
          "postgres+iceberg+kafka", "mysql+redis", "mysql+nats")

SYSTEMS: dict[str, Callable[[Path], System]] = {
    name: functools.partial(System, setup) for name, setup in SETUPS.items()}
SYSTEMS.update({name: functools.partial(GroupSystem, name.split("+")) for name in GROUPS})


def system(name: str) -> Callable[[Path], System]:
    """The system of a sink, or of a group of sinks named ``a+b`` (KeyError if unknown)."""
    if name in SYSTEMS:
        return SYSTEMS[name]
    names = name.split("+")
    if len(names) < 2 or len(set(names)) != len(names) or not set(names) <= set(SETUPS):
        raise KeyError(name)
    return functools.partial(GroupSystem, names)


def in_doubt(target: Target, namespace: str) -> list[Any]:
    """The sink's own list of transactions of ``namespace`` still in doubt (its committer's)."""
    with target.build().committer() as committer:
        return list(committer.list_in_doubt(namespace))
