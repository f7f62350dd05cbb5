"""twophase: exactly-once delivery from PySpark into external systems by two-phase commit.

The public API lives here; Spark entry points are in :mod:`twophase.spark`, prebuilt sinks in
the ``sinks`` package. Everything in modules whose names start with ``_`` is internal.
"""

from twophase._handle import Handle, TxnId
from twophase._retry import RetryPolicy
from twophase.errors import (
    ConfigurationError,
    FatalError,
    FencedError,
    RetryableError,
    SchemaMismatchError,
    StateCorruptError,
    TransactionLostError,
    TwoPhaseError,
)
from twophase.sink import (
    AbortOutcome,
    Column,
    CommitOutcome,
    TransactionContext,
    TwoPhaseCommitSink,
)

__all__ = [
    "AbortOutcome",
    "Column",
    "CommitOutcome",
    "ConfigurationError",
    "FatalError",
    "FencedError",
    "Handle",
    "RetryPolicy",
    "RetryableError",
    "SchemaMismatchError",
    "StateCorruptError",
    "TransactionContext",
    "TransactionLostError",
    "TwoPhaseCommitSink",
    "TwoPhaseError",
    "TxnId",
]
__version__ = "0.1.0"
