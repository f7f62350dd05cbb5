"""Raising a system's errors as twophase's: :func:`classified` (re-exported by
:mod:`twophase.kit`), here so that the framework's own modules (the state store) use the one
the sinks use without importing the kit."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from twophase.errors import TwoPhaseError

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
