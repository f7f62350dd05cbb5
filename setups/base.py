"""What every sink's test setup is: :class:`SinkSetup` (its running external system) and
:class:`Target` (one fresh, empty target on it, the :class:`twophase.testing.Target` every
suite takes)."""

from __future__ import annotations

import contextlib
import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from twophase import testing


class Proxy(Protocol):
    """A TCP relay in front of a server (the chaos suite's fault proxy is one)."""

    @property
    def port(self) -> int: ...

    @property
    def address(self) -> str: ...


#: Starts a relay to the given upstream port on loopback (and stops it on exit).
ProxyFactory = Callable[[int], AbstractContextManager[Proxy]]


@dataclass(eq=False)
class Target(testing.Target):
    """One fresh, empty target of a sink on its setup, which reads it."""

    setup: SinkSetup = field(repr=False)

    def visible(self) -> list[int]:
        return sorted(self.setup.visible(self))

    def in_doubt(self) -> list[Any]:
        return self.setup.in_doubt(self)


class SinkSetup(ABC):
    """A sink's external system as the contract suite, the crash suite, the model, the chaos
    suite and the benchmarks all take it: started by :meth:`started` (or built over servers
    a test session already runs), fresh targets from :meth:`new_target`.

    A subclass says how to start its server (behind a relay if given one), how to build it
    over the servers a test session runs (:meth:`over`), how to make a fresh target and how to
    read one; ``killable`` if its server survives a SIGKILL with its data (moto keeps objects
    in memory; SQLite has no server), ``networked`` if the sink reaches it over TCP.

    Its registration (its line in :data:`setups.SETUPS`) is what every suite derives from it:
    ``name``, ``factory``, ``servers``, ``model_ci_examples``, and where the defaults do not
    fit, ``since`` and ``every_sink``.
    """

    #: The sink's name: its package ``sinks/<name>``, this module ``setups/<name>.py``.
    name: ClassVar[str]
    #: The sink's ``"module:Class"``.
    factory: ClassVar[str]
    killable: ClassVar[bool] = False
    networked: ClassVar[bool] = True
    #: Options of the model's targets (its examples are short-lived), over the defaults.
    model_options: ClassVar[Mapping[str, Any]] = {}
    #: Examples of the protocol model per CI run (each a fresh target on the real server).
    model_ci_examples: ClassVar[int]
    #: The test fixtures (``tests/fixtures``, over :mod:`setups.servers`) whose values
    #: :meth:`over` takes, by name.
    servers: ClassVar[tuple[str, ...]] = ()
    #: The release the sink first shipped in: an upgrade from an older one leaves it out.
    since: ClassVar[str] = "0.1.0"
    #: Whether it is a member of the every-sink group (the tests over every sink run it there
    #: in CI, alone under ``-m long``); if not, they run it alone in CI.
    every_sink: ClassVar[bool] = True

    def __init__(self, scratch: Path, proxy: Proxy | None = None) -> None:
        self.scratch = scratch
        self.proxy = proxy
        self._numbers = itertools.count()

    @classmethod
    @abstractmethod
    def started(cls, scratch: Path, proxy: ProxyFactory | None = None
                ) -> AbstractContextManager[SinkSetup]:
        """Start a private server with its files under ``scratch`` (behind ``proxy`` if
        given: the sinks then reach it through the relay); stop it and delete all on exit."""

    @classmethod
    @abstractmethod
    def over(cls, scratch: Path, servers: Mapping[str, Any]
             ) -> AbstractContextManager[SinkSetup]:
        """The setup over servers a test session runs: ``servers`` holds the value of each
        fixture :attr:`servers` names; its files under ``scratch``."""

    @abstractmethod
    def target_options(self, **overrides: Any) -> dict[str, Any]:
        """The sink options of a fresh, empty target (its table, topic or prefix made)."""

    @abstractmethod
    def visible(self, target: Target) -> list[int]:
        """The event_id of every row a reader of ``target`` sees, read from the server."""

    def in_doubt(self, target: Target) -> list[Any]:
        """What the server holds open for ``target`` (see :meth:`Target.in_doubt`)."""
        return []

    def new_target(self, **overrides: Any) -> Target:
        return Target(self.factory, self.target_options(**overrides), self)

    def model_target(self) -> Target:
        """A fresh target for one example of the model (:attr:`model_options`)."""
        return self.new_target(**self.model_options)

    def kill_server(self) -> None:
        raise NotImplementedError(f"{self.name} has no server to kill")

    def start_server(self) -> None:
        """Start the server again after :meth:`kill_server` (a no-op if it runs)."""
        raise NotImplementedError(f"{self.name} has no server to start")

    def number(self) -> int:
        """A number not used before by this setup (for names of tables, prefixes, files)."""
        return next(self._numbers)


def relayed(proxy: ProxyFactory | None, port: int) -> AbstractContextManager[Proxy | None]:
    """``proxy(port)``, or nothing when there is no relay."""
    return proxy(port) if proxy is not None else contextlib.nullcontext()
