"""The compare-and-set chain: how a transaction's staged messages become the target subject's.

Every committed message carries ``Twophase-Txn``, ``Twophase-Index`` and ``Twophase-Count``,
and is published with an expectation of the message before it: a sequential chain's every
message with ``Nats-Expected-Last-Subject-Sequence`` (and ``Nats-Msg-Id: <txn>/<index>``), a
pipelined run's first one with both and the stream-level ``Nats-Expected-Last-Sequence``, its
others with the stream-level one alone (the sink owns the stream: it is the subject's too;
four headers instead of six, a third of the chain's CPU). The server stores a message only if
the last one is still the one it names. So the subject is a
chain in which each message names its predecessor, whatever the duplicate window: a replay of
a message (a retry, a recovery, a zombie) finds the subject moved on and is refused (10071,
``wrong last sequence``), never stored twice.

The subject's last message, its **tip** (``STREAM.MSG.GET last_by_subj``), says where a
transaction stands: a tip of this transaction at index ``k`` resumes the chain at ``k + 1``
after its sequence (complete when ``k + 1`` is its count); any other tip starts it at 0 after
the tip. The committer (:mod:`~sinks.nats.committer`) keeps the rest of the rules: the proofs,
and never starting a chain after an incomplete one.

Two publishers, chosen per settle:

* :class:`SequentialChain`: each message waits for the previous one's ack (its sequence is the
  next one's expectation). Any stream layout: other subjects of the stream may be written
  meanwhile.
* :class:`PipelinedChain`: where the sink owns the target stream (its only subject is the
  sink's), sequences are consecutive, so every expectation is known in advance: a window of
  messages is in flight at once, each also carrying the stream-level
  ``Nats-Expected-Last-Sequence``, so a foreign message anywhere in the stream stops the
  window at that point (every later message of the window then fails its expectation too).

**Atomic batches** (nats-server 2.12, ADR-50, ``allow_atomic`` on the stream): a third
publisher would override :meth:`Chain.publish_run` to send each run of up to 1,000 messages as
one batch (``Nats-Batch-Id``, ``Nats-Batch-Sequence``, ``Nats-Batch-Commit`` on the last), the
first message carrying the subject's compare-and-set. A reader would then see each run whole
(a batch of at most 1,000 messages at once, not a prefix), and a crash inside a run would
leave nothing of it; the tip rule stays as it is, run by run. nats-py 2.16 has no batch API.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import nats.errors
from nats.aio.msg import Msg
from nats.js import api
from nats.js.errors import APIError, NoStreamResponseError, NotFoundError

from sinks.nats.connection import Connection
from sinks.nats.errors import SYSTEM
from sinks.nats.subjects import (
    COUNT_HEADER,
    EXPECTED_LAST_SEQUENCE,
    EXPECTED_LAST_SUBJECT_SEQUENCE,
    INDEX_HEADER,
    MSG_ID_HEADER,
    TXN_HEADER,
    msg_id,
)
from twophase import RetryableError, TxnId

log = logging.getLogger(__name__)

#: The run :meth:`Chain.publish_run` publishes at a time.
DEFAULT_CHAIN_WINDOW = 500
#: Messages in flight at once in a pipelined chain: one run, its acks awaited together.
DEFAULT_PIPELINED_WINDOW = 5000
#: How long a pipelined run's acks may take, all of them (then the chain stops, to be resumed
#: from the subject's tip by the retry).
RUN_ACKS_TIMEOUT_S = 30.0
#: A JetStream ack with nothing but its stream and sequence (a duplicate, a domain or an
#: error has more fields: read in full).
PLAIN_ACK = re.compile(rb'\{"stream":"([^"]*)",\s*"seq":(\d+)\}')
#: How often a run waiting for its acks looks whether its connection has closed.
CLOSED_POLL_S = 0.05


@dataclass(frozen=True)
class Tip:
    """The target subject's last message: its sequence (0: the subject is empty) and the
    transaction, index and count it carries (None: not a twophase message)."""

    seq: int = 0
    txn: str | None = None
    index: int = -1
    count: int = 0

    @classmethod
    def of(cls, message: api.RawStreamMsg) -> Tip:
        headers = message.headers or {}
        txn = headers.get(TXN_HEADER)
        if txn is None:
            return cls(message.seq or 0)
        return cls(message.seq or 0, txn, int(headers.get(INDEX_HEADER, -1)),
                   int(headers.get(COUNT_HEADER, 0)))

    @property
    def complete(self) -> bool:
        """Whether the tip's transaction has its last message in the subject (a foreign
        message or none counts as complete: no chain of ours is open)."""
        return self.txn is None or self.index == self.count - 1

    def is_of(self, txn_id: TxnId) -> bool:
        return self.txn == str(txn_id)


@dataclass(frozen=True)
class Target:
    """The target stream and subject of the chain."""

    stream: str
    subject: str

    async def tip(self, connection: Connection) -> Tip:
        try:
            return Tip.of(await connection.js.get_last_msg(self.stream, self.subject))
        except NotFoundError:
            return Tip()

    async def owned(self, connection: Connection) -> tuple[bool, int]:
        """Whether the sink owns the stream (its only subject is the sink's) and the stream's
        last sequence."""
        info = await connection.js.stream_info(self.stream)
        return list(info.config.subjects or ()) == [self.subject], info.state.last_seq


@dataclass
class Chain:
    """Publishes one transaction's messages ``start`` to ``count - 1`` after ``tip_seq``: the
    headers, and the sequence of what it published (see the module docstring)."""

    connection: Connection
    target: Target
    txn_id: TxnId
    count: int
    window: int = DEFAULT_CHAIN_WINDOW

    def __post_init__(self) -> None:
        self.txn, self.count_text = str(self.txn_id), str(self.count)

    def headers(self, index: int) -> dict[str, str]:
        return {TXN_HEADER: self.txn, INDEX_HEADER: str(index), COUNT_HEADER: self.count_text,
                MSG_ID_HEADER: msg_id(self.txn_id, index)}

    async def publish(self, payloads: AsyncIterator[bytes], start: int, tip_seq: int) -> int:
        """Publish the payloads (messages ``start`` on) in runs of :attr:`window`; the last
        published sequence."""
        run: list[bytes] = []
        index, last = start, tip_seq
        async for payload in payloads:
            run.append(payload)
            if len(run) == self.window:
                last = await self.publish_run(run, index, last)
                index, run = index + len(run), []
        if run:
            last = await self.publish_run(run, index, last)
        return last

    async def publish_run(self, run: list[bytes], first_index: int, last_seq: int) -> int:
        """Publish one run of consecutive messages after ``last_seq``; the sequence of its
        last. The extension point of another publishing mode (an atomic batch: module
        docstring)."""
        raise NotImplementedError

    def check_ack(self, ack: api.PubAck, index: int, expected_seq: int | None = None) -> int:
        """An ack's sequence; a duplicate (the same ``Nats-Msg-Id`` inside the duplicate
        window: the message was stored before) or an unexpected sequence stops the chain, to
        be resumed from the subject's tip by the retry."""
        if ack.duplicate or (expected_seq is not None and ack.seq != expected_seq):
            raise RetryableError(
                f"{SYSTEM}: message {index} of {self.txn_id} into {self.target.subject} was "
                f"acked as {'a duplicate' if ack.duplicate else 'sequence'} {ack.seq}, not as "
                "the next of its chain.",
                fix="retried automatically from the subject's last message; if it persists, "
                    "make sure nothing else publishes to the sink's subject")
        return ack.seq


class SequentialChain(Chain):
    """Each message after the previous one's ack."""

    async def publish_run(self, run: list[bytes], first_index: int, last_seq: int) -> int:
        for offset, payload in enumerate(run):
            index = first_index + offset
            headers = {**self.headers(index), EXPECTED_LAST_SUBJECT_SEQUENCE: str(last_seq)}
            ack = await self.connection.js.publish(self.target.subject, payload,
                                                   headers=headers)
            last_seq = self.check_ack(ack, index)
        return last_seq


@dataclass
class PipelinedChain(Chain):
    """A run in flight at once, every expectation predicted (the sink owns the stream).

    The run's messages are published as plain core-NATS publishes whose replies (the
    JetStream acks) come to one wildcard inbox of the run, and the acks are checked once all
    are in: no future, request or header parsing per message in the client (a third of
    ``publish_async``'s cost, measured: 11 against 17 microseconds of CPU a message)."""

    stream_last: int = 0
    window: int = DEFAULT_PIPELINED_WINDOW

    async def publish_run(self, run: list[bytes], first_index: int, last_seq: int) -> int:
        client = self.connection.client
        inbox = client.new_inbox()
        acks: list[Msg | None] = [None] * len(run)
        missing = [len(run)]
        arrived = asyncio.get_running_loop().create_future()

        async def on_ack(message: Msg) -> None:
            offset = int(message.subject.rpartition(".")[2])
            if acks[offset] is None:
                acks[offset] = message
                missing[0] -= 1
            if not missing[0] and not arrived.done():
                arrived.set_result(None)

        subscription = await client.subscribe(f"{inbox}.*", cb=on_ack)
        try:
            first = {**self.headers(first_index), EXPECTED_LAST_SEQUENCE: str(self.stream_last),
                     EXPECTED_LAST_SUBJECT_SEQUENCE: str(last_seq)}
            for offset, payload in enumerate(run):
                headers = first if offset == 0 else self.pipelined_headers(
                    first_index + offset, self.stream_last + offset)
                await client.publish(self.target.subject, payload, reply=f"{inbox}.{offset}",
                                     headers=headers)
            await self._acks_of_run(arrived)
        finally:
            if not client.is_closed:
                await subscription.unsubscribe()
        for offset, ack in enumerate(acks):
            assert ack is not None
            self.check_ack(pub_ack(ack), first_index + offset, self.stream_last + offset + 1)
        self.stream_last += len(run)
        return self.stream_last

    def pipelined_headers(self, index: int, stream_expected: int) -> dict[str, str]:
        """A message's headers after the run's first: the stream-level expectation alone
        (the sink owns the stream, so it is the subject's too) and no ``Nats-Msg-Id`` (the
        compare-and-set refuses a replay; the first message of each run carries both, as a
        sequential chain's messages do)."""
        return {TXN_HEADER: self.txn, INDEX_HEADER: str(index), COUNT_HEADER: self.count_text,
                EXPECTED_LAST_SEQUENCE: str(stream_expected)}


    async def _acks_of_run(self, arrived: asyncio.Future[None]) -> None:
        """Wait for a run's acks; a connection that closed meanwhile (the server gone) fails
        the run at once, not after :data:`RUN_ACKS_TIMEOUT_S`."""
        deadline = asyncio.get_running_loop().time() + RUN_ACKS_TIMEOUT_S
        while not arrived.done():
            if self.connection.client.is_closed:
                raise nats.errors.ConnectionClosedError
            if asyncio.get_running_loop().time() > deadline:
                raise nats.errors.TimeoutError
            await asyncio.wait({arrived}, timeout=CLOSED_POLL_S)


def pub_ack(reply: Msg) -> api.PubAck:
    """A JetStream ack from its reply, as nats-py's ``publish`` reads it: an error reply
    raised as nats-py raises it, no stream listening as :class:`NoStreamResponseError`. A
    plain ack (``{"stream":...,"seq":N}``) is read by its sequence alone."""
    if not reply.data:  # a status reply (503: no responders), headers only
        raise NoStreamResponseError
    plain = PLAIN_ACK.fullmatch(reply.data)
    if plain is not None:
        return api.PubAck(stream=plain.group(1).decode(), seq=int(plain.group(2)))
    answer = json.loads(reply.data)
    if "error" in answer:
        APIError.from_error(answer["error"])
    return api.PubAck.from_response(answer)
