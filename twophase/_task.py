"""What a task does, Spark aside: open a transaction, deliver its rows, pre-commit it.

Used by the Spark adapters on executors and by :mod:`twophase.testing` to drive a sink the
same way without Spark.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from twophase._handle import Handle, TxnId
from twophase._retry import DEFAULT_RETRY, RetryPolicy
from twophase._rows import with_utc_timestamps
from twophase.sink import TransactionContext, TwoPhaseCommitSink

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

#: What a task does with the open transaction: hand it its rows or record batches.
Delivery = Callable[[TwoPhaseCommitSink[Any], Any], None]


def run_transaction(
    sink: TwoPhaseCommitSink[Any], ctx: TransactionContext, deliver: Delivery, *,
    retry: RetryPolicy = DEFAULT_RETRY, discard_on_failure: bool = True,
) -> Handle:
    """begin (retried: nothing exists yet), deliver the rows, pre-commit; discard on failure
    (unless ``discard_on_failure`` is False: as a killed process, which runs no handler)."""
    txn = retry.call(lambda: sink.begin_transaction(ctx), what=f"begin of {ctx.txn_id}")
    try:
        deliver(sink, txn)
        return sink.pre_commit(txn)
    except BaseException:
        if discard_on_failure:
            _discard_quietly(sink, txn, ctx.txn_id)
        raise


def _discard_quietly(sink: TwoPhaseCommitSink[Any], txn: Any, txn_id: TxnId) -> None:
    """A failing discard never hides the error that made the transaction fail."""
    try:
        sink.discard(txn)
    except Exception:
        log.warning("discard of %s failed; it stays in doubt until a sweep or cleanup "
                    "aborts it", txn_id, exc_info=True)


def rows_delivery(rows: Iterable[Sequence[Any]]) -> Delivery:
    return lambda sink, txn: sink.write(txn, rows)


def arrow_delivery(batches: Iterable[pa.RecordBatch]) -> Delivery:
    return lambda sink, txn: sink.write_arrow(txn, map(with_utc_timestamps, batches))
