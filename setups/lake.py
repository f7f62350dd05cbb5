"""What the lake setups' users share: committing a decided batch as the coordinator does (its
commit stages, each as its committer commits a stage, then ``finish_batch``), through a given
committer or a new one, with a racing committer's retryable errors retried (tests, benchmarks)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from twophase import (
    CommitOutcome,
    Committer,
    Handle,
    RetryableError,
    StageCommits,
    TwoPhaseCommitSink,
)
from twophase.testing.contract import NAMESPACE

#: How often a committer retries a lost race before the error stands.
RACE_ATTEMPTS = 5


def commit_decided(committer: Committer, handles: Sequence[Handle]) -> list[CommitOutcome]:
    """As the coordinator commits a decided batch: its stages, each through its committer's
    ``commit_handles``, then finish_batch."""
    outcomes = [outcome for stage in committer.commit_stages(handles)
                for outcome in stage.committer.commit_handles(stage.handles,
                                                              StageCommits(stage.committer))]
    committer.finish_batch(NAMESPACE, handles[0].txn_id.batch, handles)
    return outcomes


def commit_batch(sink: TwoPhaseCommitSink[Any], handles: Sequence[Handle], *,
                 committer: Committer | None = None,
                 retried: list[RetryableError] | None = None) -> list[CommitOutcome]:
    """:func:`commit_decided`; retryable errors retried (a racing committer), and kept in
    ``retried``."""
    with contextlib.ExitStack() as stack:
        own = committer or stack.enter_context(sink.committer())
        for attempt in range(RACE_ATTEMPTS):
            try:
                return commit_decided(own, handles)
            except RetryableError as exc:
                if attempt == RACE_ATTEMPTS - 1:
                    raise
                if retried is not None:
                    retried.append(exc)
        raise AssertionError("unreachable")


#: cleanup's ``--older-than`` in the tests of the cron commands: the contract suite opens every
#: transaction at the test session's start (``OPENED_AT``), so by a session's tenth minute the
#: default age (600 s) would take the current run's undecided transaction for an orphan.
YOUNG_ENOUGH = "1d"
