"""Least privilege and secrets by reference, for any setup whose server has users and grants.

:func:`least_privileged_target` is a fresh target of a setup whose sink logs in as a user of
its own, holding exactly the grants the setup's :meth:`grant_sink_user` gives (the ones the
README's Security section lists), its password in a file readable by the owner only and given
to the sink as ``twophase.Secret(file=...)``. The target crosses to a driver process as plain
JSON, so its factory is :func:`sink_with_password_file`, which builds the sink with that
reference: what is pickled to the executors is the reference, never the clear text.

Over a secured server (``secured_mariadb``, ``secured_postgres``) the same setup class is the
secured variant: the server's params carry the sink's verified-TLS options.
:class:`LeastPrivileged` wraps a setup so that every fresh target is least-privileged (the
crash suites of both SQL sinks run on it, over the secured servers).
"""

from __future__ import annotations

import importlib
import os
import secrets
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from setups.base import SinkSetup, Target
from setups.servers.local import write_owner_only
from twophase import Secret, TwoPhaseCommitSink

#: The factory a least-privileged target names (see :func:`sink_with_password_file`).
FACTORY = f"{__name__}:sink_with_password_file"
USER_PREFIX = "sink_"


#: What a SQL sink's user needs on its target table: INSERT, and in upsert mode SELECT and
#: UPDATE too (MySQL's ON DUPLICATE KEY UPDATE and PostgreSQL's ON CONFLICT DO UPDATE read
#: the row they update: refused without SELECT on both, found by experiment).
TABLE_PRIVILEGES = ("INSERT",)
UPSERT_PRIVILEGES = ("SELECT", "INSERT", "UPDATE")
#: The keyed mode also deletes (and needs the same on its tombstone table, which a keyed
#: least-privileged target does not make yet).
KEYED_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")

#: A grant: the privileges and the object they are on (``("SELECT", "INSERT"), "`db`.`t`"``).
Grant = tuple[tuple[str, ...], str]


@runtime_checkable
class GrantingSetup(Protocol):
    """A setup whose server can make a user holding exactly the sink's grants."""

    def sink_grants(self, options: Mapping[str, Any]) -> dict[str, Grant]:
        """What the sink needs on the target ``options`` (a target's sink options) names, by
        role (``"table"``, ``"markers"``, ...): exactly the README's list."""
        ...

    def create_sink_user(self, name: str, password: str, grants: list[Grant]) -> None:
        """User ``name`` holding exactly ``grants`` (an earlier user of that name dropped)."""
        ...


def table_privileges(options: Mapping[str, Any]) -> tuple[str, ...]:
    """What the sink's user needs on the target table of ``options`` (a target's options)."""
    return {"upsert": UPSERT_PRIVILEGES, "keyed": KEYED_PRIVILEGES}.get(
        str(options.get("mode")), TABLE_PRIVILEGES)


def least_privileged_target(setup: SinkSetup, *, without: tuple[str, str] | None = None,
                            **overrides: Any) -> Target:
    """A fresh target of ``setup`` written by a user of its own (see the module docstring);
    ``without=(role, privilege)``: that one privilege is not granted."""
    if not isinstance(setup, GrantingSetup):
        raise TypeError(f"{setup.name} cannot make a user with grants")
    options = setup.target_options(**overrides)
    name = f"{USER_PREFIX}{os.getpid()}_{setup.number()}"
    password = secrets.token_hex(12)
    password_file = setup.scratch / f"{name}.password"
    write_owner_only(password_file, password + "\n")
    grants = setup.sink_grants(options)
    if without is not None:
        role, privilege = without
        privileges, on = grants[role]
        grants[role] = (tuple(p for p in privileges if p != privilege), on)
    setup.create_sink_user(name, password, [grant for grant in grants.values() if grant[0]])
    options = {key: value for key, value in options.items() if key != "password"}
    return Target(FACTORY, {**options, "sink": setup.factory, "user": name,
                            "password_file": str(password_file)}, setup)


class LeastPrivileged:
    """A setup whose fresh targets are all least-privileged (a
    :class:`twophase.testing.target.Setup`: a suite's ``setup_fixture`` may name it)."""

    def __init__(self, setup: SinkSetup) -> None:
        self.setup = setup

    def new_target(self, **overrides: Any) -> Target:
        return least_privileged_target(self.setup, **overrides)


def sink_with_password_file(*, sink: str, password_file: str,
                            **options: Any) -> TwoPhaseCommitSink[Any]:
    """The sink ``sink`` (``"module:Class"``) names, its password ``Secret(file=...)``."""
    module, _, name = sink.partition(":")
    factory = getattr(importlib.import_module(module), name)
    built: TwoPhaseCommitSink[Any] = factory(password=Secret(file=password_file), **options)
    return built

