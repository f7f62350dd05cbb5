"""How the sink reaches NATS: :class:`NatsSettings` (picklable, credentials by reference and out
of ``repr``) and :func:`run`, one step of a phase on a connection of its own.

nats-py is asyncio. Every phase (an executor's staging, the driver's settle, an abort, a
listing) runs in the calling thread on an event loop of its own (``asyncio.run``): a fresh
connection, the step, the connection closed. No loop or connection is ever shared between
threads or kept on the sink object, which is pickled to executors. A connection that fails is
not retried here: the error is classified (:mod:`~sinks.nats.errors`) and twophase retries the
phase.

Credentials, one kind at a time: ``user`` + ``password``, ``token``, ``nkeys_seed`` (the seed's
text, ``SU...``) or ``creds_file`` (a ``.creds`` file: the user JWT and its seed); the secret
ones may be :class:`~twophase.Secret` references, read when a connection opens and never
logged. TLS is every prebuilt sink's (:class:`~twophase.kit.Tls`): verified by default; a
server that does not offer TLS when it was asked for is refused, never a fall back to plain
text.

No credential in plain text: nats-py upgrades a connection to TLS only when the server's INFO
says ``tls_required``, and otherwise writes CONNECT, with the password or token, in plain
text. A connection that asks for TLS is therefore made by :class:`TlsOnlyClient`, which refuses
such an INFO as it reads it, before anything is written (nats-server 2.9 has no TLS-first
handshake, ``tls_handshake_first``, which would make that moot: 2.10 does).

Permissions: nats-server refuses a publish or a subscription the user may not make with an
``-ERR`` that nats-py only reports to its error callback, while the refused request waits for
its timeout. The callback records the first refusal and :meth:`NatsSettings.run` stops the step
at once with a :class:`ConfigurationError` naming the permission to grant, from the sink's one
list (:func:`sinks.nats.access.permissions`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from nats.aio.client import Client
from nats.js import JetStreamContext

from sinks.nats.access import Permissions
from sinks.nats.errors import (
    NATS_ERRORS,
    SYSTEM,
    classify,
    is_permissions_violation,
    permission_denied,
)
from twophase import ConfigurationError
from twophase.kit import SecretOption, Tls, classified, reveal

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_CONNECT_TIMEOUT_S = 5.0
#: How long one JetStream request (a publish's ack, an API call) may take.
DEFAULT_REQUEST_TIMEOUT_S = 10.0
#: How the sink's connections name themselves to the server (its connection list, ``/connz``).
CLIENT_NAME = "twophase-jetstream-sink"
#: How long closing a connection that failed to open may wait: after a failed TLS handshake
#: nats-py's wait for its socket to close never returns (asyncio closed it already, under
#: the TLS protocol that replaced the one nats-py waits on).
CLOSE_FAILED_TIMEOUT_S = 0.25
#: A URL scheme whose transport is TLS from its first byte (a WebSocket over TLS).
TLS_FIRST_SCHEMES = frozenset({"wss"})
#: A URL scheme nats-py never upgrades to TLS, whatever the INFO says (a plain WebSocket).
NEVER_UPGRADED_SCHEMES = frozenset({"ws"})


@dataclass(frozen=True)
class Connection:
    """An open connection and its JetStream context, for one step; ``denied`` is done once the
    server refused the user a publish or a subscription (nats-py's error, as reported)."""

    client: Client
    js: JetStreamContext
    denied: asyncio.Future[Exception]


class TlsOnlyClient(Client):
    """nats-py's client that refuses a server whose INFO does not require TLS, before it writes
    CONNECT (so no credential leaves in plain text): ``refusal()`` is raised, and reaches the
    caller of ``connect`` (whose loop retries only nats-py's own errors and OSError)."""

    def __init__(self, refusal: Callable[[], ConfigurationError]) -> None:
        super().__init__()
        self._refusal = refusal

    async def _process_info(self, info: dict[str, Any], initial_connection: bool = False
                            ) -> None:
        """nats-py calls this with the server's first INFO (``initial_connection``) after
        reading it and before upgrading to TLS or writing CONNECT."""
        scheme = self._current_server.uri.scheme if self._current_server else ""
        upgraded = bool(info.get("tls_required")) and scheme not in NEVER_UPGRADED_SCHEMES
        if initial_connection and not upgraded and scheme not in TLS_FIRST_SCHEMES:
            raise self._refusal()
        await super()._process_info(info, initial_connection)


@dataclass(frozen=True)
class NatsSettings:
    """Where and how the sink connects (see the module docstring)."""

    servers: tuple[str, ...]
    tls: Tls
    user: str | None = None
    password: SecretOption | None = None
    token: SecretOption | None = None
    nkeys_seed: SecretOption | None = None
    creds_file: str | None = None
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    #: What the user must be allowed (:func:`sinks.nats.access.permissions`): a refused
    #: permission is named from it.
    permissions: Permissions | None = None

    def __post_init__(self) -> None:
        kinds = [name for name, value in (("password", self.password), ("token", self.token),
                                          ("nkeys_seed", self.nkeys_seed),
                                          ("creds_file", self.creds_file)) if value is not None]
        if len(kinds) > 1:
            raise ConfigurationError(
                f"{SYSTEM}: {' and '.join(kinds)} are given together: a connection "
                "authenticates one way.", fix="pass one of user=+password=, token=, "
                "nkeys_seed= or creds_file=")
        if (self.user is None) != (self.password is None):
            raise ConfigurationError(f"{SYSTEM}: user= and password= go together.",
                                     fix="pass both, or neither")
        if not self.servers:
            raise ConfigurationError(f"{SYSTEM}: no servers= given.",
                                     fix="pass servers='nats://host:4222' (or a list)")

    def __repr__(self) -> str:
        return f"NatsSettings({self.where}, {self.tls.describe()}, user={self.user!r})"

    @property
    def where(self) -> str:
        """The servers, as messages name them (no credentials)."""
        return ",".join(self.servers)

    def connect_options(self) -> dict[str, Any]:
        """nats-py's ``connect`` options, the secrets read now (the error callback is each
        connection's own: :meth:`connected`)."""
        options: dict[str, Any] = {
            "servers": list(self.servers), "connect_timeout": self.connect_timeout_s,
            "allow_reconnect": False, "name": CLIENT_NAME}
        if self.tls.encrypts:
            options["tls"] = self.tls.context()
        if self.user is not None:
            options.update(user=self.user, password=reveal(self.password))
        if self.token is not None:
            options["token"] = reveal(self.token)
        if self.nkeys_seed is not None:
            options["nkeys_seed_str"] = reveal(self.nkeys_seed)
        if self.creds_file is not None:
            options["user_credentials"] = self.creds_file
        return options

    @contextlib.asynccontextmanager
    async def connected(self) -> AsyncIterator[Connection]:
        """A connection of this step's own, closed after it (and after a failed connect: the
        socket of a refused server too)."""
        denied: asyncio.Future[Exception] = asyncio.get_running_loop().create_future()

        async def on_error(error: Exception) -> None:
            """nats-py's asynchronous error callback: a refused permission is recorded, the
            rest raised by the failing call too (classified there)."""
            log.debug("nats-py reported %s: %s", type(error).__name__, error)
            if is_permissions_violation(error) and not denied.done():
                denied.set_result(error)

        client = TlsOnlyClient(self.plain_text_refused) if self.tls.encrypts else Client()
        try:
            await client.connect(**self.connect_options(), error_cb=on_error)
        except BaseException:
            await _close_failed(client)
            raise
        try:
            yield Connection(client, client.jetstream(timeout=self.request_timeout_s), denied)
        finally:
            await client.close()

    def plain_text_refused(self) -> ConfigurationError:
        """The refusal of a server that does not require TLS when ``tls`` asks for it."""
        return ConfigurationError(
            f"{SYSTEM}: the server at {self.where} does not offer TLS, but "
            f"{self.tls.describe()} asks for it: refusing to send credentials or rows in "
            "plain text (nothing was sent).",
            fix="turn TLS on in nats-server (tls { cert_file, key_file }), or pass "
                "tls='off' where the network is trusted")

    def run(self, what: str, step: Callable[[Connection], Awaitable[T]]) -> T:
        """``step`` on a fresh connection (that fails fast: twophase retries the phase), on an
        event loop of its own in this thread; nats-py's errors classified as failures of
        ``what``, a permission the server refused as a ConfigurationError naming it."""
        async def on_connection() -> T:
            async with self.connected() as connection:
                work = asyncio.ensure_future(step(connection))
                await asyncio.wait((work, connection.denied),
                                   return_when=asyncio.FIRST_COMPLETED)
                if connection.denied.done():
                    work.cancel()
                    await asyncio.gather(work, return_exceptions=True)
                    raise permission_denied(connection.denied.result(), what,
                                            self.permissions)
                return work.result()

        with classified(classify, what, NATS_ERRORS):
            return asyncio.run(on_connection())


async def _close_failed(client: Client) -> None:
    """Close a client whose connect failed, waiting at most :data:`CLOSE_FAILED_TIMEOUT_S`."""
    try:
        await asyncio.wait_for(client.close(), CLOSE_FAILED_TIMEOUT_S)
    except TimeoutError:
        log.debug("a failed connection's close did not finish within %ss; its socket is "
                  "closed", CLOSE_FAILED_TIMEOUT_S)
