"""The sink kit: what every sink needs and only its system's parts differ.

A new sink writes its phases and one error table; the rest comes from here (the core, what
every sink needs, is this module; what one family of sinks shares is in its own module):

====================================  ==========================================================
piece                                 what it does
====================================  ==========================================================
:func:`chunks`                        groups rows into lists of at most ``chunk_size`` (bounded
                                      memory, :data:`DEFAULT_CHUNK_SIZE` unless told otherwise);
                                      :func:`batch_chunks` the same for record batches
:func:`validate_chunk_size`           the option check every chunking sink makes
:func:`validate_mode`                 ``mode="insert"`` / ``"upsert"`` / ``"keyed"``
                                      (:data:`Mode`, :data:`MODES`) and the ``key`` they need
:class:`Keyed`                        the keyed mode's one meaning (newest version wins, deletes
                                      keep tombstones): :data:`KEYED`, :func:`validate_keyed`,
                                      :meth:`Keyed.reduce` (a :class:`Change` per key) and
                                      :func:`newer_than` for a writer under locks,
                                      :func:`is_delete` (:data:`DELETED_FLAG`), :data:`HELD_CHUNKS`,
                                      :data:`DEFAULT_TOMBSTONE_RETENTION_S`; for a publisher in
                                      SQL: :mod:`twophase.kit.sql` (see :mod:`twophase._keyed`)
:func:`namespace_from`                a default namespace from a target's name (table, topic,
                                      prefix); :func:`qualified_namespace` from its name and
                                      where it is; :class:`NamespaceOfTarget` a sink's default
                                      namespace so (and 0.4.0's, the name alone, that a saved
                                      state keeps)
:class:`ErrorTable`                   system error code -> retryable / fatal / config / schema +
                                      fix; by exact code, by condition (the message, a
                                      :class:`Condition`), by code class
:func:`classified`                    a context manager that raises the table's verdict
:func:`transaction_lost`              the one wording of "a decided transaction is gone"
:func:`transaction_id_reused`         the one wording of "this id was already committed"
:func:`as_utc`                        an instant in UTC; a naive datetime is a wall clock, read
                                      as UTC
:func:`check_columns`                 the column checks of ``check_schema`` in one wording (on a
                                      :class:`TableColumn` each): missing columns, NOT NULL
                                      without default, the upsert key, instants
:func:`validate_namespace`            a namespace usable in transaction ids, else
                                      ConfigurationError
:func:`query_key`                     the part of a query id that goes into transaction ids
:func:`rows_of`                       Arrow record batches as rows of the types ``write`` gets
                                      (an instant's type: :data:`INSTANT_TYPE`);
                                      :func:`columns_of` a batch as columns of those values
:class:`WholeBatchCommitter`          a committer that makes a decided batch visible in ONE
                                      commit of its target: it commits a stage with one settle
                                      (``commit_handles``)
:data:`DEFAULT_COMMIT_PARALLELISM`    the threads a batch's handles commit from unless a sink's
                                      ``commit_parallelism`` says otherwise
:class:`LocalCommitMember`            a committer's capability (its ``local_commit()``) to
                                      publish a batch inside a local transaction it shares with
                                      other members of a sink group (the same database): one
                                      instant for all of them
:class:`Secret`                       a secret option by reference (``env=`` / ``file=``; an
                                      option's type: :data:`SecretOption`): what is pickled,
                                      logged and shown; :func:`reveal` reads it where used
:class:`ConnectionFields`            a sink's ``connection=``: its options as one mapping or
                                      a Secret's JSON object (:class:`SecretField`, one key of
                                      it read at every use; :class:`SecretPart` its base)
:func:`scrubbed`                      an error table whose errors never show a given secret
:func:`retried_if_rotated`            a step refused its credentials tried once more if their
                                      secret was rotated since they were read
                                      (:class:`Credentials`; a kept client per settings:
                                      :class:`ClientCache`)
:class:`Tls`                          every prebuilt sink's TLS options in one vocabulary:
                                      ``tls=`` (:data:`TlsMode`, :data:`TLS_MODES`,
                                      :data:`DEFAULT_TLS`), ``ca_bundle=``, ``client_cert=``,
                                      ``client_key=``; checked, and one shared ``SSLContext``;
                                      :func:`refuse_plain_text_over_https`
:func:`renamed_option`                an option's former name, still taken with a
                                      DeprecationWarning naming the new one
====================================  ==========================================================

The families, each a module with its own ``__all__`` and table:

=============================  ================================================================
module                         what it holds
=============================  ================================================================
:mod:`twophase.kit.sql`        a database sink's: the committer's connection pool and pooled
                               committer, the keyed mode applied in SQL, the tombstone table
:mod:`twophase.kit.s3`         an S3 writer's: the settings and one client, the S3 errors
:mod:`twophase.kit.lake`       a lake-table sink's (Delta, Iceberg): storage, intents, files,
                               the sink and its committer, the shared file errors
=============================  ================================================================

A sink's ``connection=``, its connection settings as one value (a mapping of its own option
names, or a :class:`Secret` holding a JSON object of them whose secret fields stay references,
:class:`SecretField`, read at every connection), is read by :class:`ConnectionFields`
(:class:`SecretPart`: one part of what a secret holds); the Kafka and S3 sinks take theirs so,
and :class:`twophase.kit.sql.ConnectionUrl` its mappings and refusals.

``__all__`` is the core's public API (the kit table of docs/writing-a-sink.md lists exactly it;
see docs/versioning.md and ``CHANGELOG.md``). Deprecated, kept out of ``__all__`` and removed
in 0.6.0: :class:`CommitsViaCommitter` (a shim), and every name of the flat kit that moved to a
family (``from twophase.kit import LakeSink`` still works, with a :class:`DeprecationWarning`
naming ``twophase.kit.lake.LakeSink``; :data:`MOVED` maps each to its module).
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
import warnings
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal

from twophase._classify import classified, transaction_id_reused, transaction_lost
from twophase._handle import (
    NAMESPACE_MAX_LENGTH,
    UNSAFE_IN_NAMESPACE,
    qualified_namespace,
    query_key,
    validate_namespace,
)
from twophase._keyed import (
    DEFAULT_TOMBSTONE_RETENTION_S,
    DELETED_FLAG,
    HELD_CHUNKS,
    KEYED,
    Change,
    Keyed,
    is_delete,
    newer_than,
    validate_keyed,
)
from twophase._local_commit import LocalCommitMember
from twophase._rows import INSTANT_TYPE, batch_chunks, chunks, columns_of, rows_of
from twophase._secrets import (
    ClientCache,
    Credentials,
    Secret,
    SecretOption,
    retried_if_rotated,
    reveal,
    scrubbed,
)
from twophase._tls import (
    DEFAULT_TLS,
    TLS_MODES,
    Tls,
    TlsMode,
    refuse_plain_text_over_https,
    renamed_option,
)
from twophase._whole_batch import WholeBatchCommitter
from twophase.errors import (
    ConfigurationError,
    FatalError,
    SchemaMismatchError,
    TwoPhaseError,
)
from twophase.sink import DEFAULT_COMMIT_PARALLELISM, Column

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_COMMIT_PARALLELISM",
    "DEFAULT_TLS",
    "DEFAULT_TOMBSTONE_RETENTION_S",
    "DELETED_FLAG",
    "HELD_CHUNKS",
    "INSTANT_TYPE",
    "KEYED",
    "MODES",
    "TLS_MODES",
    "Change",
    "ClientCache",
    "Condition",
    "ConnectionFields",
    "Credentials",
    "ErrorTable",
    "Keyed",
    "LocalCommitMember",
    "Mode",
    "NamespaceOfTarget",
    "Secret",
    "SecretField",
    "SecretOption",
    "SecretPart",
    "TableColumn",
    "Tls",
    "TlsMode",
    "WholeBatchCommitter",
    "as_utc",
    "batch_chunks",
    "check_columns",
    "chunks",
    "classified",
    "columns_of",
    "is_delete",
    "namespace_from",
    "newer_than",
    "qualified_namespace",
    "query_key",
    "refuse_plain_text_over_https",
    "renamed_option",
    "retried_if_rotated",
    "reveal",
    "rows_of",
    "scrubbed",
    "transaction_id_reused",
    "transaction_lost",
    "validate_chunk_size",
    "validate_keyed",
    "validate_mode",
    "validate_namespace",
]


#: Rows a sink writes per round trip unless told otherwise.
DEFAULT_CHUNK_SIZE = 10_000

Mode = Literal["insert", "upsert", "keyed"]
MODES: tuple[Mode, ...] = ("insert", "upsert", "keyed")

log = logging.getLogger(__name__)

_FIX_UNCLASSIFIED = "fix the cause named above, then restart the query"

#: What an error table maps a code to: the kind of error and the fix an operator can act on.
Verdict = tuple[type[TwoPhaseError], str]


def validate_chunk_size(sink: str, chunk_size: int) -> int:
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ConfigurationError(f"{sink}: chunk_size={chunk_size!r} must be a positive integer.",
                                 fix=f"leave it at {DEFAULT_CHUNK_SIZE} or pass a positive int")
    return chunk_size


def validate_mode(sink: str, mode: str, key: Sequence[str] = (), *,
                  key_required: bool = True) -> Mode:
    """``mode`` if it is one of :data:`MODES` and upsert has the key it needs (the keyed
    mode's own options: :func:`validate_keyed`)."""
    if mode not in MODES:
        raise ConfigurationError(f"{sink}: unknown mode {mode!r}.",
                                 fix="use mode='insert', 'upsert' or 'keyed'")
    if mode in ("upsert", KEYED) and (key_required or mode == KEYED) and not key:
        raise ConfigurationError(f"{sink}: mode={mode!r} needs the key columns.",
                                 fix="pass key=('id',) naming a unique key of the target")
    return next(known for known in MODES if known == mode)


def namespace_from(name: str, fallback: str) -> str:
    """A namespace from a target's name: unsafe characters become ``_``, at most 24 of them."""
    cleaned = UNSAFE_IN_NAMESPACE.sub("_", name)[:NAMESPACE_MAX_LENGTH]
    return cleaned or fallback


class NamespaceOfTarget:
    """A sink whose default namespace is its target's name qualified by where the target is
    (:func:`qualified_namespace`): mix it in before :class:`~twophase.TwoPhaseCommitSink` and
    define :meth:`target_name_and_place`. Before 0.5.0 the default was the name alone
    (:meth:`former_default_namespaces`): a state saved under it keeps it."""

    kind: ClassVar[str]

    def target_name_and_place(self) -> tuple[str, ...]:
        """The target's name, then where it is (a database, a schema, a catalog, a URI)."""
        raise NotImplementedError

    def default_namespace(self) -> str:
        return qualified_namespace(*self.target_name_and_place())

    def former_default_namespaces(self) -> tuple[str, ...]:
        return (namespace_from(self.target_name_and_place()[0], self.kind),)


@dataclass(frozen=True)
class Condition:
    """One meaning of a code that covers several: the verdict when the error's message
    contains ``text`` (case-insensitive). PostgreSQL's 55000 is "prepared transaction is busy"
    (retryable) and "prepared transactions are disabled" (a configuration error)."""

    text: str
    verdict: Verdict

    def matches(self, message: str) -> bool:
        return self.text.lower() in message.lower()


@dataclass(frozen=True)
class ErrorTable:
    """A system's error codes classified once, in one place (as Flink's ``XaFacade`` does).

    A code's verdict (the kind of error and the fix) is looked up in this order:

    1. ``conditions[code]``: the first :class:`Condition` whose text the message contains;
    2. ``rules[code]``: the code itself (a server error number, an SQLite error name, an HTTP
       status, a SQLSTATE);
    3. ``classes``: the longest key that the code's text starts with (a SQLSTATE class such
       as ``"23"`` integrity or ``"08"`` connection);
    4. ``default``: fatal, so that nothing is retried blindly.

    :meth:`error` words the result the same way for every sink.
    """

    system: str
    rules: Mapping[Hashable, Verdict]
    default: Verdict = field(default=(FatalError, _FIX_UNCLASSIFIED))
    classes: Mapping[str, Verdict] = field(default_factory=dict)
    conditions: Mapping[Hashable, Sequence[Condition]] = field(default_factory=dict)

    def verdict(self, code: Hashable, message: str = "") -> Verdict:
        for condition in self.conditions.get(code, ()):
            if condition.matches(message):
                return condition.verdict
        if code in self.rules:
            return self.rules[code]
        text = str(code) if code is not None else ""
        prefixes = [prefix for prefix in self.classes if prefix and text.startswith(prefix)]
        if prefixes:
            return self.classes[max(prefixes, key=len)]
        return self.default

    def class_code(self, exc: BaseException) -> str:
        """The most specific class name of ``exc`` (along its MRO) that the table has a rule
        or a condition for; else its own class name. For systems whose errors are classes."""
        for kind in type(exc).__mro__:
            if kind.__name__ in self.rules or kind.__name__ in self.conditions:
                return kind.__name__
        return type(exc).__name__

    def error_of(self, exc: BaseException, what: str) -> TwoPhaseError:
        """:meth:`error` for an exception classified by its class (:meth:`class_code`), its
        message's first line as the detail."""
        code = self.class_code(exc)
        message = (str(exc).strip() or type(exc).__name__).splitlines()[0]
        return self.error(code, what, f"[{code}] {message}")

    def error(self, code: Hashable, what: str, detail: str) -> TwoPhaseError:
        """The verdict for ``code`` (conditions read in ``detail``) as an error naming the
        system, the step that failed and the system's own message."""
        kind, fix = self.verdict(code, detail)
        return kind(f"{self.system}: {what} failed: {_sentence(detail)}", fix=fix)


def _sentence(detail: str) -> str:
    """A driver's message as the end of a sentence: one period, none after a multi-line text
    (which ends where the driver's own last line does)."""
    text = detail.strip()
    if not text or "\n" in text:
        return text or "(no message)."
    return text if text.endswith((".", "!", "?")) else f"{text}."


def as_utc(moment: datetime) -> datetime:
    """``moment`` as an aware datetime in UTC. An aware one (a Spark TIMESTAMP, an instant) is
    converted; a naive one (a TIMESTAMP_NTZ, a wall clock) is never read as the process's local
    time: its wall clock is taken as UTC, which is how the prebuilt sinks store it."""
    if moment.utcoffset() is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


@dataclass(frozen=True)
class TableColumn:
    """A column of the target as its catalog describes it, for :func:`check_columns`.

    ``required``: NOT NULL without a default (nor generated, nor auto-increment): an insert
    must write it. ``zoned``: whether the column keeps an instant's time zone (``timestamptz``)
    or not (``timestamp``); None where it does not apply or the sink stores instants in UTC
    wall-clock time by design.
    """

    name: str
    required: bool = False
    zoned: bool | None = None


def check_columns(where: str, table: Sequence[TableColumn], written: Sequence[Column], *,
                  upsert_key: Sequence[str] | None = None,
                  unique_keys: Sequence[Sequence[str]] = (),
                  case_sensitive: bool = True) -> None:
    """The column checks of ``check_schema``, in one wording for every sink.

    Refuses with :class:`SchemaMismatchError`: a target without columns (it does not exist),
    a written column the target lacks, a required column (NOT NULL without default) the rows
    lack, an instant (Spark ``TIMESTAMP``) written into a column that keeps no time zone, and,
    when ``upsert_key`` is given (upsert mode), a key that is no unique key of the target.
    ``upsert_key=()`` asks for any unique key made only of written columns (a sink that
    updates on whichever key the target has). ``where`` names the target ("table x of ...").
    """
    def same(name: str) -> str:
        return name if case_sensitive else name.lower()

    if not table:
        raise SchemaMismatchError(f"{where} does not exist.",
                                  fix="create it before starting the query, or fix its name")
    existing = {same(column.name): column for column in table}
    if missing := [c.name for c in written if same(c.name) not in existing]:
        raise SchemaMismatchError(
            f"{where} has no column {', '.join(map(repr, missing))} (its columns: "
            f"{', '.join(column.name for column in table)}).",
            fix="ALTER TABLE ... ADD COLUMN the missing columns, or select/rename them in "
            "the DataFrame")
    given = {same(c.name) for c in written}
    if required := [c.name for c in table if c.required and same(c.name) not in given]:
        raise SchemaMismatchError(
            f"{where} requires column {', '.join(map(repr, required))} (NOT NULL without "
            "default), which the rows do not have.",
            fix="add the column to the DataFrame, or give it a default in the table")
    if naive := [c.name for c in written
                 if c.type == INSTANT_TYPE and existing[same(c.name)].zoned is False]:
        raise SchemaMismatchError(
            f"{where}: column {', '.join(map(repr, naive))} keeps no time zone, but the rows "
            "hold instants (Spark TIMESTAMP) there.",
            fix="make the column zoned (PostgreSQL: timestamptz), or cast the values to "
            "timestamp_ntz (wall-clock values) in the DataFrame")
    if upsert_key is not None:
        _check_upsert_key(where, [c.name for c in written], upsert_key, unique_keys, same)


def _check_upsert_key(where: str, written: Sequence[str], upsert_key: Sequence[str],
                      unique_keys: Sequence[Sequence[str]], same: Callable[[str], str]) -> None:
    keys = [{same(name) for name in key} for key in unique_keys]
    if upsert_key:
        wanted = {same(name) for name in upsert_key}
        if wanted in keys and wanted <= {same(name) for name in written}:
            return
        problem = f"the upsert key {list(upsert_key)} is not a PRIMARY or UNIQUE key"
    elif any(key <= {same(name) for name in written} for key in keys):
        return
    else:
        problem = "mode='upsert' needs a PRIMARY or UNIQUE key"
    raise SchemaMismatchError(
        f"{where}: {problem} made of written columns; its unique keys: "
        f"{sorted(sorted(key) for key in keys) or 'none'}.",
        fix="write the key columns, create a unique index on the key, or use mode='insert'")


# -- connection=: a sink's connection settings as one value -----------------------------------

#: How a fix writes the JSON object a ``connection=`` secret holds.
JSON_CONNECTION_EXAMPLE = '{"option": "value", ...}'


@dataclass(frozen=True)
class SecretPart(Secret):
    """One part of what a secret (``env=`` or ``file=``) holds, as a secret option of its own:
    every :meth:`reveal` reads the whole secret again and takes the part, so a rotated secret's
    new part is used (and :class:`Credentials` sees it change). Pickled and shown as the
    reference it is, never the clear text. A subclass says which part (:meth:`part`)."""

    @property
    def whole(self) -> Secret:
        """The secret this is a part of, as messages name it."""
        return Secret(self.env, self.file)

    def reveal(self) -> str:
        """This part of what the secret holds, read now."""
        return self.part(super().reveal())

    def part(self, held: str) -> str:
        """This part of ``held``, the secret's clear text (which no message may quote)."""
        raise NotImplementedError


@dataclass(frozen=True)
class SecretField(SecretPart):
    """The string ``key`` of the JSON object a secret holds: the secret option of a sink made
    with ``connection=Secret(...)`` (:meth:`ConnectionFields.read`)."""

    key: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.key:
            raise ConfigurationError("a SecretField names the key of its value.",
                                     fix="write SecretField(env='NAME', key='password')")

    def part(self, held: str) -> str:
        what = f"the connection settings in {self.whole}"
        value = _json_object(held, what).get(self.key)
        if not isinstance(value, str):
            raise ConfigurationError(f"{what} hold no {self.key} (a JSON string).",
                                     fix=f'put "{self.key}": "..." into the JSON object the '
                                     "secret holds, or give it apart as the sink's option")
        return value


def _json_object(text: str, what: str) -> dict[str, Any]:
    """The JSON object ``text`` is; ``what`` names it in a refusal, which never quotes it (nor
    is raised in the context of the parser's error, which holds the whole text)."""
    held, fault = _parsed(text)
    if fault is not None:
        raise ConfigurationError(f"{what} is not valid JSON ({fault}).",
                                 fix=f"write one JSON object of the connection options, "
                                 f"{JSON_CONNECTION_EXAMPLE}")
    if not isinstance(held, dict):
        raise ConfigurationError(f"{what} is a JSON {type(held).__name__}, not an object.",
                                 fix=f"write one JSON object of the connection options, "
                                 f"{JSON_CONNECTION_EXAMPLE}")
    return held


def _parsed(text: str) -> tuple[Any, str | None]:
    """``text`` parsed as JSON, or None and where and why it is not JSON (never its text)."""
    try:
        return json.loads(text), None
    except json.JSONDecodeError as error:
        return None, f"{error.msg}: line {error.lineno} column {error.colno}"


@dataclass(frozen=True)
class ConnectionFields:
    """A sink's ``connection=``: its connection options (``names``, the sink's own option names)
    as one value: a mapping of them, or a :class:`Secret` whose value is a JSON object of them
    (``Secret(env="KAFKA_CONNECTION")``), or that JSON text.

    :meth:`read` takes it with the sink's separate options: one given in both is refused, naming
    it and the fix. A Secret's options are read as the sink is made, but its ``secrets`` (the
    passwords, keys and tokens among ``names``) stay references, :class:`SecretField`, read from
    the Secret at every connection: the pickled sink and ``repr`` hold no clear text, and a
    rotated secret's new value is used. No message quotes a value. A database sink's
    ``connection=`` (:class:`twophase.kit.sql.ConnectionUrl`) reads a URL instead of JSON and
    takes its mappings, and the refusals, from here.
    """

    system: str
    names: tuple[str, ...]
    secrets: frozenset[str] = frozenset()
    #: The separate options that may come beside ``connection=`` where it does not give them
    #: (None: every one); any other is refused beside it (``connection=`` holds them whole).
    beside: frozenset[str] | None = None
    #: What ``connection=`` holds, as a fix names it.
    form: str = "a mapping's keys, or the JSON object its Secret holds"

    def read(self, connection: str | Secret | Mapping[str, Any] | None,
             separate: Mapping[str, Any]) -> dict[str, Any]:
        """The options given, by ``connection`` (None: not given) and ``separate`` (the sink's
        separate options; a None value: not given)."""
        given = {name: value for name, value in separate.items() if value is not None}
        if connection is None:
            return given
        self.refuse_beside(given)
        fields, what = self.fields_of(connection)
        return self.merged(fields, what, given)

    def fields_of(self, connection: object) -> tuple[dict[str, Any], str]:
        """The options ``connection`` gives, and how messages name it."""
        if isinstance(connection, Secret):
            return self.of_secret(connection), f"the connection settings in {connection}"
        if isinstance(connection, str):
            held = _json_object(connection, f"{self.system}: connection=")
            return self.of_mapping(held), "connection="
        if isinstance(connection, Mapping):
            return self.of_mapping(connection), "connection="
        raise ConfigurationError(
            f"{self.system}: connection= is a {type(connection).__name__}.",
            fix=f"pass a mapping of {', '.join(self.names)}, or a twophase.Secret holding a "
            "JSON object of them")

    def of_mapping(self, mapping: Mapping[Any, Any], what: str = "connection=") -> dict[str, Any]:
        """The options a mapping (``what``) gives: only ``names``, a :class:`Secret` only for
        one of ``secrets``; a None value is not given."""
        if unknown := sorted(set(mapping) - set(self.names), key=str):
            raise ConfigurationError(
                f"{self.system}: {what} has {unknown}, which are not connection options.",
                fix=f"use only {', '.join(self.names)} (the sink's options of those names)")
        if references := sorted(name for name, value in mapping.items()
                                if isinstance(value, Secret) and name not in self.secrets):
            raise ConfigurationError(
                f"{self.system}: {what} gives {references} as a twophase.Secret.",
                fix=f"give them as values; a Secret is for {', '.join(sorted(self.secrets))}")
        return {name: value for name, value in mapping.items() if value is not None}

    def of_secret(self, secret: Secret) -> dict[str, Any]:
        """The options the JSON object in ``secret`` gives, read now; those of ``secrets``
        references to it (:class:`SecretField`)."""
        what = f"the connection settings in {secret}"
        fields = self.of_mapping(_json_object(secret.reveal(), f"{self.system}: {what}"), what)
        kept = sorted(self.secrets & set(fields))
        for name in kept:
            if not isinstance(fields[name], str):
                raise ConfigurationError(
                    f"{self.system}: {what} give {name} as a JSON "
                    f"{type(fields[name]).__name__}, not a string.",
                    fix=f'write "{name}": "..." (a JSON string)')
            fields[name] = SecretField(secret.env, secret.file, name)
        log.debug("%s: connection settings %s read from %s, %s kept references to it",
                  self.system, sorted(fields), secret, kept)
        return fields

    def refuse_beside(self, separate: Mapping[str, Any]) -> None:
        """Refuse the separate options given (``separate``) that may not come beside
        ``connection=`` at all (not in :attr:`beside`)."""
        if self.beside is None:
            return
        if clashing := [f"{name}=" for name, value in separate.items()
                        if value is not None and name not in self.beside]:
            raise ConfigurationError(
                f"{self.system}: connection= and {', '.join(clashing)} are both given: where "
                "and how to connect is one value.",
                fix=f"put {', '.join(clashing)} into connection= ({self.form}), or pass the "
                "separate options without connection=")

    def merged(self, fields: Mapping[str, Any], what: str, separate: Mapping[str, Any]
               ) -> dict[str, Any]:
        """``fields`` (of ``what``, a connection) and the ``separate`` options given, none in
        both."""
        given = {name: value for name, value in separate.items() if value is not None}
        for name in given:
            if fields.get(name) is not None:
                raise ConfigurationError(
                    f"{self.system}: {what} gives {name}, and {name}= is given too.",
                    fix=f"give {name} once: in {what}, or (kept apart) as {name}= with "
                    f"{what} holding none")
        return {**given, **{name: value for name, value in fields.items() if value is not None}}


# -- deprecated: removed in 0.6.0 (see CHANGELOG.md) ------------------------------------------

#: What the shim says when a class lists it among its bases.
COMMITS_VIA_COMMITTER_DEPRECATED = (
    "twophase.kit.CommitsViaCommitter is deprecated since 0.2.0 and is removed in 0.6.0: "
    "remove it from {name}'s bases; nothing replaces it. TwoPhaseCommitSink itself now runs "
    "sink.commit(handle) and sink.abort(handle) through the Committer your committer() "
    "returns (keep commit/abort in that Committer, off the sink)."
)


class CommitsViaCommitter:
    """Deprecated (0.1.0's base for a sink whose committer does the work); removed in 0.6.0.

    Since 0.2.0 :class:`~twophase.TwoPhaseCommitSink` itself runs ``sink.commit(handle)`` and
    ``sink.abort(handle)`` through the :class:`~twophase.Committer` that ``committer()``
    returns. This shim only keeps a sink written to 0.1.0's README importable: it defines
    nothing (a sink with both ``commit`` and ``committer()`` is refused) and warns, with a
    :class:`DeprecationWarning` naming the fix, when a class lists it among its bases.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if CommitsViaCommitter in cls.__bases__:
            warnings.warn(COMMITS_VIA_COMMITTER_DEPRECATED.format(name=cls.__qualname__),
                          DeprecationWarning, stacklevel=_class_statement_level())


#: Modules whose frames sit between a ``class`` statement and ``__init_subclass__``.
_CLASS_MACHINERY = frozenset({__name__, "abc", "typing", "twophase.sink"})


def _class_statement_level() -> int:
    """The ``stacklevel`` of the ``class`` statement that runs the caller's
    ``__init_subclass__`` (under ``ABCMeta`` and ``Generic`` the frames in between vary)."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_globals.get("__name__") in _CLASS_MACHINERY:
        frame, level = frame.f_back, level + 1
    return level


#: Every name of the flat kit (0.4.0's, and 0.5.0's before the split) now in a family, and its
#: module: each still imports from ``twophase.kit`` until 0.6.0 (the same object), with a warning.
MOVED: Mapping[str, str] = {
    **dict.fromkeys(("ConnectionPool", "PooledCommitter", "TOMBSTONE_TIME_COLUMN",
                     "keyed_apply_statements", "tombstone_table_name"), "twophase.kit.sql"),
    **dict.fromkeys(("DEFAULT_S3_MAX_ATTEMPTS", "S3Checksums", "S3Errors", "S3Settings",
                     "S3_OPTIONS", "boto_errors", "split_s3_location"), "twophase.kit.s3"),
    **dict.fromkeys(("DEFAULT_MAX_FILE_BYTES", "FIX_LAKE_DISK", "FIX_LAKE_RETRY",
                     "FIX_LAKE_VALUES", "INTENTS_DIRECTORY", "LAKE_FILE_CONDITIONS",
                     "LAKE_FILE_RULES", "LAKE_S3_PERMISSIONS", "LakeCleanup", "LakeCommitter",
                     "LakeFileRecord", "LakeFileStat", "LakeFileWriter", "LakeFiles",
                     "LakeIntents", "LakeOutput", "LakeSink", "LakeStorage", "LakeTransaction",
                     "conform_table", "lake_classifier", "lake_deadline", "lake_iam_policy",
                     "lake_storage", "validate_max_file_bytes"), "twophase.kit.lake"),
}

#: What a moved name says when it is taken from ``twophase.kit``.
KIT_NAME_MOVED = (
    "twophase.kit.{name} is deprecated since 0.5.0 and is removed in 0.6.0: import it from "
    "{module} (from {module} import {name}): {module}.{name} is the same object."
)


def __getattr__(name: str) -> Any:
    """A name that moved to a family (:data:`MOVED`), from its new module, with a
    :class:`DeprecationWarning` naming it; any other unknown name is an AttributeError."""
    module = MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # ``from twophase.kit import X`` asks twice: importlib's ``_handle_fromlist`` (is X a
    # submodule?), then the import statement itself, which warns: one warning per import.
    if sys._getframe(1).f_code.co_name != "_handle_fromlist":
        warnings.warn(KIT_NAME_MOVED.format(name=name, module=module), DeprecationWarning,
                      stacklevel=2)
    return getattr(importlib.import_module(module), name)
