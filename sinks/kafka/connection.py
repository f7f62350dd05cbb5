"""How the sink reaches the cluster: :class:`KafkaSettings`, kafka-python and librdkafka clients.

The sink holds only settings (they are pickled to executors); clients are made where they are
used. The admin client (EndTxn, listing, describing: on the driver, in cleanup, and on an
executor before it takes a transactional id) is made at most once per process and settings and
kept: kafka-python's admin client is safe to call from several threads, and it reconnects by
itself to a broker that was down, backing off at most :data:`RECONNECT_BACKOFF_MAX_MS` between
tries; a call that finds every connection still backing off runs again for a few backoffs
(``tests/test_kafka_sink.py`` kills and restarts the broker under it), so a connection failure
is retried through the same client. Every admin call goes through
:meth:`KafkaSettings.with_admin`. It logs in again with
the password it was made with: should the brokers refuse it after the password's ``Secret``
changed (a rotation), :meth:`KafkaSettings.with_admin` makes it again with the new one
(:class:`twophase.kit.ClientCache`). kafka-python mostly reports a refused login as a
connection lost, or a bootstrap timed out, and never names the user: where a client fails so,
:meth:`KafkaSettings.login_checked` asks the brokers with one login of its own
(:mod:`~sinks.kafka.login`). The executor's
producer is librdkafka's (:mod:`~sinks.kafka.producer`): :meth:`KafkaSettings.librdkafka_configs`
translates the same settings to its property names, so both clients connect alike.

**Secrets.** ``sasl_plain_password`` and ``ssl_password`` take the clear text or a
:class:`twophase.Secret` (an environment variable or a file), revealed only in
:meth:`~KafkaSettings.client_configs` and :meth:`~KafkaSettings.librdkafka_configs`, i.e. when a
client is built: the settings (pickled to the executors) then hold the reference only. ``repr``
never shows either, and nothing logs them: kafka-python's admin client logs its whole
configuration at DEBUG, so that one record is dropped (:class:`_HideClientConfigs`);
librdkafka prints ``[redacted]`` for its secret properties. A sink made with
``connection=Secret(...)`` (every connection option in one JSON object a secret holds,
:func:`kafka_settings`) has for each of them a :class:`twophase.kit.SecretField`: that field of
what the Secret holds, read the same way at each connection, so a rotated secret's new password
is used (an admin client refused with the old one is made again).

**TLS** (:class:`twophase.kit.Tls`, every prebuilt sink's options; :func:`security_settings`).
A Kafka listener speaks one protocol, so ``tls`` is ``"off"`` unless given: ``tls="verify"``
(SSL, or SASL_SSL with ``sasl_mechanism``) makes both clients verify the brokers' certificate
chain (against ``ca_bundle``, else the system's CAs) and host name; ``tls="require"`` encrypts
without verifying either, and ``ssl_check_hostname=False`` skips the host name only. Neither client
says why a handshake failed (kafka-python times out "unable to bootstrap", librdkafka reports
a transport failure), so :meth:`~KafkaSettings.verify_tls` makes one handshake first, as they
would, and refuses a certificate they would refuse with a :class:`ConfigurationError` naming
the cause and the fix, before anything is written. ``client_cert``/``client_key`` (and
``ssl_password`` for an encrypted key) are the client certificate both clients present to a
listener with ``ssl.client.auth=required`` (mutual TLS). A broker refuses a missing or
untrusted one with a TLS alert that, in TLS 1.3, arrives only after the client's side of the
handshake is done: so the check also sends one ``ApiVersions`` request (which a broker answers
before any SASL login) and reads the answer, and the alert is classified by
:func:`sinks.kafka.errors.client_certificate_refused`.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import struct
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import kafka.errors as kerrors
from kafka import KafkaAdminClient, KafkaConsumer

from sinks.kafka.errors import (
    KAFKA_ERRORS,
    SYSTEM,
    classify,
    client_certificate_refused,
    login_in_question,
    no_connection_ready,
    refused_credentials,
)
from sinks.kafka.login import PASSWORD_MECHANISMS, refusal
from twophase import ConfigurationError, Secret
from twophase.kit import (
    ClientCache,
    ConnectionFields,
    SecretOption,
    Tls,
    TlsMode,
    classified,
    renamed_option,
    reveal,
)

T = TypeVar("T")
C = TypeVar("C")

log = logging.getLogger(__name__)

DEFAULT_REQUEST_TIMEOUT_MS = 30_000
#: How long a client tries to reach the cluster at all before it gives up.
DEFAULT_CONNECT_TIMEOUT_MS = 30_000
#: How long a producer waits for metadata (a topic, the cluster) before it gives up.
DEFAULT_MAX_BLOCK_MS = 30_000
#: The longest wait between reconnects to a broker that is down (the Java clients' default;
#: kafka-python's admin client would keep a broker that came back unused for up to 30 s).
RECONNECT_BACKOFF_MAX_MS = 1_000
#: How long an admin call waits for a connection out of its reconnect backoff (a few backoffs).
CONNECTION_READY_WAIT_S = 3 * RECONNECT_BACKOFF_MAX_MS / 1000
CONNECTION_READY_POLL_S = 0.1
#: Protocols that speak TLS (the others are plain text).
TLS_PROTOCOLS = frozenset({"SSL", "SASL_SSL"})
#: OpenSSL's verify codes of a certificate valid, but not for the name (or address) dialled.
HOST_MISMATCH_CODES = frozenset({62, 64})  # X509_V_ERR_HOSTNAME_MISMATCH, _IP_ADDRESS_MISMATCH
FIX_HOST_NAME = ("connect to the brokers by a name their certificate lists (bootstrap_servers= "
                 "and the brokers' advertised.listeners), or have the certificate issued for "
                 "this name; ssl_check_hostname=False turns the host-name check off (the "
                 "certificate chain is still verified)")
FIX_CA = ("pass ca_bundle= the PEM file of the CA that issued the brokers' certificates "
          "(without it, the system's CAs are trusted)")
#: The sink's former names of its TLS options, removed in 0.6.0.
FORMER_TLS_NAMES = {"ssl_cafile": "ca_bundle", "ssl_certfile": "client_cert",
                    "ssl_keyfile": "client_key"}
#: Every prebuilt sink's TLS options (:class:`twophase.kit.Tls`).
TLS_OPTION_NAMES = ("tls", "ca_bundle", "client_cert", "client_key")
#: What ``connection=`` may give: the sink's own connection options of these names (not the
#: former ``security_protocol``, ``ssl_cafile``, ``ssl_certfile``, ``ssl_keyfile``).
CONNECTION_OPTIONS = ("bootstrap_servers", *TLS_OPTION_NAMES, "sasl_mechanism",
                      "sasl_plain_username", "sasl_plain_password", "ssl_password",
                      "ssl_check_hostname", "client_id", "request_timeout_ms",
                      "connect_timeout_ms", "max_block_ms", "extra")
#: The secret ones: from ``connection=Secret(...)``, references read at every connection.
SECRET_OPTIONS = frozenset({"sasl_plain_password", "ssl_password"})
#: ``connection=``: the connection options as one value (:class:`twophase.kit.ConnectionFields`).
CONNECTION = ConnectionFields(SYSTEM, CONNECTION_OPTIONS, secrets=SECRET_OPTIONS)
FIX_NO_BROKERS = ("pass the brokers first, KafkaSink('broker1:9092,broker2:9092', 'orders'), "
                  "or as bootstrap_servers in connection=")

API_VERSIONS_KEY = 18
NULL_CLIENT_ID = -1
#: A request header v1: api key, api version, correlation id, client id's length.
_REQUEST_HEADER = struct.Struct(">hhih")
#: An ``ApiVersions`` v0 request (no body), its size first: brokers answer it before a SASL
#: login, so its answer shows whether the broker accepted the TLS session.
API_VERSIONS_REQUEST = (struct.pack(">i", _REQUEST_HEADER.size)
                        + _REQUEST_HEADER.pack(API_VERSIONS_KEY, 0, 0, NULL_CLIENT_ID))
#: The size field of a broker's answer.
ANSWER_SIZE_BYTES = 4

class _HideClientConfigs(logging.Filter):
    """Drops kafka-python's DEBUG record of a client's configuration (it holds passwords)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Starting KafkaAdminClient with configuration")


logging.getLogger("kafka.admin.client").addFilter(_HideClientConfigs())


@dataclass(frozen=True)
class KafkaSettings:
    """Bootstrap servers, security (password hidden from ``repr``), client id and timeouts.

    ``extra`` is passed to every kafka-python client as is (e.g. ``{"api_version_auto_timeout_ms":
    5000}``); it must not hold secrets, since it is shown by ``repr``.
    """

    bootstrap_servers: str
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_plain_username: str | None = None
    sasl_plain_password: SecretOption | None = field(default=None, repr=False)
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: SecretOption | None = field(default=None, repr=False)
    ssl_check_hostname: bool = True
    #: False: the brokers' certificate chain is not verified either (``tls="require"``).
    ssl_verify: bool = True
    client_id: str = "twophase"
    request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS
    connect_timeout_ms: int = DEFAULT_CONNECT_TIMEOUT_MS
    max_block_ms: int = DEFAULT_MAX_BLOCK_MS
    extra: tuple[tuple[str, Any], ...] = ()

    @property
    def where(self) -> str:
        """The cluster, as error messages name it."""
        return f"Kafka at {self.bootstrap_servers}"

    def client_configs(self) -> dict[str, Any]:
        """The options every kafka-python client takes (None values left to its defaults)."""
        configs: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers.split(","),
            "security_protocol": self.security_protocol,
            "sasl_mechanism": self.sasl_mechanism,
            "sasl_plain_username": self.sasl_plain_username,
            "sasl_plain_password": reveal(self.sasl_plain_password),
            "ssl_cafile": self.ssl_cafile,
            "ssl_certfile": self.ssl_certfile,
            "ssl_keyfile": self.ssl_keyfile,
            "ssl_password": reveal(self.ssl_password),
            "ssl_check_hostname": self.ssl_check_hostname and self.ssl_verify,
            "ssl_context": None if self.ssl_verify or not self.uses_tls else self.tls_context(),
            "client_id": self.client_id,
            "request_timeout_ms": self.request_timeout_ms,
            "bootstrap_timeout_ms": self.connect_timeout_ms,
            "reconnect_backoff_max_ms": RECONNECT_BACKOFF_MAX_MS,
        }
        return {key: value for key, value in configs.items() if value is not None} | dict(
            self.extra)

    def librdkafka_configs(self) -> dict[str, Any]:
        """The same settings as librdkafka properties (``extra`` is kafka-python's only)."""
        configs: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol.lower(),
            "sasl.mechanism": self.sasl_mechanism,
            "sasl.username": self.sasl_plain_username,
            "sasl.password": reveal(self.sasl_plain_password),
            "ssl.ca.location": self.ssl_cafile,
            "ssl.certificate.location": self.ssl_certfile,
            "ssl.key.location": self.ssl_keyfile,
            "ssl.key.password": reveal(self.ssl_password),
            "ssl.endpoint.identification.algorithm": "https" if self.ssl_check_hostname
            and self.ssl_verify else "none",
            "enable.ssl.certificate.verification": None if self.ssl_verify else "false",
            "client.id": self.client_id,
            "socket.timeout.ms": self.request_timeout_ms,
            "socket.connection.setup.timeout.ms": self.connect_timeout_ms,
            "topic.metadata.propagation.max.ms": self.max_block_ms,
        }
        return {key: value for key, value in configs.items() if value is not None}

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol.upper() in TLS_PROTOCOLS

    def consumer(self, **configs: Any) -> KafkaConsumer:
        return self._client(KafkaConsumer, enable_auto_commit=False, **configs)

    def new_admin(self) -> KafkaAdminClient:
        return self._client(KafkaAdminClient)

    def _client(self, kind: Callable[..., C], **configs: Any) -> C:
        """A kafka-python client of ``kind``, which bootstraps as it is made: TLS checked
        first (:meth:`verify_tls`), a failure classified, a refused login named as such
        (:meth:`login_checked`)."""
        self.verify_tls()
        common = self.client_configs()
        what = f"connecting to {self.where}"
        with classified(classify, what, KAFKA_ERRORS), \
                self.login_checked(common.get("sasl_plain_password"), what):
            return kind(**common, **configs)

    @contextlib.contextmanager
    def login_checked(self, password: str | None, what: str) -> Iterator[None]:
        """The block (``what``), run by a client that logs in with ``password``. Should it
        fail as if no broker could be reached, which is also how kafka-python reports a
        refused SASL login (:mod:`~sinks.kafka.login`), or as refused, one login of our own
        with that password tells: the brokers' refusal is raised as SASL_AUTHENTICATION_FAILED
        (a :class:`ConfigurationError` naming the user, caused by their answer, which
        :func:`~sinks.kafka.errors.refused_credentials` recognises)."""
        try:
            yield
        except Exception as error:
            refused = self._refusal(password) if login_in_question(error) else None
            if refused is None:
                raise
            raise classify(refused, what) from refused

    def _refusal(self, password: str | None) -> kerrors.SaslAuthenticationFailedError | None:
        """The brokers' answer to one login with ``password``: their refusal, or None (the
        login was accepted, the mechanism takes no password, or no broker answered).
        Nothing here fails: the error that made us ask stands unless the brokers refuse."""
        if self.sasl_mechanism not in PASSWORD_MECHANISMS or password is None:
            return None
        configs = {**self.client_configs(), "sasl_plain_password": password}
        for server in self.bootstrap_servers.split(","):
            host, port = _address(server)
            try:
                with self._connected(host, port) as sock:
                    return refusal(sock, host, configs)
            except (OSError, ValueError, kerrors.KafkaError):
                log.debug("no SASL login with %s", server, exc_info=True)
        return None

    @contextlib.contextmanager
    def _connected(self, host: str, port: int) -> Iterator[socket.socket]:
        """A socket to the broker at ``host:port`` as the clients open one: with TLS, the
        handshake made and the certificate verified (:meth:`tls_context`)."""
        with socket.create_connection((host, port), self.connect_timeout_ms / 1000) as plain:
            if not self.uses_tls:
                yield plain
                return
            with self.tls_context().wrap_socket(plain, server_hostname=host) as secured:
                yield secured

    def verify_tls(self) -> None:
        """With TLS, one handshake with a bootstrap broker as the clients make it: a
        certificate they would refuse raises :class:`ConfigurationError` naming the cause and
        the fix. A broker that cannot be reached is left to the clients (and their retries)."""
        if not self.uses_tls:
            return
        refused: ConfigurationError | None = None
        for server in self.bootstrap_servers.split(","):
            host, port = _address(server)
            try:
                with self._connected(host, port) as secured:
                    secured.sendall(API_VERSIONS_REQUEST)
                    secured.recv(ANSWER_SIZE_BYTES)
                    return
            except ssl.SSLCertVerificationError as error:
                refused = refused or _certificate_refused(server, error)
            except ssl.SSLError as error:
                alert = client_certificate_refused(server, error, self.ssl_certfile)
                if alert is None:
                    log.debug("TLS with %s failed", server, exc_info=True)
                refused = refused or alert
            except OSError:
                log.debug("no TLS handshake with %s", server, exc_info=True)
        if refused is not None:
            raise refused

    def tls_context(self) -> ssl.SSLContext:
        """What kafka-python verifies with: the CA file (else the system's), host names unless
        ``ssl_check_hostname=False``, nothing at all with ``tls="require"``, the client
        certificate if one is given."""
        context = ssl.create_default_context(cafile=self.ssl_cafile)
        context.check_hostname = self.ssl_check_hostname and self.ssl_verify
        if not self.ssl_verify:
            context.verify_mode = ssl.CERT_NONE
        if self.ssl_certfile is not None:
            context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile,
                                    password=reveal(self.ssl_password))
        return context

    @property
    def secrets(self) -> tuple[SecretOption | None, ...]:
        """The secret options a client is made with."""
        return (self.sasl_plain_password, self.ssl_password)

    def admin(self) -> KafkaAdminClient:
        """This process's admin client for these settings (made on first use, kept)."""
        return _admins.get(self)

    def with_admin(self, operation: Callable[[KafkaAdminClient], T], what: str) -> T:
        """``operation(admin)`` with this process's admin client; should the brokers refuse
        its login after the password's Secret changed (a rotation), the client is made again
        with the new one and ``operation`` runs once more."""
        what = f"{what} ({self.where})"
        return _admins.retried_if_rotated(self, lambda: self._on_admin(operation, what),
                                          refused_credentials, what=what)

    def _on_admin(self, operation: Callable[[KafkaAdminClient], T], what: str) -> T:
        """``operation`` on this process's admin client, a refused login named as such (the
        client logs in again with the password it was made with). Should it find no
        connection ready (the client waits out a reconnect backoff, as after a broker was
        down), it runs again for up to :data:`CONNECTION_READY_WAIT_S`: every admin operation
        may run again (commits and aborts prove what an earlier run did)."""
        deadline = time.monotonic() + CONNECTION_READY_WAIT_S
        while True:
            admin = self.admin()
            try:
                with self.login_checked(admin.config.get("sasl_plain_password"), what):
                    return operation(admin)
            except Exception as error:
                if not (no_connection_ready(error) and time.monotonic() < deadline):
                    raise
                log.info("%s: no broker connection is ready yet (reconnect backoff); trying "
                         "again", what)
                time.sleep(CONNECTION_READY_POLL_S)


_admins: ClientCache[KafkaSettings, KafkaAdminClient] = ClientCache(
    KafkaSettings.new_admin, lambda settings: settings.secrets, KafkaAdminClient.close)


def kafka_settings(connection: str | Secret | Mapping[str, Any] | None,
                   separate: Mapping[str, Any]) -> KafkaSettings:
    """The sink's settings from ``connection=`` (:data:`CONNECTION`: a mapping or a Secret
    holding a JSON object of :data:`CONNECTION_OPTIONS`; its passwords stay references) and
    its ``separate`` options (None: not given); an option given by both is refused."""
    options = CONNECTION.read(connection, separate)
    bootstrap_servers = options.pop("bootstrap_servers", None)
    if not bootstrap_servers:
        raise ConfigurationError(f"{SYSTEM}: no bootstrap_servers: neither the first argument "
                                 "nor connection= names the brokers.", fix=FIX_NO_BROKERS)
    tls, ca_bundle, client_cert, client_key = (options.pop(name, None)
                                               for name in TLS_OPTION_NAMES)
    if "extra" in options:
        options["extra"] = tuple(dict(options["extra"]).items())
    security = security_settings(tls, ca_bundle, client_cert, client_key, options)
    return KafkaSettings(bootstrap_servers, **options, **security)


#: A former option's warning points at the sink's caller: renamed_option, security_settings,
#: kafka_settings, KafkaSink.__init__, the caller.
FORMER_NAME_STACKLEVEL = 5


def security_settings(tls: TlsMode | None, ca_bundle: str | None, client_cert: str | None,
                      client_key: str | None, connection: dict[str, Any]) -> dict[str, Any]:
    """:class:`KafkaSettings`' protocol and TLS fields from the sink's TLS options and the SASL
    ones in ``connection`` (its former ``security_protocol``, ``ssl_cafile``, ``ssl_certfile``
    and ``ssl_keyfile``, taken out of it, warn until 0.6.0; a former ``security_protocol``
    decides the protocol)."""
    files = {"ca_bundle": ca_bundle, "client_cert": client_cert, "client_key": client_key}
    for former, name in FORMER_TLS_NAMES.items():
        files[name] = renamed_option(SYSTEM, former, connection.pop(former, None), name,
                                     files[name], stacklevel=FORMER_NAME_STACKLEVEL)
    protocol = renamed_option(
        SYSTEM, "security_protocol", connection.pop("security_protocol", None), "tls", None,
        same="tls='verify' for SSL and SASL_SSL, 'off' for PLAINTEXT and SASL_PLAINTEXT; "
             "SASL is sasl_mechanism=", stacklevel=FORMER_NAME_STACKLEVEL)
    if protocol is not None and tls is not None:
        raise ConfigurationError(f"{SYSTEM}: security_protocol= and tls= are both given.",
                                 fix="pass tls= alone (and sasl_mechanism= for SASL)")
    if protocol is not None:
        tls = "verify" if str(protocol).upper() in TLS_PROTOCOLS else "off"
    settings = Tls(tls or "off", files["ca_bundle"], files["client_cert"],
                   files["client_key"], SYSTEM)
    sasl = "SASL_" if connection.get("sasl_mechanism") is not None else ""
    return {"security_protocol": protocol or sasl + ("SSL" if settings.encrypts else "PLAINTEXT"),
            "ssl_cafile": settings.ca_bundle, "ssl_certfile": settings.client_cert,
            "ssl_keyfile": settings.client_key, "ssl_verify": settings.mode != "require"}


def _address(server: str) -> tuple[str, int]:
    """The host and port of one of ``bootstrap_servers`` (``host:port``)."""
    host, _, port = server.strip().rpartition(":")
    return host, int(port)


def _certificate_refused(server: str, error: ssl.SSLCertVerificationError) -> ConfigurationError:
    host_name = error.verify_code in HOST_MISMATCH_CODES
    cause = ("it is not issued for the name dialled" if host_name
             else "it is not issued by a CA this client trusts")
    return ConfigurationError(
        f"KafkaSink: TLS verification refuses the certificate of the broker at {server}: "
        f"{str(error.verify_message).rstrip('.')} ({cause}).",
        fix=FIX_HOST_NAME if host_name else FIX_CA)
