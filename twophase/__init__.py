"""twophase: exactly-once delivery from PySpark into external systems by two-phase commit.

The public API lives here; Spark entry points are in :mod:`twophase.spark`, the pieces every
sink reuses in :mod:`twophase.kit`, prebuilt sinks in the ``sinks`` package. Everything in
modules whose names start with ``_`` is internal: a sink imports only ``twophase``,
``twophase.kit`` and ``twophase.errors`` (its tests also ``twophase.testing``), which
``tests/test_layering.py`` enforces.
"""

from twophase._handle import TXN_ID_MAX_LENGTH, Handle, TxnId
from twophase._retry import RetryPolicy
from twophase._secrets import Secret
from twophase.errors import (
    ConfigurationError,
    FatalError,
    FencedError,
    RetryableError,
    SchemaMismatchError,
    StateCorruptError,
    StateNewerError,
    TransactionLostError,
    TwoPhaseError,
)
from twophase.group import SinkGroup
from twophase.sink import (
    AbortOutcome,
    Column,
    CommitOutcome,
    CommitStage,
    Committer,
    StageCommits,
    TransactionContext,
    TwoPhaseCommitSink,
)

__all__ = [
    "TXN_ID_MAX_LENGTH",
    "AbortOutcome",
    "Column",
    "CommitOutcome",
    "CommitStage",
    "Committer",
    "ConfigurationError",
    "FatalError",
    "FencedError",
    "Handle",
    "RetryPolicy",
    "RetryableError",
    "SchemaMismatchError",
    "Secret",
    "SinkGroup",
    "StageCommits",
    "StateCorruptError",
    "StateNewerError",
    "TransactionContext",
    "TransactionLostError",
    "TwoPhaseCommitSink",
    "TwoPhaseError",
    "TxnId",
]
__version__ = "0.5.0"
