"""The sink kit for a database sink: connections its committer's threads share, and the keyed
mode applied in SQL.

================================  =============================================================
piece                             what it does
================================  =============================================================
:class:`ConnectionPool`           connections a committer's threads share (up to
                                  ``commit_parallelism`` of them), one thread at a time each
:class:`PooledCommitter`          a :class:`~twophase.Committer` whose threads borrow pooled
                                  sessions, errors classified: a database sink's committer
:func:`keyed_apply_statements`    the keyed mode (:class:`twophase.kit.Keyed`) for a publisher
                                  in SQL: reduce, drop what is not newer than the row or the
                                  tombstone, delete and keep tombstones, upsert with the
                                  version guard (see :mod:`twophase._keyed`)
:func:`tombstone_table_name`      the tombstone table's name within a system's limit, its time
                                  column :data:`TOMBSTONE_TIME_COLUMN`
:class:`ConnectionUrl`            a system's ``connection=`` option (:data:`ConnectionOption`):
                                  one value for where and how to connect, a URL
                                  (``mysql://user@host/db?tls=verify``), a
                                  :class:`~twophase.Secret` holding one, or a mapping of the
                                  separate options, read into :class:`ConnectionSettings`; a
                                  Secret's password stays a reference (:class:`UrlPassword`)
================================  =============================================================

A connection's mapping and its refusals beside the separate options are read by the one reader
every sink's ``connection=`` has, :class:`twophase.kit.ConnectionFields` (the Kafka and S3
sinks': a mapping or a Secret holding a JSON object); :class:`UrlPassword` is a
:class:`twophase.kit.SecretPart`, as a JSON secret's field is.

``__all__`` is this family's public API. Until 0.6.0 each name also imports from
:mod:`twophase.kit` (where the flat kit had it), with a :class:`DeprecationWarning` naming this
module.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeAlias, TypeVar
from urllib.parse import SplitResult, unquote, urlsplit

from twophase._classify import Classify, classified
from twophase._keyed import TOMBSTONE_TIME_COLUMN, keyed_apply_statements, tombstone_table_name
from twophase._secrets import Secret, SecretOption
from twophase._tls import DEFAULT_TLS, TLS_OPTIONS, TlsMode
from twophase.errors import ConfigurationError
from twophase.kit import ConnectionFields, SecretPart
from twophase.sink import DEFAULT_COMMIT_PARALLELISM, Committer

__all__ = [
    "TOMBSTONE_TIME_COLUMN",
    "ConnectionOption",
    "ConnectionPool",
    "ConnectionSettings",
    "ConnectionUrl",
    "PooledCommitter",
    "UrlPassword",
    "keyed_apply_statements",
    "tombstone_table_name",
]

C = TypeVar("C")


class ConnectionPool(Generic[C]):
    """Connections that one committer's threads share: each is lent to one thread at a time.

    The driver commits a batch's handles from up to ``commit_parallelism`` threads through one
    committer; with a pool, a batch of N handles opens about ``min(N, commit_parallelism)``
    connections instead of N. A connection goes back only if the block that borrowed it ended
    without an error (an error may leave a transaction open or the connection broken: it is
    closed), at most ``max_idle`` are kept, and none is lent again after ``max_idle_s`` idle
    (the server may have ended it) or once ``usable`` says it is closed. Thread-safe::

        pool = ConnectionPool(server.connect, close=close_quietly, usable=lambda c: not c.closed)
        with pool.connection() as conn:
            ...
        pool.close()
    """

    def __init__(self, connect: Callable[[], C], *, close: Callable[[C], None],
                 usable: Callable[[C], bool] = lambda _conn: True,
                 max_idle: int = DEFAULT_COMMIT_PARALLELISM,
                 max_idle_s: float | None = None) -> None:
        self._connect, self._close_one, self._usable = connect, close, usable
        self._max_idle, self._max_idle_s = max_idle, max_idle_s
        self._idle: list[tuple[C, float]] = []
        self._lock = threading.Lock()
        self._closed = False

    @contextlib.contextmanager
    def connection(self) -> Iterator[C]:
        """A connection of the pool (or a new one) for the block; given back if it ends well."""
        conn = self._take()
        if conn is None:
            conn = self._connect()
        try:
            yield conn
        except BaseException:
            self._close_one(conn)
            raise
        self._give_back(conn)

    def close(self) -> None:
        """Close every idle connection; connections lent now are closed when given back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn, _since in idle:
            self._close_one(conn)

    def _take(self) -> C | None:
        stale = []
        try:
            with self._lock:
                while self._idle:
                    conn, since = self._idle.pop()
                    if self._usable(conn) and (self._max_idle_s is None
                                               or time.monotonic() - since < self._max_idle_s):
                        return conn
                    stale.append(conn)
            return None
        finally:
            for conn in stale:
                self._close_one(conn)

    def _give_back(self, conn: C) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle and self._usable(conn):
                self._idle.append((conn, time.monotonic()))
                return
        self._close_one(conn)


class PooledCommitter(Committer, Generic[C]):
    """A committer whose threads borrow sessions of one :class:`ConnectionPool`, any error in
    a session classified by the sink's ``classify`` naming the step (``where(what)``)::

        class MyCommitter(PooledCommitter[Connection]):
            def __init__(self, sink):
                super().__init__(sink, sink.server.pool(sink.commit_parallelism), classify,
                                 driver.Error, sink.server.on)

            def commit(self, handle):
                with self.session(f"commit of {handle.txn_id}") as conn:
                    ...
    """

    def __init__(self, sink: Any, pool: ConnectionPool[C], classify: Classify,
                 errors: type[BaseException] | tuple[type[BaseException], ...],
                 where: Callable[[str], str] = lambda what: what) -> None:
        super().__init__(sink)
        self._pool, self._classify, self._errors, self._where = pool, classify, errors, where

    @contextlib.contextmanager
    def session(self, what: str) -> Iterator[C]:
        """A pooled session for one step; errors inside are classified."""
        with classified(self._classify, self._where(what), self._errors), \
                self._pool.connection() as conn:
            yield conn

    def close(self) -> None:
        self._pool.close()


# -- connection=: where and how to connect as one value -----------------------------------------

#: A database sink's ``connection=``: a URL (``mysql://user@host/db?tls=verify``), a
#: :class:`~twophase.Secret` holding one, or a mapping of the sink's separate options.
ConnectionOption: TypeAlias = "str | Secret | Mapping[str, Any]"
#: What a connection URL's query may give: the sink's own options of these names.
URL_QUERY_OPTIONS = (*TLS_OPTIONS, "connect_timeout_s")
#: The keys a connection mapping may have: the sink's separate options of these names.
CONNECTION_OPTIONS = ("host", "port", "user", "password", "database", *URL_QUERY_OPTIONS)
#: What may come beside ``connection=`` where it gives none: a password (credentials apart)
#: and the connect timeout.
APART_OPTIONS = frozenset({"password", "connect_timeout_s"})
#: How to write what a URL cannot hold as it is.
PERCENT_ENCODE = ("percent-encode '@', ':', '/', '?' and '#' in the user and password (%40, %3A, "
                  "%2F, %3F, %23)")


@dataclass(frozen=True)
class UrlPassword(SecretPart):
    """The password part of the connection URL that the secret (``env=`` or ``file=``) holds:
    what a sink made with ``connection=Secret(...)`` keeps as its password. A reference, as a
    ``Secret`` is: pickled, shown and read again at every connection (the URL's other parts are
    read once, as the sink is made), so a rotated URL's new password is used, and a refused
    login is retried once if this part changed (:func:`twophase.kit.retried_if_rotated`).
    Empty if the URL has none."""

    def part(self, held: str) -> str:
        """The URL's password, percent-decoded (empty if it has none)."""
        split = _split(held, "twophase", f"the connection URL in {self.whole}")
        return "" if split.password is None else unquote(split.password)


@dataclass(frozen=True)
class ConnectionSettings:
    """Where and how a database sink connects, from its ``connection=`` or its separate options;
    ``password`` is the clear text, a :class:`~twophase.Secret` or, from a Secret's URL, a
    :class:`UrlPassword` (never the Secret's clear text)."""

    host: str
    port: int
    user: str
    password: SecretOption | None = field(repr=False)
    database: str
    tls: TlsMode
    ca_bundle: str | None
    client_cert: str | None
    client_key: str | None
    connect_timeout_s: float
    #: The Secret whose URL these settings were read from (``repr`` names it, not them).
    secret: Secret | None = None

    def shown(self) -> str:
        """The settings as a sink's ``repr`` shows them: never a password's clear text; read
        from a Secret, that reference (``connection=Secret(env='ORDERS_DB', file=None)``)."""
        if self.secret is None:
            return (f"host={self.host!r}, port={self.port}, user={self.user!r}, "
                    f"password={_shown(self.password)}, database={self.database!r}")
        if self.password is None or isinstance(self.password, UrlPassword):
            return f"connection={self.secret}"
        return f"connection={self.secret}, password={_shown(self.password)}"


def _shown(password: SecretOption | None) -> str:
    """A password as ``repr`` shows it: a reference as it is, the clear text never."""
    if password is None or isinstance(password, Secret):
        return str(password)
    return "'***'"


@dataclass(frozen=True)
class ConnectionUrl:
    """A system's ``connection=``: its URL schemes (the first is the one messages write), its
    default port and connect timeout, and the sink's name, which its messages begin with.

    :meth:`settings` reads ``connection=`` or, without it, the sink's separate options, into
    :class:`ConnectionSettings`. A URL is libpq's URI form, ``scheme://user[:password]@host
    [:port]/database[?option=value&...]``, user and password percent-decoded, and its query
    gives the sink's own options of :data:`URL_QUERY_OPTIONS` (``tls``, ``ca_bundle``,
    ``client_cert``, ``client_key``, ``connect_timeout_s``), nothing else. No message quotes a
    URL: it may hold a password.
    """

    system: str
    schemes: tuple[str, ...]
    default_port: int
    default_connect_timeout_s: float

    @property
    def example(self) -> str:
        """A URL of this system, as a fix writes it."""
        return f"'{self.schemes[0]}://user@host:{self.default_port}/database?tls=verify'"

    @property
    def fields(self) -> ConnectionFields:
        """What a mapping may give and what may come beside a connection (the kit's one
        reading of ``connection=``'s options, :class:`twophase.kit.ConnectionFields`)."""
        return ConnectionFields(
            self.system, CONNECTION_OPTIONS, secrets=frozenset({"password"}),
            beside=APART_OPTIONS, form=f"a URL's host, port, user, database and query, "
            f"{self.example}, or a mapping's keys")

    def settings(self, connection: ConnectionOption | None, *, host: str | None = None,
                 port: int | None = None, user: str | None = None,
                 password: SecretOption | None = None, database: str | None = None,
                 tls: TlsMode | None = None, ca_bundle: str | None = None,
                 client_cert: str | None = None, client_key: str | None = None,
                 connect_timeout_s: float | None = None,
                 also: Mapping[str, object] | None = None) -> ConnectionSettings:
        """The settings of ``connection=`` or, if it is None, of the separate options (None:
        not given). Beside ``connection=``, which holds them whole, ``host``, ``port``,
        ``user``, ``database`` and the TLS options (and ``also``: a former spelling of one) are
        refused, naming them, and so are ``password=`` and ``connect_timeout_s=`` if the
        connection gives them too. A Secret's URL is read now
        (the default namespace names its database); its password stays a reference
        (:class:`UrlPassword`) unless ``password=`` gives one apart."""
        separate = {"host": host, "port": port, "user": user, "database": database, "tls": tls,
                    "ca_bundle": ca_bundle, "client_cert": client_cert,
                    "client_key": client_key, **(also or {})}
        if connection is None:
            return self._of_separate({name: value for name, value in separate.items()
                                      if value is not None}, password, connect_timeout_s)
        fields = self.fields
        fields.refuse_beside(separate)
        secret = connection if isinstance(connection, Secret) else None
        given, what = self._of_connection(connection)
        options = fields.merged(given, what, {"password": password,
                                              "connect_timeout_s": connect_timeout_s})
        if secret is not None and password is None:  # kept where the Secret keeps it
            options["password"] = UrlPassword(secret.env, secret.file)
        return self._settings(options, what, secret)

    def parse(self, url: str, what: str = "connection=") -> dict[str, Any]:
        """The options that ``url`` gives (its password in clear text: for a Secret's URL,
        kept by no one); ``what`` names it in messages, which never quote it."""
        split = _split(url, self.system, what)
        if split.scheme not in self.schemes or not split.netloc:
            named = (f" (its scheme is {split.scheme!r})"
                     if url.lower().startswith(f"{split.scheme}://") else "")
            raise ConfigurationError(
                f"{self.system}: {what} is not a "
                f"{' or '.join(f'{name}://' for name in self.schemes)} URL{named}.",
                fix=f"write {self.example}")
        try:
            port = split.port
        except ValueError:
            port = 0
        user, host = split.username, split.hostname or ""
        fault = ("names no user (user@host)" if not user else "names no host" if not host
                 else "names more than one host" if "," in host
                 else "has a port that is no number from 1 to 65535" if port == 0 else None)
        if fault is not None or user is None:
            raise ConfigurationError(f"{self.system}: {what} {fault}.",
                                     fix=f"write {self.example}; {PERCENT_ENCODE}")
        database = unquote(split.path.removeprefix("/"))
        if not database or "/" in database:
            raise ConfigurationError(f"{self.system}: {what} names no database.",
                                     fix=f"write {self.example}")
        return {"host": unquote(host), "port": port, "user": unquote(user),
                "password": None if split.password is None else unquote(split.password),
                "database": database, **self._query(split.query, what)}

    def _query(self, query: str, what: str) -> dict[str, Any]:
        """The options of a URL's query (after ``?``); ``+`` is a plus, as libpq reads it."""
        options: dict[str, Any] = {}
        for part in filter(None, query.split("&")):
            name, _, value = (unquote(piece) for piece in part.partition("="))
            if name not in URL_QUERY_OPTIONS:
                raise ConfigurationError(
                    f"{self.system}: {what} gives {name!r}, which is not an option of its "
                    "query.", fix=f"use only {', '.join(URL_QUERY_OPTIONS)} (the sink's own "
                    "options of those names; its other options are keywords of the sink)")
            if name in options or not value:
                raise ConfigurationError(f"{self.system}: {what} gives {name} twice or "
                                         "without a value.", fix=f"give {name}= once, with "
                                         "its value")
            options[name] = _seconds(self.system, what, value) if name == "connect_timeout_s" \
                else value
        return options

    def _of_connection(self, connection: object) -> tuple[dict[str, Any], str]:
        """The options of a connection value, and how messages name it."""
        if isinstance(connection, Secret):
            what = f"the connection URL in {connection}"
            return self.parse(connection.reveal(), what), what
        if isinstance(connection, str):
            return self.parse(connection), "connection="
        if isinstance(connection, Mapping):
            return self.fields.of_mapping(connection), "connection="
        raise ConfigurationError(
            f"{self.system}: connection= is a {type(connection).__name__}.",
            fix=f"pass a URL ({self.example}), a twophase.Secret holding one, or a mapping of "
            "host, port, user, password, database and the TLS options")

    def _of_separate(self, given: Mapping[str, Any], password: SecretOption | None,
                     connect_timeout_s: float | None) -> ConnectionSettings:
        if "host" not in given:
            raise ConfigurationError(
                f"{self.system}: neither connection= nor host= is given: no server to "
                "connect to.", fix=f"pass connection={self.example} (or a twophase.Secret "
                "holding it, or a mapping of the options), or host=, user= and database=")
        return self._settings({**given, "password": password,
                               "connect_timeout_s": connect_timeout_s}, None, None)

    def _settings(self, given: Mapping[str, Any], what: str | None, secret: Secret | None
                  ) -> ConnectionSettings:
        """The settings ``given`` (``what``: the connection they come from; None: the
        separate options), defaults filled in; host, user and database required."""
        if missing := [name for name in ("host", "user", "database") if given.get(name) is None]:
            if what is None:
                raise ConfigurationError(
                    f"{self.system}: {', '.join(f'{name}=' for name in missing)} not given.",
                    fix="pass them beside host= (or every one in connection=)")
            raise ConfigurationError(f"{self.system}: {what} has no {', '.join(missing)}.",
                                     fix=f"give {', '.join(missing)} in {what}")
        port, timeout = given.get("port"), given.get("connect_timeout_s")
        return ConnectionSettings(
            host=given["host"], port=self.default_port if port is None else port,
            user=given["user"], password=given.get("password"), database=given["database"],
            tls=given.get("tls") or DEFAULT_TLS, ca_bundle=given.get("ca_bundle"),
            client_cert=given.get("client_cert"), client_key=given.get("client_key"),
            connect_timeout_s=self.default_connect_timeout_s if timeout is None else timeout,
            secret=secret)


def _split(url: str, system: str, what: str) -> SplitResult:
    """``urlsplit(url)``, refused as ``what`` (never quoted) if it is no URL."""
    try:
        split = urlsplit(url)
    except (ValueError, TypeError):
        split = None
    if split is None or split.fragment or "#" in url:
        raise ConfigurationError(f"{system}: {what} is not a valid URL.",
                                 fix=f"write scheme://user[:password]@host[:port]/database; "
                                 f"{PERCENT_ENCODE}")
    return split


def _seconds(system: str, what: str, value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0:
        raise ConfigurationError(f"{system}: {what} gives connect_timeout_s={value!r}, not a "
                                 "positive number of seconds.", fix="write connect_timeout_s=10")
    return seconds
