"""The names the sink writes under: the staging stream, a transaction's staging and proof
subjects, and the headers of a committed message.

A transaction id (``namespace.query.epoch.batch.partition.attempt.created``, letters, digits,
``_``, ``-`` and dots) becomes ONE subject token by writing its dots as ``~`` (a character ids
never hold, allowed in a token): ``twophase.stage.<stream>.<token>``. The mapping is one to one,
so a staging stream's subjects name their transactions and a listing reads them back
(:meth:`Layout.txn_of`); no token of an id can be a wildcard.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sinks.nats.errors import FIX_SUBJECT, SYSTEM
from twophase import ConfigurationError, TxnId

STAGE_PREFIX = "twophase.stage"
PROOF_PREFIX = "twophase.done"
#: A transaction id's dots, in its subject token.
DOT_STAND_IN = "~"
#: The staging stream's default name: this and the target stream's name.
STAGING_STREAM_PREFIX = "TWOPHASE_STAGE_"

# -- the headers of every committed message -----------------------------------------------------
TXN_HEADER = "Twophase-Txn"
INDEX_HEADER = "Twophase-Index"
COUNT_HEADER = "Twophase-Count"
MSG_ID_HEADER = "Nats-Msg-Id"
EXPECTED_LAST_SUBJECT_SEQUENCE = "Nats-Expected-Last-Subject-Sequence"
EXPECTED_LAST_SEQUENCE = "Nats-Expected-Last-Sequence"

#: A literal subject: dot-separated tokens without wildcards or white space.
LITERAL_SUBJECT = re.compile(r"[^.*>\s]+(\.[^.*>\s]+)*")


def token_of(txn_id: TxnId) -> str:
    """The transaction id as one subject token."""
    return str(txn_id).replace(".", DOT_STAND_IN)


def msg_id(txn_id: TxnId, index: int) -> str:
    """The ``Nats-Msg-Id`` of the transaction's message ``index``."""
    return f"{txn_id}/{index}"


def check_subject(option: str, subject: str) -> str:
    """``subject`` if it is literal, else a ConfigurationError naming ``option``."""
    if not LITERAL_SUBJECT.fullmatch(subject):
        raise ConfigurationError(f"{SYSTEM}: {option}={subject!r} is not a literal subject.",
                                 fix=FIX_SUBJECT)
    return subject


@dataclass(frozen=True)
class Layout:
    """The subjects of one target stream's transactions in its staging stream."""

    stream: str
    staging_stream: str

    @property
    def stage_filter(self) -> str:
        return f"{STAGE_PREFIX}.{self.stream}.*"

    @property
    def proof_filter(self) -> str:
        return f"{PROOF_PREFIX}.{self.stream}.*"

    @property
    def staging_subjects(self) -> list[str]:
        return [self.stage_filter, self.proof_filter]

    def stage_subject(self, txn_id: TxnId) -> str:
        return f"{STAGE_PREFIX}.{self.stream}.{token_of(txn_id)}"

    def proof_subject(self, txn_id: TxnId) -> str:
        return f"{PROOF_PREFIX}.{self.stream}.{token_of(txn_id)}"

    @staticmethod
    def txn_of(subject: str) -> TxnId | None:
        """The transaction a staging or proof subject names (None: not one of ours)."""
        token = subject.rpartition(".")[2]
        try:
            return TxnId.parse(token.replace(DOT_STAND_IN, "."))
        except ValueError:
            return None
