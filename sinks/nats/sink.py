"""NATS JetStream, exactly once by a compare-and-set chain: :class:`JetStreamSink`.

Every partition's slice of a micro-batch is published, with acknowledgements, into a staging
stream the sink owns (:mod:`~sinks.nats.staging`, file storage): durable and invisible to the
target's readers. Once the driver has decided the batch, its committer republishes the staged
messages into the target subject as one chain of compare-and-set publishes
(:mod:`~sinks.nats.chain`, ``Nats-Expected-Last-Subject-Sequence``), proves each transaction's
commit with a record, and drops the staging (:mod:`~sinks.nats.committer`).

What a crash leaves behind, phase by phase:

==========  ===================  =====================  ====================  ====================
phase       calls                a crash here leaves    resolved by           raises
==========  ===================  =====================  ====================  ====================
begin       none                 nothing                (nothing to resolve)  ConfigurationError
                                                                              (bad options)
write       publish the rows to  some chunks on         listed by             RetryableError (no
            ``twophase.stage.    ``twophase.stage.      ``list_in_doubt``,    server, a timeout),
            <stream>.<txn>``, a  <stream>.<txn>``       purged by the sweep   SchemaMismatchError
            chunk per message,                          or cleanup (abort)    (over max_payload)
            acks awaited
pre-commit  every ack in; the    the staged messages:   as write; once the    FatalError (the id
            staged count         durable, invisible     handle is decided,    was committed once,
            checked; the id's                           the driver commits    or the count is
            proof looked up                             it                    off)
commit      count checked, then  a prefix of the        recovery settles the  TransactionLostError
            the CAS chain into   transaction in the     batch again: the tip  (staging gone, no
            the subject; its     subject (readers see   resumes it after its  proof, not at the
            proof; staging       it); or all and no     last message; a       tip), RetryableError
            purged               proof yet              complete tip gets     (10071: another
                                                        its proof             commit meanwhile)
abort       purge of the         nothing, or what was   repeat it: nothing    never (NOT_FOUND)
            staging subject      left                   there is NOT_FOUND
==========  ===================  =====================  ====================  ====================

What readers see, plainly:

* **A prefix, for a while.** A batch becomes visible message by message while it commits, and
  after a crash in its commit the subject holds a prefix of it until recovery finishes it (the
  rest is published once, never a message twice). NATS 2.9 has no atomic publish of several
  messages; readers that need whole batches group by the ``Twophase-Txn`` and
  ``Twophase-Count`` headers every committed message carries (with ``Twophase-Index``).
* **Durability is the server's.** nats-server 2.9 acknowledges a publish before it fsyncs (it
  syncs every 2 minutes, and has no ``sync_interval: always``): a pre-commit survives a crash
  of the server's process, not of its machine (an OS crash or power cut may lose acknowledged
  messages, staged or committed). Replicas (R3) narrow that window; newer servers close it
  with ``sync_interval: always``.
* **One writer per subject.** The target subject is written by this query alone: other
  subjects of the stream may have writers (the chain is then sequential, one ack at a time);
  a stream whose only subject is the sink's is pipelined (a window of publishes in flight,
  each also checked at the stream's level). ``check_schema`` refuses a stream that may drop
  the subject's last message before a late recovery reads it (:mod:`~sinks.nats.preflight`:
  WorkQueue or Interest retention, a ``max_age`` under ``recovery_horizon_s``, count limits).
* **Atomic batches would change the first point.** nats-server 2.12's atomic batch publish
  (ADR-50, ``allow_atomic``, at most 1,000 messages per batch) would let each run of up to
  1,000 messages appear at once: :meth:`~sinks.nats.chain.Chain.publish_run` is where it
  plugs in.

A transaction begun but never pre-committed (a writer that died) leaves staged messages,
listed in doubt by id and aborted by the next sweep: nothing outlives its writer unnamed.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from sinks.nats import preflight, staging
from sinks.nats.access import permissions
from sinks.nats.chain import Target
from sinks.nats.committer import JetStreamCommitter
from sinks.nats.connection import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_REQUEST_TIMEOUT_S,
    Connection,
    NatsSettings,
)
from sinks.nats.errors import SYSTEM
from sinks.nats.payload import Encode, check_value_column, encoder
from sinks.nats.preflight import DEFAULT_RECOVERY_HORIZON_S
from sinks.nats.subjects import STAGING_STREAM_PREFIX, Layout, check_subject
from twophase import (
    Column,
    ConfigurationError,
    FatalError,
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
    qualified_namespace,
    transaction_id_reused,
)

log = logging.getLogger(__name__)

#: A JetStream stream name: no dots, wildcards, white space or path separators.
_STREAM_NAME_FORBIDDEN = frozenset(".*> \t\r\n/\\")


@dataclass
class JetStreamTransaction:
    """One partition's messages being staged (lives on the executor until pre-commit)."""

    txn_id: TxnId
    encode: Encode
    first_seq: int = 0
    #: The rows written (each a message of the subject once committed).
    messages: int = 0
    #: The staged messages holding them, a chunk of rows each.
    chunks: int = 0


class JetStreamSink(TwoPhaseCommitSink[JetStreamTransaction]):
    """Exactly-once messages into ``subject`` of the JetStream stream ``stream``.

    ``servers``: ``"nats://host:4222"`` (or several, a list or comma-separated). ``stream``:
    the target stream, which must capture ``subject`` (a literal subject the sink alone
    writes). Each row becomes one message: by default the row as one JSON object
    (:mod:`~sinks.nats.payload`), or with ``value=`` a STRING or BINARY column as the payload
    as is. ``staging_stream``: the stream the sink owns for staged messages and proofs
    (default ``TWOPHASE_STAGE_<stream>``, created by the preflight). ``recovery_horizon_s``:
    the longest a decided batch may wait for its commit (the preflight refuses a stream that
    may drop the subject's last message sooner).
    Credentials, one kind: ``user`` + ``password``, ``token``, ``nkeys_seed`` (may be
    :class:`~twophase.Secret` references), or ``creds_file``. ``tls`` / ``ca_bundle`` /
    ``client_cert`` / ``client_key``: every prebuilt sink's TLS options, verified by default;
    ``tls="off"`` for a server on a trusted network that takes plain text. The permissions
    the user needs: :func:`sinks.nats.access.permissions` (a refused one is named).
    """

    kind: ClassVar[str] = "nats"

    def __init__(
        self,
        servers: str | Sequence[str],
        *,
        stream: str,
        subject: str,
        value: str | None = None,
        staging_stream: str | None = None,
        user: str | None = None,
        password: SecretOption | None = None,
        token: SecretOption | None = None,
        nkeys_seed: SecretOption | None = None,
        creds_file: str | None = None,
        tls: TlsMode = DEFAULT_TLS,
        ca_bundle: str | None = None,
        client_cert: str | None = None,
        client_key: str | None = None,
        recovery_horizon_s: float = DEFAULT_RECOVERY_HORIZON_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    ) -> None:
        self.subject = check_subject("subject", subject)
        staging_name = staging_stream or f"{STAGING_STREAM_PREFIX}{stream}"
        for option, name in (("stream", stream), ("staging_stream", staging_name)):
            if not name or _STREAM_NAME_FORBIDDEN.intersection(name):
                raise ConfigurationError(f"{SYSTEM}: {option}={name!r} is not a stream name.",
                                         fix=f"pass {option}= a name without dots, wildcards, "
                                             "spaces or slashes")
        self.layout = Layout(stream, staging_name)
        listed = [servers] if isinstance(servers, str) else list(servers)
        self.settings = NatsSettings(
            servers=tuple(url.strip() for entry in listed for url in entry.split(",")
                          if url.strip()),
            tls=Tls(tls, ca_bundle, client_cert, client_key, SYSTEM), user=user,
            password=password, token=token, nkeys_seed=nkeys_seed, creds_file=creds_file,
            connect_timeout_s=connect_timeout_s, request_timeout_s=request_timeout_s,
            permissions=permissions(self.subject, self.layout))
        self.value = value
        if not recovery_horizon_s > 0:
            raise ConfigurationError(
                f"{SYSTEM}: recovery_horizon_s={recovery_horizon_s!r} must be > 0.",
                fix="pass the longest a decided batch may wait for its commit, in seconds")
        self.recovery_horizon_s = float(recovery_horizon_s)
        if tls == "require":
            log.warning("%s: TLS certificate verification is OFF (tls='require') for %s",
                        SYSTEM, self.settings.where)

    def __repr__(self) -> str:
        return f"JetStreamSink({self.where}, staging={self.layout.staging_stream})"

    @property
    def where(self) -> str:
        return f"subject {self.subject} of stream {self.layout.stream} at {self.settings.where}"

    @property
    def target(self) -> Target:
        return Target(self.layout.stream, self.subject)

    def default_namespace(self) -> str:
        """The subject's name qualified by its stream (not by the servers: a cluster's address
        may change, its in-doubt transactions must still be found)."""
        return qualified_namespace(self.subject, self.layout.stream)

    # -- before the start ---------------------------------------------------------------------

    def check_schema(self, columns: Sequence[Column]) -> None:
        """A subject has no columns; a ``value=`` column must be STRING or BINARY. Then the
        stream checks of :mod:`~sinks.nats.preflight`, and the staging stream made."""
        if self.value is not None:
            check_value_column(columns, self.value)
        self.settings.run(f"checking {self.where}", lambda connection: preflight.check(
            connection, self.target, self.layout, self.recovery_horizon_s))

    # -- executor -----------------------------------------------------------------------------

    def begin_transaction(self, ctx: TransactionContext) -> JetStreamTransaction:
        return JetStreamTransaction(ctx.txn_id, encoder(ctx.columns, self.value))

    def write(self, txn: JetStreamTransaction, rows: Iterable[Sequence[Any]]) -> None:
        payloads = _nonempty(txn.encode(row) for row in rows)
        if payloads is None:
            return

        async def stage(connection: Connection) -> tuple[int, int, int]:
            return await staging.stage(connection, self.layout.stage_subject(txn.txn_id),
                                       payloads, first_index=txn.messages)

        first_seq, chunks, staged = self.settings.run(
            f"staging {txn.txn_id} for {self.where}", stage)
        txn.first_seq = txn.first_seq or first_seq
        txn.chunks += chunks
        txn.messages += staged

    def pre_commit(self, txn: JetStreamTransaction) -> Handle:
        self.settings.run(f"pre-commit of {txn.txn_id} for {self.where}",
                          lambda connection: self._check_staged(connection, txn))
        return self.handle(txn.txn_id, txn.messages, messages=txn.messages, chunks=txn.chunks,
                           first_seq=txn.first_seq, staging_stream=self.layout.staging_stream)

    async def _check_staged(self, connection: Connection, txn: JetStreamTransaction) -> None:
        """The id was never committed, and the staging holds exactly what was written."""
        if await staging.proof_time(connection, self.layout, txn.txn_id) is not None:
            await staging.purge(connection, self.layout, txn.txn_id)
            raise transaction_id_reused(txn.txn_id, where=f"{self.where} (its proof of commit "
                                        f"in {self.layout.staging_stream})")
        staged = await staging.count(connection, self.layout, txn.txn_id)
        if staged != txn.chunks:
            raise FatalError(
                f"{SYSTEM}: {txn.txn_id} staged {txn.chunks} chunks of rows but "
                f"{self.layout.staging_stream} holds {staged} for it.",
                fix="nothing but the sink may publish to twophase.stage.>, and the staging "
                    "stream needs no limits: find the writer or the limit; the task is retried")

    def discard(self, txn: JetStreamTransaction) -> None:
        try:
            self.settings.run(f"discard of {txn.txn_id} for {self.where}",
                              lambda connection: staging.purge(connection, self.layout,
                                                               txn.txn_id))
        except TwoPhaseError:
            log.warning("discard of %s: its staged messages stay until a sweep or cleanup "
                        "aborts it", txn.txn_id, exc_info=True)

    # -- driver: everything in the committer --------------------------------------------------

    def committer(self) -> JetStreamCommitter:
        return JetStreamCommitter(self)


def _nonempty(payloads: Iterator[bytes]) -> Iterator[bytes] | None:
    """``payloads`` again, or None if there are none (no connection for an empty write)."""
    first = next(payloads, None)
    return None if first is None else itertools.chain((first,), payloads)
