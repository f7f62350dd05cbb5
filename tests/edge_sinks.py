"""Sinks that misbehave on purpose, for the Spark-level edge tests (pickled to the workers)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark import cloudpickle

from sinks.sqlite import SQLiteSink, SQLiteTransaction
from twophase import Handle, RetryableError, SchemaMismatchError, TransactionContext
from twophase._state import StateStore

LATE_WAIT_S = 30.0


class FailingPartitionSink(SQLiteSink):
    """Partition ``fail_partition`` of batch ``fail_batch`` fails in ``write``; every other
    partition of that batch pre-commits only after the driver gave the batch up."""

    def __init__(self, path: str, table: str, *, state_dir: str, fail_batch: int,
                 fail_partition: int = 0) -> None:
        super().__init__(path, table)
        self.state_dir = state_dir
        self.fail_batch = fail_batch
        self.fail_partition = fail_partition

    def _failing(self, ctx: TransactionContext) -> bool:
        return ctx.txn_id.batch == self.fail_batch

    def _refuse_if_failing(self, txn: SQLiteTransaction) -> None:
        if self._failing(txn.ctx) and txn.ctx.txn_id.partition == self.fail_partition:
            raise SchemaMismatchError("partition refused on purpose.", fix="none: a test")

    def write(self, txn: SQLiteTransaction, rows: Iterable[Sequence[Any]]) -> None:
        self._refuse_if_failing(txn)
        super().write(txn, rows)

    def write_arrow(self, txn: SQLiteTransaction, batches: Iterable[pa.RecordBatch]) -> None:
        self._refuse_if_failing(txn)
        super().write_arrow(txn, batches)

    def pre_commit(self, txn: SQLiteTransaction) -> Handle:
        if self._failing(txn.ctx):
            self._wait_until_given_up(txn.ctx.txn_id.batch)
        return super().pre_commit(txn)

    def _wait_until_given_up(self, batch: int) -> None:
        store = StateStore(self.state_dir)
        deadline = time.monotonic() + LATE_WAIT_S
        while time.monotonic() < deadline:
            state = store.read()
            if state is not None and state.aborted_batch >= batch:
                return
            time.sleep(0.05)


class FlakyBeginSink(SQLiteSink):
    """``begin_transaction`` fails retryably ``failures`` times in every task, then works;
    each failure leaves a file in ``log_dir``."""

    def __init__(self, path: str, table: str, *, log_dir: str, failures: int = 2) -> None:
        super().__init__(path, table)
        self.log_dir = log_dir
        self.failures_left = failures

    def begin_transaction(self, ctx: TransactionContext) -> SQLiteTransaction:
        if self.failures_left > 0:
            self.failures_left -= 1
            (Path(self.log_dir) / f"{ctx.txn_id}.{self.failures_left}").touch()
            raise RetryableError("lock wait timeout (on purpose).", fix="retried")
        return super().begin_transaction(ctx)


cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]
