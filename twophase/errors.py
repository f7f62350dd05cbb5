"""The error taxonomy of twophase.

Every error a sink or the protocol raises is one of four kinds, and the kind decides what
happens next:

========================  =====================================================================
kind                      what the protocol does
========================  =====================================================================
``RetryableError``        backs off and tries again (bounded); then fails as fatal
``FatalError``            stops the query with the cause and the fix; nothing is half-visible
``FencedError``           stops this run: a newer run owns the query and will finish its work
``TransactionLostError``  stops the query: a *decided* transaction is gone, data may be lost
========================  =====================================================================

Messages are written for the operator who reads them at 3 a.m.: what happened, to which
transaction or file, and what to do about it.
"""

from __future__ import annotations


class TwoPhaseError(Exception):
    """Base of every error raised by twophase. ``fix`` tells the operator what to do."""

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        self.cause = message
        self.fix = fix
        super().__init__(f"{message} Fix: {fix}" if fix else message)


class RetryableError(TwoPhaseError):
    """A transient failure (lock wait, lost connection, throttling): retrying may succeed."""


class FatalError(TwoPhaseError):
    """A failure that retrying cannot cure: bad input, bad configuration, rejected request."""


class ConfigurationError(FatalError):
    """A missing or wrong option, or an unusable location; raised before anything is written."""


class SchemaMismatchError(FatalError):
    """The rows do not fit the target (unknown column, wrong type, violated constraint)."""


class StateCorruptError(FatalError):
    """The state file exists but cannot be trusted (checksum mismatch, unknown format)."""


class StateNewerError(StateCorruptError):
    """The state file (or a handle in it) was written by a newer twophase than this one: it is
    refused, not misread. The fix is to run that newer version."""


class FencedError(TwoPhaseError):
    """A newer run of the same query took over; this (zombie) run must not commit anything."""


class TransactionLostError(TwoPhaseError):
    """A decided transaction is gone from the external system (expired or aborted outside).

    Rows of that transaction may be lost. This is never swallowed: the batch stays pending in
    the state file, the query stops, and ``python -m twophase.status`` shows the transaction.
    """
