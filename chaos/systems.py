"""The sinks' systems as a chaos scenario drives them: each sink's setup (:mod:`setups`)
started behind a fault proxy.

A :class:`System` starts the setup's real server (MariaDB, PostgreSQL, moto S3, a Kafka
broker, the HTTP receiver; SQLite has none) with a :class:`~chaos.proxy.FaultProxy` in front
of it, so that the sinks of its fresh targets reach the server through the proxy while a
reader reads straight from the server; it kills and restarts the server. Which faults apply
follows from the setup: a server kill where the server keeps its data across one, network
faults where the sink reaches it over TCP. A sink joins the chaos suite by joining
:data:`setups.SETUPS`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from chaos.proxy import HOST, FaultProxy
from setups import SETUPS, SinkSetup, Target

#: The fault kinds a scenario injects (see chaos.scenario); which apply depends on the system.
DRIVER_KILL = "driver kill"
ZOMBIE = "zombie driver"
SERVER_KILL = "server kill"
NETWORK_CUT = "network cut"
NETWORK_RESET = "network reset"
NETWORK_SLOW = "network slowed"
NETWORK_FAULTS = (NETWORK_CUT, NETWORK_RESET, NETWORK_SLOW)


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


SYSTEMS: dict[str, Callable[[Path], System]] = {
    name: functools.partial(System, setup) for name, setup in SETUPS.items()}


def in_doubt(target: Target, namespace: str) -> list[Any]:
    """The sink's own list of transactions of ``namespace`` still in doubt."""
    return list(target.build().list_in_doubt(namespace))
