"""Small builders for sink-level tests: contexts, rows, and a whole begin/write/pre-commit."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from twophase import Column, Handle, TransactionContext, TwoPhaseCommitSink, TxnId
from twophase._spark import rows_delivery, run_transaction

#: Ids are deterministic in tests: the same arguments name the same transaction.
OPENED_AT = time.time()
QUERY_ID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
OTHER_QUERY_ID = "ffffffff-4b5a-6978-8796-a5b4c3d2e1f0"
ORDER_COLUMNS = (
    Column("event_id", "bigint", False),
    Column("order_id", "bigint", False),
    Column("status", "string", False),
    Column("ts", "timestamp", True),
)


def context(*, batch: int = 0, partition: int = 0, attempt: int = 0, epoch: int = 1,
            namespace: str = "orders", query_id: str = QUERY_ID,
            columns: Sequence[Column] = ORDER_COLUMNS) -> TransactionContext:
    txn_id = TxnId.open(namespace=namespace, query_id=query_id, epoch=epoch, batch=batch,
                        partition=partition, attempt=attempt, clock=lambda: OPENED_AT)
    return TransactionContext(txn_id, tuple(columns))


def orders(first: int, count: int, status: str = "paid") -> list[tuple[Any, ...]]:
    return [(i, 1000 + i, status, None) for i in range(first, first + count)]


def prepare(sink: TwoPhaseCommitSink[Any], rows: Sequence[Sequence[Any]], **ctx: Any) -> Handle:
    """begin_transaction + write + pre_commit, as an executor does."""
    return run_transaction(sink, context(**ctx), rows_delivery(rows))
