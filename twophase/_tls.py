"""TLS as every prebuilt sink spells it: ``tls=``, ``ca_bundle=``, ``client_cert=``,
``client_key=``.

================  ==========================================================================
option            meaning
================  ==========================================================================
``tls``           ``"verify"`` (the default): the server's certificate must come from a CA of
                  ``ca_bundle`` (the system's CA store if None) and name the host connected
                  to; ``"require"``: encrypted, the certificate not checked (a network you
                  trust); ``"off"``: plain text. Asked for and not offered is refused, never a
                  fall back to plain text.
``ca_bundle``     the PEM file of the CAs the server's certificate is verified against
``client_cert``   the client certificate the sink presents (PEM): mutual TLS
``client_key``    its key (PEM, unencrypted; in ``client_cert``'s file if None)
================  ==========================================================================

A system whose address already says whether it is encrypted (an ``https://`` URL, an S3
endpoint) reads ``tls`` for that address only: ``"off"`` there is refused for an ``https://``
one. The sinks' former spellings (``ssl_cert``, ``sslmode``, ``verify``, ``ssl_cafile``, ...)
still work until 0.6.0, each with a :class:`DeprecationWarning` (:func:`renamed_option`).
"""

from __future__ import annotations

import functools
import ssl
import warnings
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from twophase.errors import ConfigurationError

TlsMode = Literal["verify", "require", "off"]
TLS_MODES: tuple[TlsMode, ...] = ("verify", "require", "off")
#: Verify the certificate and the host name (MySQL's ``VERIFY_IDENTITY``, libpq's
#: ``verify-full``).
DEFAULT_TLS: TlsMode = "verify"
#: The TLS options of every prebuilt sink, in this order.
TLS_OPTIONS = ("tls", "ca_bundle", "client_cert", "client_key")
TLS_CONTEXTS_CACHED = 8
#: The release that removes the former spellings of the TLS options.
FORMER_NAMES_REMOVED_IN = "0.6.0"

T = TypeVar("T")


@dataclass(frozen=True)
class Tls:
    """How a sink's connections are secured (see the module docstring); refused at once if
    its options contradict each other, naming ``system`` (the sink)."""

    mode: TlsMode = DEFAULT_TLS
    ca_bundle: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    system: str = field(default="twophase", compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.mode not in TLS_MODES:
            raise ConfigurationError(f"{self.system}: unknown tls={self.mode!r}.",
                                     fix=f"use one of {TLS_MODES} ('verify' unless the network "
                                     "is trusted)")
        if self.ca_bundle is not None and self.mode != "verify":
            raise ConfigurationError(
                f"{self.system}: ca_bundle= is given but tls={self.mode!r} does not verify the "
                "server's certificate.", fix="use tls='verify' with ca_bundle=, or drop ca_bundle")
        if self.client_key is not None and self.client_cert is None:
            raise ConfigurationError(
                f"{self.system}: client_key= is given without client_cert=.",
                fix="pass client_cert= the client certificate of that key")
        if self.client_cert is not None and self.mode == "off":
            raise ConfigurationError(
                f"{self.system}: client_cert= is given but tls='off' sends no certificate.",
                fix="use tls='verify' (the default) with client_cert= and client_key=")

    @property
    def encrypts(self) -> bool:
        return self.mode != "off"

    @property
    def verifies(self) -> bool:
        return self.mode == "verify"

    def describe(self) -> str:
        """The TLS options, as error messages name them (paths, never key contents)."""
        if self.mode == "off":
            return "tls='off'"
        client = ("no client certificate" if self.client_cert is None
                  else f"client_cert={self.client_cert!r}")
        return f"tls={self.mode!r}, {client}"

    def context(self) -> ssl.SSLContext:
        """The process's one client context for these settings (thread-safe to share)."""
        return tls_context(self.mode, self.ca_bundle, self.client_cert, self.client_key,
                           self.system)


@functools.lru_cache(maxsize=TLS_CONTEXTS_CACHED)
def tls_context(mode: TlsMode, ca_bundle: str | None, client_cert: str | None = None,
                client_key: str | None = None, system: str = "twophase") -> ssl.SSLContext:
    """A client context for ``mode``, ``ca_bundle`` and the client certificate with its key if
    given, made once per process and settings (loading the system's CA store costs about
    30 ms of CPU).

    ``verify`` drops OpenSSL's X509_STRICT checks, as PyMySQL and libpq do: certificates that
    servers generate themselves often lack extensions only strict mode asks for.
    """
    context = ssl.create_default_context(cafile=ca_bundle if mode == "verify" else None)
    context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    if mode == "require":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if client_cert is not None:
        try:
            context.load_cert_chain(client_cert, client_key)
        except (OSError, ssl.SSLError) as error:
            raise ConfigurationError(
                f"{system}: cannot load the client certificate client_cert={client_cert!r} "
                f"with its key client_key={client_key!r}: {error}.",
                fix="pass client_cert= and client_key= readable PEM files of one key pair "
                    "(the key unencrypted)") from error
    return context


def renamed_option(owner: str, former: str, former_value: T | None, name: str,
                   value: T | None, *, same: str = "the same value", stacklevel: int = 3
                   ) -> T | None:
    """The value of option ``name``, given as ``value`` or by its former name ``former`` (which
    warns, naming the new one, until :data:`FORMER_NAMES_REMOVED_IN`); both given is refused.
    ``stacklevel`` as :func:`warnings.warn`'s, counted from here (3: the caller of the sink's
    constructor that calls this)."""
    if former_value is None:
        return value
    if value is not None:
        raise ConfigurationError(f"{owner}: {former}= and {name}= are both given.",
                                 fix=f"pass {name}= alone ({former}= is its former name)")
    warnings.warn(f"{owner}({former}=) is deprecated and is removed in "
                  f"{FORMER_NAMES_REMOVED_IN}: pass {name}= ({same})", DeprecationWarning,
                  stacklevel=stacklevel)
    return former_value


def refuse_plain_text_over_https(tls: Tls, address: str) -> None:
    """``tls='off'`` for an address that is encrypted by its scheme is a contradiction."""
    if tls.mode == "off" and address.lower().startswith("https://"):
        raise ConfigurationError(
            f"{tls.system}: tls='off' but {address!r} is an https:// address.",
            fix="use an http:// address for plain text, or tls='verify' (the default)")
