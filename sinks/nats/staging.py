"""The staging stream the sink owns: pre-committed messages, and the proofs of commit.

One stream per target stream (default ``TWOPHASE_STAGE_<stream>``, file storage, limits
retention without limits), created by the preflight, holding two kinds of subject:

* ``twophase.stage.<stream>.<txn>``: a transaction's rows' payloads in order, a chunk of them
  per message (:func:`~sinks.nats.payload.framed`, up to 256 KiB: staging costs a message per
  chunk, not per row), each with its first row's ``Twophase-Index`` and its ``Twophase-Count``;
  published with acknowledgements by the executor, counted at pre-commit; purged once the
  transaction is committed (after its proof) or aborted;
* ``twophase.done.<stream>.<txn>``: the transaction's proof of commit, one message written
  after its chain is complete (its time is the commit's), published at most once
  (``Nats-Expected-Last-Subject-Sequence: 0``); purged by ``purge_commit_records``.

Subjects are listed through ``STREAM.INFO`` with ``subjects_filter`` (a subject and its message
count, without reading a message); a transaction's staged messages are read back by an ordered
consumer from the first staged sequence its handle names.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Iterable
from datetime import datetime

from nats.js import api
from nats.js.errors import NotFoundError

from sinks.nats.connection import Connection
from sinks.nats.errors import (
    FIX_STAGING_NAME,
    STREAM_NOT_FOUND,
    SYSTEM,
    WRONG_LAST_SEQUENCE,
    is_api_error,
)
from sinks.nats.payload import chunked, framed, unframed
from sinks.nats.subjects import (
    COUNT_HEADER,
    EXPECTED_LAST_SUBJECT_SEQUENCE,
    INDEX_HEADER,
    TXN_HEADER,
    Layout,
)
from twophase import ConfigurationError, FatalError, TxnId

log = logging.getLogger(__name__)

#: Staged publishes in flight on one connection before their acks are awaited.
DEFAULT_STAGE_WINDOW = 1000
#: How long an ordered consumer may stay silent before reading staged messages fails.
READ_TIMEOUT_S = 10.0


async def ensure_stream(connection: Connection, layout: Layout) -> None:
    """Create the staging stream if it does not exist; refuse one that does not hold the
    layout's subjects."""
    try:
        info = await connection.js.stream_info(layout.staging_stream)
    except NotFoundError as exc:
        if not is_api_error(exc, STREAM_NOT_FOUND):
            raise
        await connection.js.add_stream(
            name=layout.staging_stream, subjects=layout.staging_subjects,
            storage=api.StorageType.FILE, retention=api.RetentionPolicy.LIMITS,
            description=f"twophase: staged messages and proofs of commit for {layout.stream}")
        log.info("created the staging stream %s", layout.staging_stream)
        return
    subjects = set(info.config.subjects or ())
    if not set(layout.staging_subjects) <= subjects:
        raise ConfigurationError(
            f"{SYSTEM}: the staging stream {layout.staging_stream} captures {sorted(subjects)}, "
            f"not the sink's {layout.staging_subjects}.", fix=FIX_STAGING_NAME)


async def stage(connection: Connection, subject: str, payloads: Iterable[bytes], first_index: int,
                window: int = DEFAULT_STAGE_WINDOW) -> tuple[int, int, int]:
    """Publish ``payloads`` to ``subject`` in order, a chunk of them per staged message
    (:func:`~sinks.nats.payload.framed`: its first row's index and its row count in the
    headers), ``window`` acks in flight: the first sequence, the chunks and the rows staged
    (the acks all received)."""
    first_seq, chunks, rows, pending = 0, 0, 0, []
    for chunk in chunked(payloads):
        headers = {INDEX_HEADER: str(first_index + rows), COUNT_HEADER: str(len(chunk))}
        pending.append(await connection.js.publish_async(subject, framed(chunk),
                                                         headers=headers))
        chunks, rows = chunks + 1, rows + len(chunk)
        if len(pending) >= window:
            acked = await _acked(pending)
            first_seq, pending = first_seq or acked, []
    if pending:
        acked = await _acked(pending)
        first_seq = first_seq or acked
    return first_seq, chunks, rows


async def _acked(pending: list[asyncio.Future[api.PubAck]]) -> int:
    """Wait for every ack of a window (the first failure raised): the window's first seq."""
    acks = await asyncio.gather(*pending)
    return acks[0].seq


async def subjects(connection: Connection, layout: Layout, subject_filter: str) -> dict[str, int]:
    """The staging stream's subjects matching ``subject_filter``, with their message counts
    ({} when the stream does not exist)."""
    try:
        info = await connection.js.stream_info(layout.staging_stream,
                                               subjects_filter=subject_filter)
    except NotFoundError as exc:
        if is_api_error(exc, STREAM_NOT_FOUND):
            return {}
        raise
    return dict(info.state.subjects or {})


async def count(connection: Connection, layout: Layout, txn_id: TxnId) -> int:
    """How many messages the transaction has staged."""
    subject = layout.stage_subject(txn_id)
    return (await subjects(connection, layout, subject)).get(subject, 0)


async def read(connection: Connection, layout: Layout, txn_id: TxnId, *, first_seq: int,
               start: int, chunks: int) -> AsyncGenerator[bytes, None]:
    """The payloads of the transaction's staged rows from ``start`` on, in order, read from
    its ``chunks`` staged messages, each checked to begin at the row it should."""
    subject = layout.stage_subject(txn_id)
    config = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
                                opt_start_seq=max(first_seq, 1))
    subscription = await connection.js.subscribe(subject, stream=layout.staging_stream,
                                                 ordered_consumer=True, config=config)
    try:
        row = 0
        for _ in range(chunks):
            message = await subscription.next_msg(timeout=READ_TIMEOUT_S)
            says = (message.headers or {}).get(INDEX_HEADER)
            if says is None or int(says) != row:
                raise FatalError(
                    f"{SYSTEM}: a staged chunk of {txn_id} in {layout.staging_stream} is out "
                    f"of place (it begins at row {says}, where row {row} was due).",
                    fix="nothing but the sink may publish to twophase.stage.>: find the "
                        "writer, then abort the transaction and replay its batch")
            payloads = unframed(message.data)
            for payload in payloads[max(start - row, 0):]:
                yield payload
            row += len(payloads)
    finally:
        await subscription.unsubscribe()


async def purge(connection: Connection, layout: Layout, txn_id: TxnId) -> None:
    """Drop the transaction's staged messages (a no-op when there are none)."""
    await connection.js.purge_stream(layout.staging_stream, subject=layout.stage_subject(txn_id))


# -- proofs of commit ------------------------------------------------------------------------------

async def proof_time(connection: Connection, layout: Layout, txn_id: TxnId) -> datetime | None:
    """When the transaction's proof of commit was written, None if there is none."""
    try:
        message = await connection.js.get_last_msg(layout.staging_stream,
                                                   layout.proof_subject(txn_id))
    except NotFoundError:
        return None
    return message.time


async def write_proof(connection: Connection, layout: Layout, txn_id: TxnId, messages: int,
                      last_seq: int) -> None:
    """Record that the transaction's chain is complete (once: a second write is refused by
    the subject's compare-and-set, and that refusal means the proof is there)."""
    headers = {TXN_HEADER: str(txn_id), COUNT_HEADER: str(messages),
               EXPECTED_LAST_SUBJECT_SEQUENCE: "0"}
    try:
        await connection.js.publish(layout.proof_subject(txn_id), str(last_seq).encode(),
                                    headers=headers)
    except Exception as exc:
        if not is_api_error(exc, WRONG_LAST_SEQUENCE):
            raise


async def purge_proof(connection: Connection, layout: Layout, txn_id: TxnId) -> None:
    await connection.js.purge_stream(layout.staging_stream, subject=layout.proof_subject(txn_id))
