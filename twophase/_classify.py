"""Raising a system's errors as twophase's: :func:`classified` (re-exported by
:mod:`twophase.kit`), here so that the framework's own modules (the state store) use the one
the sinks use without importing the kit."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from twophase._handle import Handle, TxnId
from twophase.errors import FatalError, TransactionLostError, TwoPhaseError

#: A sink's single classification function: a system error and the step it broke -> verdict.
Classify = Callable[[BaseException, str], TwoPhaseError]


@contextlib.contextmanager
def classified(classify: Classify, what: str,
               errors: type[BaseException] | tuple[type[BaseException], ...] = Exception,
               *, on_error: Callable[[], object] | None = None) -> Iterator[None]:
    """Raise ``classify(exc, what)`` for a system error ``exc`` of ``errors`` in the block.

    Errors of twophase's own taxonomy pass through unchanged. ``on_error`` runs first on any
    failure of the block (say, ``lambda: sink.discard(txn)``: a writer's transaction that
    failed is never committed).
    """
    try:
        yield
    except BaseException as exc:
        if on_error is not None:
            on_error()
        if isinstance(exc, errors) and not isinstance(exc, TwoPhaseError):
            raise classify(exc, what) from exc
        raise


def transaction_lost(handle: Handle, *, where: str, why: str) -> TransactionLostError:
    """A decided transaction is neither committable nor provably committed in ``where``."""
    txn = handle.txn_id
    return TransactionLostError(
        f"transaction {txn} ({handle.rows} rows of batch {txn.batch}, partition "
        f"{txn.partition}) was decided, but {where} can neither commit it nor prove it "
        f"committed: {why}. Its rows may be missing there.",
        fix=f"look for the rows of batch {txn.batch} in {where}; if they are missing, "
        "re-deliver them from the source, then run `python -m twophase.cleanup --state "
        f"<state location> --forget-batch {txn.batch}`",
    )


def transaction_id_reused(txn_id: TxnId, *, where: str) -> FatalError:
    """``pre_commit`` of an id that ``where`` has already committed once."""
    return FatalError(
        f"transaction id {txn_id} was already committed once in {where}; committing it again "
        "would silently drop these rows (a state file restored from an older backup?).",
        fix="restart the query: a new run opens its transactions under a new epoch",
    )
