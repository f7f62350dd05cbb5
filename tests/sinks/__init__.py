"""Sink tier: one room per prebuilt sink (``sinks/<name>/``), and here the tests of several."""

from __future__ import annotations

import json
import pickle
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from twophase import CommitOutcome, Handle, RetryableError, TwoPhaseCommitSink
from twophase.kit import WholeBatchCommitter
from twophase.testing.contract import commit, prepare

#: The separate options a connection URL holds (with the password and the CA bundle).
URL_PARTS = ("host", "port", "user", "database", "tls")


def as_connection_url(scheme: str, options: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """A database sink's separate connection options as one URL of ``scheme`` (user and
    password percent-encoded, TLS in its query), and the options left beside it."""
    left = dict(options)
    password = left.pop("password")
    where = {name: left.pop(name) for name in URL_PARTS}
    query = f"tls={where['tls']}" + (f"&ca_bundle={quote(left.pop('ca_bundle'))}"
                                     if "ca_bundle" in left else "")
    url = (f"{scheme}://{quote(where['user'], safe='')}:{quote(password, safe='')}"
           f"@{where['host']}:{where['port']}/{where['database']}?{query}")
    return url, left


def as_connection_json(options: Mapping[str, Any], names: Iterable[str]
                       ) -> tuple[str, dict[str, Any]]:
    """A sink's separate connection options (those of ``names``: the sink's
    ``CONNECTION_OPTIONS``) as the JSON object ``connection=Secret(...)`` holds, and the
    options left beside it."""
    left = dict(options)
    held = {name: left.pop(name) for name in names if name in left}
    return json.dumps(held), left


def committed_through_its_pickled_copy(sink: TwoPhaseCommitSink[Any], secret: str,
                                        rows: Sequence[Sequence[Any]], *shown: object) -> None:
    """``sink`` as Spark ships it to an executor: its pickle holds no ``secret``, nor does the
    ``repr`` of it or of ``shown``; the pickled copy pre-commits ``rows``, ``sink`` commits."""
    assert secret.encode() not in pickle.dumps(sink)
    assert all(secret not in repr(thing) for thing in (sink, *shown))
    handle = prepare(pickle.loads(pickle.dumps(sink)), rows)
    assert commit(sink, handle) is CommitOutcome.COMMITTED


def settle(sink: TwoPhaseCommitSink[Any], handles: Sequence[Handle]) -> list[CommitOutcome]:
    """A batch's ``handles`` settled at once, as the driver commits a stage of a sink whose
    committer makes a batch visible in one commit (:class:`twophase.kit.WholeBatchCommitter`):
    each one's outcome, in order."""
    with sink.committer() as committer:
        assert isinstance(committer, WholeBatchCommitter)
        outcomes = committer.settle(tuple(handles))
    return [outcomes[handle.txn_id] for handle in handles]


class SettlingInAThread:
    """A batch settled (:func:`settle`) in a thread of its own, for a test that kills the
    server under it: the :class:`RetryableError` its dying connection raises is kept in
    :attr:`failed`."""

    def __init__(self, sink: TwoPhaseCommitSink[Any], handles: Sequence[Handle]) -> None:
        self.failed: list[RetryableError] = []
        self.thread = threading.Thread(target=self._settle, args=(sink, handles))
        self.thread.start()

    def _settle(self, sink: TwoPhaseCommitSink[Any], handles: Sequence[Handle]) -> None:
        try:
            settle(sink, handles)
        except RetryableError as exc:
            self.failed.append(exc)
