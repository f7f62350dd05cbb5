"""Any HTTP endpoint that honours ``Idempotency-Key``, exactly once: :class:`HttpSink`.

Every partition's slice of a micro-batch is encoded (JSON array or JSON Lines, optionally
gzip), cut into requests of bounded size (:mod:`~sinks.http.encoding`) and staged durably in
a local directory or under an S3 prefix (:mod:`~sinks.http.staging`); nothing is sent
before the batch is decided. Each request has a deterministic idempotency key derived from
the transaction id and its index (:func:`~sinks.http.protocol.idempotency_key`). Commit
sends the staged requests with their keys (:mod:`~sinks.http.committer`); a receiver that
follows the IETF idempotency-key draft (e.g. :mod:`sinks.http.receiver` in front of any
webhook) executes each key once and replays its answer to every retry.

What a crash leaves behind, phase by phase:

==========  ===================  =====================  ====================  ====================
phase       calls                a crash here leaves    resolved by           raises
==========  ===================  =====================  ====================  ====================
begin       none                 nothing                (nothing to resolve)  ConfigurationError
                                                                              (bad options)
write       writes each full     ``<txn>.writing/``     listed by             FatalError (disk
            request's body to    with some bodies       ``list_in_doubt``,    full, no access)
            ``<txn>.writing/``                          removed by the sweep
                                                        or cleanup (abort)
pre-commit  last body, manifest, ``<txn>.staged/``:     as write; once the    FatalError (the id
            fsync, rename to     durable, nothing sent  handle is decided,    was committed once)
            ``<txn>.staged``                            the driver commits it
commit      POST/PUT each        some requests          recovery commits      TransactionLostError
            request with its     executed by the        again: the receiver   (nothing staged nor
            key; then the        receiver, the rest     replays the executed  recorded; staged
            record               not; or all and no     ones, executes the    longer than the key
            ``<txn>.committed``  record yet             rest once             expiry), Retryable-
            and removal                                                       Error, FatalError,
                                                                              ConfigurationError
abort       removal of           nothing, or what was   repeat it: nothing    never (NOT_FOUND)
            ``.writing`` /       left                   there is NOT_FOUND
            ``.staged``
==========  ===================  =====================  ====================  ====================

The table names the local directory; on S3 ``.writing`` is ``.staged`` without its manifest,
and the seal is the manifest written last instead of a rename (:mod:`~sinks.http.s3_staging`);
S3's own failures in any phase are retryable or ConfigurationError (:mod:`~sinks.http.errors`).
Pre-commit never reaches the receiver, so before the driver decides a batch it asks the
receiver (``check_committable``: its well-known URL answers, anything but a 5xx): while the
receiver is down no batch is decided, and in a sink group no member runs ahead of this one.
The sink stages; everything the driver does (that check, commit, abort, the listing in doubt,
the purge of commit records) is :class:`~sinks.http.committer.HttpCommitter`'s.
An empty partition stages nothing and its handle names no request: every commit of it is
ALREADY_COMMITTED. The proofs of commit are the ``.committed`` records, which
``purge_commit_records`` drops after the cleanup's retention.

Hazard: receivers forget keys (Stripe after 24 h). A decided batch whose driver stays down
longer than ``key_expiry_s`` cannot be sent safely any more: its commit raises
TransactionLostError instead of risking a second execution. Set ``key_expiry_s`` to the
receiver's window (``check_schema`` refuses a longer one than the receiver publishes).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar
from urllib.parse import urlsplit

import requests

from sinks.http.committer import HttpCommitter
from sinks.http.connection import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_READ_TIMEOUT_S,
    METHODS,
    HttpSettings,
    session,
)
from sinks.http.encoding import (
    ENCODINGS,
    Compression,
    Encoding,
    Splitter,
    compress,
    encode_record,
    frame,
)
from sinks.http.errors import SYSTEM, classify
from sinks.http.protocol import POLICY_TIMEOUT_S, WELL_KNOWN, content_digest, idempotency_key
from sinks.http.staging import Manifest, StagedRequest, staging_at
from twophase import (
    Column,
    ConfigurationError,
    Handle,
    TransactionContext,
    TwoPhaseCommitSink,
    TwoPhaseError,
    TxnId,
)
from twophase.kit import (
    DEFAULT_TLS,
    SecretOption,
    Tls,
    TlsMode,
    namespace_from,
    refuse_plain_text_over_https,
    renamed_option,
    transaction_id_reused,
)

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES_PER_REQUEST = 1024 * 1024
DEFAULT_MAX_RECORDS_PER_REQUEST = 1000
#: Stripe keeps idempotency keys for 24 hours; so does the reference receiver by default.
DEFAULT_KEY_EXPIRY_S = 24 * 3600.0
#: Attempts per request inside one commit (twophase retries the whole commit again).
DEFAULT_MAX_ATTEMPTS = 4
DEFAULT_INITIAL_BACKOFF_S = 0.2
DEFAULT_MAX_BACKOFF_S = 5.0


@dataclass
class HttpTransaction:
    """One partition's requests being staged (lives on the executor until pre-commit)."""

    txn_id: TxnId
    names: tuple[str, ...]
    splitter: Splitter
    opened: bool = False
    requests: list[StagedRequest] = field(default_factory=list)
    rows: int = 0


class HttpSink(TwoPhaseCommitSink[HttpTransaction]):
    """Exactly-once requests to ``url``, each with a deterministic ``Idempotency-Key``.

    ``staging``: where pre-committed requests wait for the commit, reachable from the executors
    and the driver: a local directory (a shared file system on a cluster) or
    ``"s3://bucket/prefix"`` (``s3a://`` too; needs ``twophase[http-s3]``), with
    ``staging_options`` (``endpoint_url``, ``region``, ``path_style``, ``access_key_id``,
    ``secret_access_key``, ``session_token``; default boto3's chain). ``method``: ``"POST"``
    or ``"PUT"``. ``encoding``: ``"json"`` (one JSON array per request) or ``"jsonl"``;
    ``compression="gzip"``. Requests hold at most ``max_records_per_request`` records and
    ``max_bytes_per_request`` bytes of content.
    ``headers``: extra request headers; ``token``: a bearer token; ``signing_secret``: signs
    every request (HMAC-SHA256 of timestamp and body, see :mod:`~sinks.http.signing`);
    ``tls`` / ``ca_bundle`` / ``client_cert`` / ``client_key`` (every prebuilt sink's TLS
    options): ``tls="verify"`` (the default) verifies the certificate and host name, against
    ``ca_bundle`` (a private CA's file) if given; ``tls="require"`` turns it off; the client
    certificate and its key for mutual TLS. (The former ``verify=False`` works and warns until
    0.6.0.)
    ``token`` and ``signing_secret`` (and the staging's ``secret_access_key`` /
    ``session_token``) may be :class:`~twophase.Secret` references. ``key_expiry_s``: how long
    the receiver keeps keys. ``max_attempts``, ``initial_backoff_s``, ``max_backoff_s``: the
    retries of one request inside a commit.
    """

    kind: ClassVar[str] = "http"
    #: Pre-commit stages the requests without the receiver: what commits need of it (a POST
    #: accepted with the token and signature) only a delivered request, a visible write, shows.
    invisible_probe: ClassVar[bool] = False

    def __init__(
        self,
        url: str,
        *,
        staging: str | os.PathLike[str],
        staging_options: Mapping[str, Any] | None = None,
        method: str = "POST",
        encoding: Encoding = "json",
        compression: Compression = None,
        headers: Mapping[str, str] | None = None,
        token: SecretOption | None = None,
        signing_secret: SecretOption | None = None,
        tls: TlsMode = DEFAULT_TLS,
        ca_bundle: str | None = None,
        client_cert: str | None = None,
        client_key: str | None = None,
        max_bytes_per_request: int = DEFAULT_MAX_BYTES_PER_REQUEST,
        max_records_per_request: int = DEFAULT_MAX_RECORDS_PER_REQUEST,
        key_expiry_s: float = DEFAULT_KEY_EXPIRY_S,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        initial_backoff_s: float = DEFAULT_INITIAL_BACKOFF_S,
        max_backoff_s: float = DEFAULT_MAX_BACKOFF_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
        verify: bool | None = None,
    ) -> None:
        if renamed_option(SYSTEM, "verify", verify, "tls", None,
                          same="tls='require' for verify=False") is False:
            tls, ca_bundle = "require", None
        if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
            raise ConfigurationError(f"HttpSink: url {url!r} is not an http(s) URL.",
                                     fix="pass url='https://host/path'")
        if method.upper() not in METHODS:
            raise ConfigurationError(f"HttpSink: method {method!r} is not supported.",
                                     fix=f"use one of {', '.join(METHODS)}")
        if encoding not in ENCODINGS or compression not in (None, "gzip"):
            raise ConfigurationError(
                f"HttpSink: encoding={encoding!r}, compression={compression!r} is unknown.",
                fix="use encoding='json' or 'jsonl', compression=None or 'gzip'")
        for name, value in (("max_bytes_per_request", max_bytes_per_request),
                            ("max_records_per_request", max_records_per_request),
                            ("max_attempts", max_attempts)):
            if not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"HttpSink: {name}={value!r} must be a positive int.",
                                         fix=f"pass a positive {name}=")
        if not key_expiry_s > 0:
            raise ConfigurationError(f"HttpSink: key_expiry_s={key_expiry_s!r} must be > 0.",
                                     fix="pass the receiver's key expiry in seconds")
        self.settings = HttpSettings(
            url=url, method=method.upper(), headers=tuple(sorted((headers or {}).items())),
            token=token, signing_secret=signing_secret,
            tls=Tls(tls, ca_bundle, client_cert, client_key, SYSTEM),
            connect_timeout_s=connect_timeout_s, read_timeout_s=read_timeout_s)
        refuse_plain_text_over_https(self.settings.tls, url)
        if tls == "require":
            log.warning("HttpSink: TLS certificate verification is OFF (tls='require') for %s",
                        self.settings.where)
        self.staging = staging_at(staging, staging_options)
        self.encoding: Encoding = encoding
        self.compression: Compression = compression
        self.max_bytes_per_request = max_bytes_per_request
        self.max_records_per_request = max_records_per_request
        self.key_expiry_s = float(key_expiry_s)
        self.max_attempts = max_attempts
        self.initial_backoff_s = initial_backoff_s
        self.max_backoff_s = max_backoff_s

    def __repr__(self) -> str:
        return (f"HttpSink({self.settings.method} {self.where}, encoding={self.encoding!r}, "
                f"compression={self.compression!r}, staging={self.staging.location!r})")

    @property
    def where(self) -> str:
        return self.settings.where

    def default_namespace(self) -> str:
        parts = urlsplit(self.settings.url)
        name = parts.path.rstrip("/").rsplit("/", 1)[-1] or parts.hostname or self.kind
        return namespace_from(name, self.kind)

    # -- before the start ---------------------------------------------------------------------

    def check_schema(self, columns: Sequence[Column]) -> None:
        """Every Spark type has a JSON form; check the staging root and the receiver's
        published key expiry instead."""
        self.staging.ensure_root()
        self.check_key_expiry()

    def check_key_expiry(self) -> None:
        """Refuse a ``key_expiry_s`` longer than the receiver publishes (if it publishes one),
        and a receiver whose certificate is not verified."""
        try:
            with session().get(self.policy_url, timeout=POLICY_TIMEOUT_S,
                               **self.settings.tls_options) as reply:
                published = reply.json().get("key_expiry_s") if reply.ok else None
        except requests.exceptions.SSLError as exc:
            raise classify(exc, f"GET {self.settings.where_of(WELL_KNOWN)}") from None
        except (requests.RequestException, ValueError, AttributeError) as exc:
            log.info("no idempotency policy at %s (%s): key_expiry_s=%s is trusted as given",
                     self.where, type(exc).__name__, self.key_expiry_s)
            return
        if isinstance(published, int | float) and published < self.key_expiry_s:
            raise ConfigurationError(
                f"HttpSink: the receiver at {self.where} keeps idempotency keys for "
                f"{published}s, but key_expiry_s={self.key_expiry_s:.0f}: a commit after its "
                "window would execute requests twice.",
                fix=f"pass key_expiry_s={published} (or lengthen the receiver's window)")

    @property
    def policy_url(self) -> str:
        """The receiver's published idempotency policy (its well-known URL)."""
        parts = urlsplit(self.settings.url)
        return f"{parts.scheme}://{parts.netloc}{WELL_KNOWN}"

    # -- executor -----------------------------------------------------------------------------

    def begin_transaction(self, ctx: TransactionContext) -> HttpTransaction:
        return HttpTransaction(ctx.txn_id, ctx.column_names,
                               Splitter(self.max_records_per_request, self.max_bytes_per_request))

    def write(self, txn: HttpTransaction, rows: Iterable[Sequence[Any]]) -> None:
        names, splitter = txn.names, txn.splitter
        for row in rows:
            full = splitter.add(encode_record(names, row))
            txn.rows += 1
            if full is not None:
                self._stage(txn, full)

    def _stage(self, txn: HttpTransaction, records: list[bytes]) -> None:
        """Stage one request's body, durably (the transaction is not sealed yet)."""
        if not txn.opened:
            self.staging.open(txn.txn_id)
            txn.opened = True
        content = frame(self.encoding, records)
        body = compress(content, self.compression)
        index = len(txn.requests)
        self.staging.write_body(txn.txn_id, index, body)
        txn.requests.append(StagedRequest(index, idempotency_key(str(txn.txn_id), index),
                                          len(records), content_digest(content), len(body)))

    def pre_commit(self, txn: HttpTransaction) -> Handle:
        rest = txn.splitter.rest()
        if rest:
            self._stage(txn, rest)
        if self.staging.is_committed(txn.txn_id):
            self.discard(txn)
            raise transaction_id_reused(txn.txn_id, where=f"{self.where} (commit records in "
                                        f"{self.staging.location})")
        if not txn.opened:
            return self.handle(txn.txn_id, 0, staged=None, keys=[], requests=0)
        manifest = Manifest(str(txn.txn_id), time.time(), self.encoding, self.compression,
                            txn.rows, tuple(txn.requests))
        return self.handle_of(manifest, self.staging.seal(manifest))

    def handle_of(self, manifest: Manifest, staged: str) -> Handle:
        """The handle of a transaction staged as ``manifest`` at ``staged``."""
        return self.handle(TxnId.parse(manifest.txn), manifest.rows, staged=staged,
                           keys=[r.key for r in manifest.requests],
                           requests=len(manifest.requests), staged_at=manifest.staged_at,
                           bytes=sum(r.size for r in manifest.requests))

    def discard(self, txn: HttpTransaction) -> None:
        try:
            self.staging.remove(txn.txn_id)
        except (OSError, TwoPhaseError):
            log.warning("discard of %s: its staged bodies stay until a sweep or cleanup "
                        "removes them", txn.txn_id, exc_info=True)

    # -- driver: everything in the committer --------------------------------------------------

    #: Deprecated on the sink (removed in 0.6.0): call them on ``sink.committer()``.
    moved_to_committer = frozenset({"check_committable", "list_in_doubt",
                                    "purge_commit_records"})

    def committer(self) -> HttpCommitter:
        return HttpCommitter(self)
