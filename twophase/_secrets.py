"""Secrets given by reference: read where they are used, never carried in clear.

Every secret option of a sink (a password, a SASL password, a bearer token, a signing secret,
an AWS secret key or session token) takes either the clear text or a :class:`Secret`: the name
of an environment variable or of a file holding it. A reference is what is pickled to the
executors, written in a cleanup config, shown by ``repr``; the clear text is read by
:func:`reveal` in the process that opens the connection, when it opens it, so a rotated
password file is read again by the next connection.

Rotation: a client made once and kept (Kafka's admin client, an S3 client) holds the clear text
it was made with, and a connection attempt may read a secret just before it is rotated. Where
the server refuses the credentials, :func:`retried_if_rotated` reads the secret again and, if it
changed, drops what was made with the old one (:class:`ClientCache`) and tries once more: a
decided batch commits with the new password or key without a restart. Each sink's errors module
says which of its errors are such a refusal (``refused_credentials``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeAlias, TypeVar

from twophase.errors import ConfigurationError, TwoPhaseError

log = logging.getLogger(__name__)

T = TypeVar("T")
K = TypeVar("K")
C = TypeVar("C")

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


# -- rotation: a secret changed under a client that still uses the old one ---------------------

#: Whether a system's error (a driver's, or the one a twophase error was classified from) says
#: the server refused the credentials: each sink's errors module has one.
Refused = Callable[[BaseException], bool]


class Credentials:
    """What a connection's or client's secret options read when it was made: a digest of their
    clear texts (never the clear texts), to tell whether they were rotated since."""

    def __init__(self, *options: SecretOption | None) -> None:
        self._options = options
        self._digest = _digest(options)

    def __eq__(self, other: object) -> bool:
        """Read the same secrets (a client made with either was made with the same ones)."""
        return isinstance(other, Credentials) and other._digest == self._digest

    def __hash__(self) -> int:
        return hash(self._digest)

    def rotated(self) -> bool:
        """Whether the options read differently now (an unreadable one counts as unchanged:
        the refusal then stands, naming the credentials to fix)."""
        try:
            return _digest(self._options) != self._digest
        except ConfigurationError:
            return False


def _digest(options: tuple[SecretOption | None, ...]) -> bytes:
    digest = hashlib.sha256()
    for option in options:
        digest.update((reveal(option) or "").encode())
        digest.update(b"\0")
    return digest.digest()


def refused_by(refused: Refused, exc: BaseException) -> bool:
    """``refused`` on ``exc`` or, for a twophase error, on the system's error it came from."""
    cause = exc.__cause__ if isinstance(exc, TwoPhaseError) else exc
    return cause is not None and refused(cause)


def retried_if_rotated(attempt: Callable[[], T], credentials: Callable[[], Credentials],
                       refused: Refused, *, what: str,
                       renew: Callable[[Credentials], object] = lambda _used: None) -> T:
    """``attempt()``; should the server refuse the credentials it used (``credentials()``,
    taken first) while their secret has changed since (a rotated password or key, its new
    value in the ``Secret``'s file or variable), ``renew(used)`` drops what was made with the
    old one, and ``attempt()`` runs once more. Any other failure, or a refusal of a secret that
    did not change, stands as raised (a :class:`ConfigurationError` naming the fix)."""
    used = credentials()
    try:
        return attempt()
    except Exception as exc:
        if not (refused_by(refused, exc) and used.rotated()):
            raise
        log.warning("%s: the credentials were refused and their secret has changed since they "
                    "were read: retrying once with the new one", what)
        renew(used)
    return attempt()


class ClientCache(Generic[K, C]):
    """A process's clients made with secrets, one per key (settings), each kept with the
    :class:`Credentials` it was made with: :meth:`retried_if_rotated` drops and makes again
    the one whose secret was rotated (thread-safe; a forked process makes its own)."""

    def __init__(self, make: Callable[[K], C],
                 secrets: Callable[[K], tuple[SecretOption | None, ...]],
                 close: Callable[[C], object] = lambda _client: None) -> None:
        self._make, self._secrets, self._close = make, secrets, close
        self._clients: dict[tuple[int, K], tuple[C, Credentials]] = {}
        self._lock = threading.Lock()

    def __iter__(self) -> Iterator[K]:
        """The keys of this process's clients (settings: references, never clear texts)."""
        with self._lock:
            return iter([key for pid, key in self._clients if pid == os.getpid()])

    def get(self, key: K) -> C:
        """The client of ``key`` (made now if there is none)."""
        return self._entry(key)[0]

    def drop(self, key: K, made_with: Credentials | None = None) -> None:
        """Forget and close the client of ``key`` (only if it was made with ``made_with``, if
        given: one made since is kept)."""
        with self._lock:
            entry = self._clients.get((os.getpid(), key))
            if entry is None or made_with not in (None, entry[1]):
                return
            del self._clients[(os.getpid(), key)]
        self._close(entry[0])

    def retried_if_rotated(self, key: K, attempt: Callable[[], T], refused: Refused, *,
                           what: str) -> T:
        """``attempt()`` (which uses :meth:`get`), once more with a new client if the server
        refused the credentials of ``key``'s client and their secret was rotated since it was
        made (:func:`retried_if_rotated`)."""
        return retried_if_rotated(attempt, lambda: self._credentials(key), refused, what=what,
                                  renew=lambda used: self.drop(key, made_with=used))

    def _credentials(self, key: K) -> Credentials:
        """Those of ``key``'s client, or, with none yet, those the next one will be made with
        (read now: a client whose making is refused is retried too)."""
        with self._lock:
            entry = self._clients.get((os.getpid(), key))
        return entry[1] if entry is not None else Credentials(*self._secrets(key))

    def _entry(self, key: K) -> tuple[C, Credentials]:
        with self._lock:
            entry = self._clients.get((os.getpid(), key))
            if entry is None:
                credentials = Credentials(*self._secrets(key))  # read first: never newer
                entry = self._clients[(os.getpid(), key)] = (self._make(key), credentials)
            return entry
