"""Secrets given by reference: read where they are used, never carried in clear.

Every secret option of a sink (a password, a SASL password, a bearer token, a signing secret,
an AWS secret key or session token) takes either the clear text or a :class:`Secret`: the name
of an environment variable or of a file holding it. A reference is what is pickled to the
executors, written in a cleanup config, shown by ``repr``; the clear text is read by
:func:`reveal` in the process that opens the connection, when it opens it, so a rotated
password file is read again by the next connection.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

from twophase.errors import ConfigurationError, TwoPhaseError

#: What stands for a secret removed from a message.
REDACTED = "***"
#: How a reference is written in a config file (TOML ``{ env = "DB_PASSWORD" }``).
REFERENCE_KEYS = frozenset({"env", "file"})


@dataclass(frozen=True)
class Secret:
    """A secret read from ``$env`` or from ``file`` (its content, without the final newline)."""

    env: str | None = None
    file: str | None = None

    def __post_init__(self) -> None:
        if (self.env is None) == (self.file is None):
            raise ConfigurationError("a Secret names an environment variable or a file.",
                                     fix="write Secret(env='NAME') or Secret(file='/path')")

    def reveal(self) -> str:
        """The clear text, read now; an unset variable or unreadable file is a clear error."""
        if self.env is not None:
            if self.env not in os.environ:
                raise ConfigurationError(f"the secret's variable ${self.env} is not set in this "
                                         "process.", fix=f"export {self.env} wherever the "
                                         "query's driver and executors run")
            return os.environ[self.env]
        assert self.file is not None
        try:
            return Path(self.file).read_text().removesuffix("\n")
        except OSError as error:
            raise ConfigurationError(f"the secret's file {self.file} cannot be read "
                                     f"({type(error).__name__}: {error.strerror}).",
                                     fix="mount the file where the query's driver and executors "
                                     "run, readable by their user") from None

    @classmethod
    def of(cls, written: Mapping[str, Any]) -> Secret:
        """A reference as a config file writes it: ``{"env": NAME}`` or ``{"file": PATH}``."""
        if len(written) != 1 or not set(written) <= REFERENCE_KEYS:
            raise ConfigurationError(f"a secret reference has one key, env or file, not "
                                     f"{sorted(written)}.", fix='write { env = "NAME" } or '
                                     '{ file = "/path" }')
        return cls(**{str(key): str(value) for key, value in written.items()})


#: The type of a secret option: the clear text or a reference to it.
SecretOption: TypeAlias = "str | Secret"


def reveal(value: str | Secret | None) -> str | None:
    """The clear text of a secret option (``None`` stays ``None``)."""
    return value.reveal() if isinstance(value, Secret) else value


def is_reference(value: object) -> bool:
    """Whether a config value is written as a secret reference (``{ env = ... }``, ...)."""
    return isinstance(value, Mapping) and bool(value) and set(value) <= REFERENCE_KEYS


def resolved(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with every reference (``{"env": NAME}``, ``{"file": PATH}``) read, also
    inside nested tables (a sink group's members' options): for the operator's tools, which
    take a sink's options from a config file or the command line."""
    return {key: _resolved(value) for key, value in options.items()}


def _resolved(value: Any) -> Any:
    if is_reference(value):
        return Secret.of(value).reveal()
    return resolved(value) if isinstance(value, Mapping) else value


def scrubbed(classify: Callable[[BaseException, str], TwoPhaseError], secret: str | None
             ) -> Callable[[BaseException, str], TwoPhaseError]:
    """``classify`` (a sink's error table) whose errors never show ``secret`` (the password a
    connection just used): it is replaced by :data:`REDACTED` in the error, and in the
    driver's exception the error is chained to. No driver is known to put a password in a
    message; this holds should one ever do."""
    if not secret:
        return classify

    def classify_scrubbed(exc: BaseException, what: str) -> TwoPhaseError:
        exc.args = tuple(arg.replace(secret, REDACTED) if isinstance(arg, str) else arg
                         for arg in exc.args)
        error = classify(exc, what)
        if secret not in str(error):
            return error
        return type(error)(error.cause.replace(secret, REDACTED),
                           fix=(error.fix or "").replace(secret, REDACTED) or None)
    return classify_scrubbed
