"""Redis Streams, exactly once without the consumers' help: :class:`RedisStreamSink`.

Every partition's slice of a micro-batch is staged in a stream of its own beside the target
(same hash tag, so same cluster slot: :mod:`~sinks.redis.keys`), a chunk of rows per staged
entry (:mod:`~sinks.redis.entries`); nothing reaches the target before the batch is decided.
The driver then runs ONE Lua script (:mod:`~sinks.redis.scripts`) that checks every
transaction's proof and staged count before its first write, adds all their rows to the target
and records the proofs: a script runs alone, so **readers (XREAD, XREADGROUP, XRANGE) see the
batch appear whole**, and the AOF logs it as one block, replayed whole or not at all. A rerun
finds the proofs and answers "already". A batch of more than ``max_rows_per_script`` rows
takes several scripts (a long script blocks every other client), each moving whole chunks in
order with its progress: readers then see it arrive in parts, in order.

What a crash leaves behind, phase by phase:

==========  ====================  ======================  ====================  ===================
phase       calls                 a crash here leaves     resolved by           raises
==========  ====================  ======================  ====================  ===================
begin       HEXISTS (proof),      the transaction in the  listed by             ConfigurationError
            HSET (index)          index, nothing staged   ``list_in_doubt``,    (options, login,
                                                          aborted by the sweep  ACL), FatalError
                                                          or cleanup            (id committed)
write       XADD of each chunk    some chunks staged:     as begin              RetryableError
            to the staging        invisible                                     (server down, OOM)
            stream
pre-commit  last XADD, HEXISTS,   every chunk staged      once decided, the     as write;
            HSET                  (with ``appendfsync     driver commits it;    FatalError (the id
                                  always``: on disk)      else the sweep        was committed once)
                                                          aborts it
commit      the commit script:    before it: all staged;  recovery runs it      TransactionLost-
            checks, XADD of each  after it: all in the    again: proven         Error (a staged
            row, proof, DEL of    stream with proofs;     "already"; a batch    chunk gone: the
            staging (one script   between two scripts of  cut short resumes     server lost data),
            per                   a large batch: a        from its progress     RetryableError
            ``max_rows_per_       prefix visible, the
            script`` rows)        rest staged
abort       the abort script:     nothing, or what was    repeat it: absent ->  FatalError (its
            DEL of staging, HDEL  left                    NOT_FOUND             commit had begun)
==========  ====================  ======================  ====================  ===================

**Durability** (:mod:`~sinks.redis.durability`, checked before the first batch): the AOF on
with ``appendfsync always`` and ``maxmemory-policy noeviction``, or ``accept_loss_window_s``
naming the window a managed service's AOF may lose. **Replicas** do not change this: Redis
replicates asynchronously and ``WAIT`` only confirms receipt, so a failover to a replica that
had not received a commit loses it *and* its proof (the staged batch too): the batch is then
missing, reported by no one. Run the sink against a primary whose AOF is the durable copy;
a failover is a restore from backup (README, Redis).

**Proofs** are one field per committed transaction in a hash beside the stream, stamped with
the commit's time and dropped by ``purge_commit_records`` (cleanup's retention, 7 days by
default): a recovery later than that cannot prove a commit. Trimming the stream (``MAXLEN``,
``MINID``) never touches them; the sink itself never trims.

Privileges (an ACL user, :func:`~sinks.redis.errors.acl_rules`): the stream's key and
``{T}:twophase:*``, and the commands of :data:`~sinks.redis.errors.ACL_COMMANDS`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import pyarrow as pa

from sinks.redis.committer import RedisStreamCommitter
from sinks.redis.connection import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_PORT,
    DEFAULT_TIMEOUT_S,
    Client,
    RedisSettings,
    text,
)
from sinks.redis.durability import check_durability
from sinks.redis.entries import CHUNK_FIELD, packed, table_of
from sinks.redis.errors import FIX_TYPE, SYSTEM, refused
from sinks.redis.keys import StreamKeys
from twophase import Column, Handle, TransactionContext, TwoPhaseCommitSink, TxnId
from twophase.kit import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_TLS,
    SecretOption,
    Tls,
    TlsMode,
    batch_chunks,
    chunks,
    qualified_namespace,
    transaction_id_reused,
    validate_chunk_size,
)

log = logging.getLogger(__name__)

#: Rows one commit script moves at most: ~0.6 s of a server that serves no one else meanwhile
#: (measured: 100,000 entries in 575 ms; at ~870,000 a script passes Redis's 5 s
#: ``busy-reply-threshold`` and other clients get BUSY).
DEFAULT_MAX_ROWS_PER_SCRIPT = 100_000
STREAM_TYPES = ("stream", "none")


@dataclass
class RedisStreamTransaction:
    """One partition's staging (lives on the executor until pre-commit)."""

    txn_id: TxnId
    names: tuple[str, ...]
    stage: str
    chunks: int = 0
    rows: int = 0


class RedisStreamSink(TwoPhaseCommitSink[RedisStreamTransaction]):
    """Exactly-once entries into the Redis stream ``stream`` (module docstring).

    ``host``, ``port``, ``db``; ``cluster=True`` for a Redis Cluster (any node's address);
    ``username`` and ``password`` (clear text or a :class:`twophase.Secret`) for an ACL user;
    ``tls`` (``"verify"`` by default), ``ca_bundle``, ``client_cert``, ``client_key``
    (:class:`twophase.kit.Tls`). Each row becomes one entry, its columns the fields
    (:mod:`~sinks.redis.entries`); ``chunk_size`` rows are staged per entry;
    ``max_rows_per_script`` bounds one commit script; ``accept_loss_window_s`` the durability
    the preflight demands (:mod:`~sinks.redis.durability`).
    """

    kind: ClassVar[str] = "redis"

    def __init__(self, stream: str, *, host: str = "localhost", port: int = DEFAULT_PORT,
                 db: int = 0, username: str | None = None,
                 password: SecretOption | None = None, cluster: bool = False,
                 tls: TlsMode = DEFAULT_TLS, ca_bundle: str | None = None,
                 client_cert: str | None = None, client_key: str | None = None,
                 chunk_size: int = DEFAULT_CHUNK_SIZE,
                 max_rows_per_script: int = DEFAULT_MAX_ROWS_PER_SCRIPT,
                 accept_loss_window_s: float | None = None,
                 connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if not stream:
            raise refused("stream= is empty.", "name the target stream's key")
        if max_rows_per_script < 1:
            raise refused(f"max_rows_per_script={max_rows_per_script} is below 1.",
                          f"leave the default, {DEFAULT_MAX_ROWS_PER_SCRIPT}")
        if accept_loss_window_s is not None and accept_loss_window_s < 0:
            raise refused(f"accept_loss_window_s={accept_loss_window_s} is negative.",
                          "give the seconds of acknowledged writes the server may lose, or "
                          "None to demand appendfsync always")
        self.keys = StreamKeys(stream)
        self.settings = RedisSettings(
            host, port, db, username, password, cluster,
            Tls(tls, ca_bundle, client_cert, client_key, system=SYSTEM),
            connect_timeout_s, timeout_s)
        self.chunk_size = validate_chunk_size(SYSTEM, chunk_size)
        self.max_rows_per_script = max_rows_per_script
        self.accept_loss_window_s = accept_loss_window_s

    def __repr__(self) -> str:
        return f"RedisStreamSink({self.keys.stream!r}, {self.settings!r})"

    @property
    def stream(self) -> str:
        return self.keys.stream

    @property
    def where(self) -> str:
        return f"stream {self.stream!r} of {self.settings.address}"

    def default_namespace(self) -> str:
        return qualified_namespace(self.stream, self.settings.address)

    def committer(self) -> RedisStreamCommitter:
        return RedisStreamCommitter(self)

    # -- the driver's checks ---------------------------------------------------------------

    def check_schema(self, columns: Sequence[Column]) -> None:
        """Every Spark type has a text form; check the server's durability and that the
        stream's key holds a stream or nothing."""
        def check(client: Client) -> None:
            check_durability(client, self.accept_loss_window_s, self.where)
            kind = text(client.type(self.stream))
            if kind not in STREAM_TYPES:
                raise refused(f"{self.where}: the key holds a {kind}, not a stream.",
                              FIX_TYPE)
        self.settings.run(check, f"preflight of {self.where}")

    # -- the executor's side ---------------------------------------------------------------

    def begin_transaction(self, ctx: TransactionContext) -> RedisStreamTransaction:
        """Listed in the index first: a writer killed mid-way leaves a listed orphan."""
        txn = RedisStreamTransaction(ctx.txn_id, ctx.column_names, self.keys.stage(ctx.txn_id))
        self._index(txn, f"begin of {ctx.txn_id}")
        return txn

    def write(self, txn: RedisStreamTransaction, rows: Iterable[Sequence[Any]]) -> None:
        for chunk in chunks(rows, self.chunk_size):
            self._stage(txn, table_of(chunk, txn.names))

    def write_arrow(self, txn: RedisStreamTransaction, batches: Iterable[pa.RecordBatch]
                    ) -> None:
        for chunk in batch_chunks(batches, self.chunk_size):
            self._stage(txn, pa.Table.from_batches(chunk))

    def pre_commit(self, txn: RedisStreamTransaction) -> Handle:
        """Every chunk is staged (each XADD answered: with ``appendfsync always``, on disk);
        refused for an id committed before."""
        self._index(txn, f"pre-commit of {txn.txn_id}")
        return self.handle(txn.txn_id, txn.rows, chunks=txn.chunks)

    def discard(self, txn: RedisStreamTransaction) -> None:
        """Drop the staging now; if that fails too, the sweep or cleanup aborts it later."""
        try:
            self.committer().abort(self.handle(txn.txn_id, txn.rows))
        except Exception as exc:  # discard must not raise
            log.warning("discard of %s failed (the sweep aborts it later): %s", txn.txn_id, exc)

    def _index(self, txn: RedisStreamTransaction, what: str) -> None:
        """List the transaction as begun; refuse an id that was committed once."""
        def step(client: Client) -> bool:
            pipe = client.pipeline(transaction=False)
            pipe.hexists(self.keys.proofs, str(txn.txn_id))
            pipe.hset(self.keys.staged, str(txn.txn_id), txn.chunks)
            committed, _ = pipe.execute()
            return bool(committed)
        if self.settings.run(step, what):
            raise transaction_id_reused(txn.txn_id, where=self.where)

    def _stage(self, txn: RedisStreamTransaction, table: pa.Table) -> None:
        value = packed(table)
        self.settings.run(lambda client: client.xadd(txn.stage, {CHUNK_FIELD: value}),
                          f"staging of {table.num_rows} rows of {txn.txn_id}")
        txn.chunks += 1
        txn.rows += table.num_rows
