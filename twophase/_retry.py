"""Bounded retries with exponential backoff and jitter, for retryable errors only."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from twophase.errors import FatalError, RetryableError, TwoPhaseError

log = logging.getLogger(__name__)

DEFAULT_MAX_ATTEMPTS = 6
DEFAULT_INITIAL_BACKOFF_S = 0.1
DEFAULT_MAX_BACKOFF_S = 5.0
EXHAUSTED_FIX = ("fix the cause named above, then restart the query; an outage longer than "
                 "the retries is waited out by a RetryPolicy with more attempts or a longer "
                 "backoff")

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a retryable failure is retried before it becomes fatal."""

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    initial_backoff_s: float = DEFAULT_INITIAL_BACKOFF_S
    max_backoff_s: float = DEFAULT_MAX_BACKOFF_S

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.initial_backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError(f"invalid retry policy {self!r}: attempts >= 1, backoffs >= 0")

    def backoff_s(self, attempt: int) -> float:
        """Full-jitter backoff before attempt ``attempt + 1`` (attempts count from 1)."""
        ceiling = min(self.max_backoff_s, self.initial_backoff_s * 2 ** (attempt - 1))
        return random.uniform(ceiling / 2, ceiling)  # noqa: S311 - jitter, not secrecy

    def call(self, action: Callable[[], T], *, what: str,
             on_retry: Callable[[RetryableError], None] | None = None) -> T:
        """Run ``action``; retry it on RetryableError; after the last attempt raise FatalError.

        Errors that are not TwoPhaseErrors are the sink's unclassified failures: fatal, wrapped
        with ``what`` so the operator knows which step failed. ``on_retry`` is called with the
        error before each retry (the coordinator counts them).
        """
        for attempt in range(1, self.max_attempts + 1):
            try:
                return action()
            except RetryableError as exc:
                if attempt == self.max_attempts:
                    raise FatalError(
                        f"{what} still failing after {attempt} attempts: {exc.cause}",
                        fix=f"{EXHAUSTED_FIX} (the sink's advice: {exc.fix})" if exc.fix
                        else EXHAUSTED_FIX,
                    ) from exc
                if on_retry is not None:
                    on_retry(exc)
                pause = self.backoff_s(attempt)
                log.warning("%s failed (attempt %d/%d), retrying in %.2fs: %s",
                            what, attempt, self.max_attempts, pause, exc)
                time.sleep(pause)
            except TwoPhaseError:
                raise
            except Exception as exc:
                raise FatalError(
                    f"{what} failed with an unclassified error: {type(exc).__name__}: {exc}",
                    fix="the sink should classify this error; fix the cause and restart",
                ) from exc
        raise AssertionError("unreachable")  # pragma: no cover - the loop always returns or raises


DEFAULT_RETRY = RetryPolicy()
