"""The sink's keys beside a target stream, all in the stream's cluster slot.

A Redis Cluster hashes a key by its hash tag (the text between its first ``{`` and the next
``}``, if not empty), else by the whole key; a script may only touch keys of one slot. Every
key of the sink therefore begins with ``{T}``, T being the stream's own hash tag (``events{eu}``
-> ``eu``) or, without one, the stream's whole name (``orders`` -> ``{orders}``): the staging
streams, the proofs and the index all hash to the stream's slot, on a cluster as on one server.

=========================================  ====================================================
key                                        holds
=========================================  ====================================================
``{T}:twophase:<stream>:stage:<txn id>``   a transaction's staged rows: a stream of chunks
``{T}:twophase:<stream>:staged``           a hash: every transaction begun and not yet
                                           resolved -> when it began (the listing in doubt)
``{T}:twophase:<stream>:proofs``           a hash: every committed transaction -> when its
                                           commit ran (the server's clock, microseconds)
``{T}:twophase:<stream>:moved``            a hash: a transaction whose commit spans several
                                           scripts -> the chunks moved so far
=========================================  ====================================================
"""

from __future__ import annotations

from dataclasses import dataclass

from twophase import ConfigurationError, TxnId

PREFIX = "twophase"


def hash_tag(key: str) -> str:
    """What a cluster hashes of ``key``: its hash tag, else all of it (the cluster spec)."""
    start = key.find("{")
    if start != -1:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1:end]
    return key


@dataclass(frozen=True)
class StreamKeys:
    """The keys of the sink writing into ``stream``."""

    stream: str

    def __post_init__(self) -> None:
        if hash_tag(self.base) != hash_tag(self.stream):  # a "}" with no tag before it
            raise ConfigurationError(
                f"RedisStreamSink: the stream's name {self.stream!r} holds a brace that is no "
                "hash tag, so the sink's keys cannot share its cluster slot.",
                fix="name the stream without braces, or with a hash tag: 'orders{eu}'")

    @property
    def tag(self) -> str:
        return "{" + hash_tag(self.stream) + "}"

    @property
    def base(self) -> str:
        return f"{self.tag}:{PREFIX}:{self.stream}:"

    @property
    def pattern(self) -> str:
        """The ACL key pattern that covers every key of the sink (and only its own)."""
        return f"{self.tag}:{PREFIX}:*"

    @property
    def staged(self) -> str:
        return self.base + "staged"

    @property
    def proofs(self) -> str:
        return self.base + "proofs"

    @property
    def moved(self) -> str:
        return self.base + "moved"

    def stage(self, txn_id: TxnId) -> str:
        return f"{self.base}stage:{txn_id}"

    @property
    def stages(self) -> str:
        """The pattern (``SCAN MATCH``) of every staging stream of the sink."""
        return f"{self.base}stage:*"

    def bookkeeping(self) -> list[str]:
        """The keys every script takes first: the target, the proofs, the index, the progress."""
        return [self.stream, self.proofs, self.staged, self.moved]
