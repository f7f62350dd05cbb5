"""sinks.s3 with ``batch_log=True``: Spark's own file sink log under the prefix, so that Spark's
reader sees exactly the committed batches; and what a batch leaves behind in the store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from setups.servers.moto import MotoServer
from sinks.s3 import S3Sink
from sinks.s3.batchlog import COMPACT_INTERVAL, LOG_DIRECTORY, LOG_VERSION
from sinks.s3.upload import META_TXN
from tests.sinks.s3.test_s3_sink import make_sink, objects, open_uploads
from twophase import FatalError, Handle, RetryPolicy
from twophase._coordinator import Coordinator
from twophase._state import StateStore
from twophase.testing.contract import NAMESPACE, OTHER_QUERY_ID, QUERY_ID, orders, prepare

FAST_RETRY = RetryPolicy(max_attempts=2, initial_backoff_s=0.01, max_backoff_s=0.02)
ROWS_PER_PARTITION = 3
PARTITIONS = 2  # partition 1 of every third batch is empty


def start_run(sink: S3Sink, state: Path) -> Coordinator:
    store = StateStore(state)
    epoch = store.start_run(NAMESPACE, {}).epoch
    return Coordinator(sink, store, namespace=NAMESPACE, epoch=epoch, retry=FAST_RETRY)


def batch_handles(sink: S3Sink, batch: int, epoch: int) -> list[Handle]:
    """One batch's handles: rows with event ids from batch * 10, some partitions empty."""
    handles = []
    for partition in range(PARTITIONS):
        empty = partition == 1 and batch % 3 == 0
        rows = [] if empty else orders(batch * 10 + partition * ROWS_PER_PARTITION,
                                       ROWS_PER_PARTITION)
        handles.append(prepare(sink, rows, batch=batch, partition=partition, epoch=epoch))
    return handles


def expected_ids(batches: range) -> list[int]:
    return sorted(batch * 10 + partition * ROWS_PER_PARTITION + i
                  for batch in batches for partition in range(PARTITIONS)
                  if not (partition == 1 and batch % 3 == 0) for i in range(ROWS_PER_PARTITION))


def mirror(server: MotoServer, bucket: str, into: Path) -> None:
    """Download every object of the bucket to ``into/<key>`` (what s3a would read)."""
    client = server.client()
    for key in objects(server, bucket):
        path = into / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(client.get_object(Bucket=bucket, Key=key)["Body"].read())


def log_names(server: MotoServer, bucket: str) -> list[str]:
    return [key.rsplit("/", 1)[-1] for key in objects(server, bucket, f"orders/{LOG_DIRECTORY}/")]


@pytest.mark.spark
def test_spark_reads_exactly_the_committed_batches_through_its_own_log(
        spark: SparkSession, moto_server: MotoServer, s3_bucket: str, tmp_path: Path) -> None:
    local = tmp_path / "mirror"
    sink = make_sink(moto_server, s3_bucket, batch_log=True, batch_log_root=local.as_uri())
    batches = range(COMPACT_INTERVAL + 2)  # past the first compaction
    with start_run(sink, tmp_path / "state") as run:
        for batch in batches:
            run.commit_batch(batch, QUERY_ID, batch_handles(sink, batch, run.epoch))
        stray = prepare(sink, orders(9000, 5), batch=len(batches), epoch=run.epoch)
        run.abort_batch(len(batches), QUERY_ID, [stray])
    names = log_names(moto_server, s3_bucket)
    assert sorted(names) == sorted([*map(str, range(9)), "9.compact", "10", "11"])
    committed = objects(moto_server, s3_bucket, "orders/batch=")
    client = moto_server.client()
    client.put_object(Bucket=s3_bucket, Key="orders/batch=99/part-0-left-by-hand.parquet",
                      Body=client.get_object(Bucket=s3_bucket, Key=committed[0])["Body"].read())
    mirror(moto_server, s3_bucket, local)

    table = spark.read.parquet(str(local / "orders"))
    ids = sorted(row.event_id for row in table.select("event_id").collect())
    assert ids == expected_ids(batches)  # not the stray object, every committed row once
    files = {Path(path).name for path in table.inputFiles()}
    assert files == {Path(key).name for key in committed}


def test_each_log_file_is_its_batchs_manifest(moto_server: MotoServer, s3_bucket: str,
                                              tmp_path: Path) -> None:
    sink = make_sink(moto_server, s3_bucket, batch_log=True)
    with start_run(sink, tmp_path / "state") as run:
        handles = batch_handles(sink, 0, run.epoch)
        run.commit_batch(0, QUERY_ID, handles)
    body = moto_server.client().get_object(Bucket=s3_bucket, Key=f"orders/{LOG_DIRECTORY}/0")[
        "Body"].read().decode()
    version, *lines = body.splitlines()
    entries = [json.loads(line) for line in lines]
    assert version == LOG_VERSION
    nonempty = [h for h in handles if h.data["upload_id"]]  # batch 0: partition 1 is empty
    assert [(e["path"], e["size"], e["action"]) for e in entries] == [
        (f"s3a://{s3_bucket}/{h.data['key']}", h.data["size"], "add") for h in nonempty]


def test_a_crash_after_publishing_publishes_again_without_a_second_entry(
        moto_server: MotoServer, s3_bucket: str, tmp_path: Path) -> None:
    sink = make_sink(moto_server, s3_bucket, batch_log=True)
    with start_run(sink, tmp_path / "state") as run:
        handles = batch_handles(sink, 0, run.epoch)
        run.committer.finish_batch(NAMESPACE, 0, handles)  # as if the crash came right after
        run.commit_batch(0, QUERY_ID, handles)
        run.committer.finish_batch(NAMESPACE, 0, handles)
    assert log_names(moto_server, s3_bucket) == ["0"]


def test_a_log_started_late_fills_the_batches_before_it(moto_server: MotoServer,
                                                        s3_bucket: str, tmp_path: Path) -> None:
    sink = make_sink(moto_server, s3_bucket, batch_log=True)
    with start_run(sink, tmp_path / "state") as run:
        run.commit_batch(3, QUERY_ID, batch_handles(sink, 3, run.epoch))
    assert sorted(log_names(moto_server, s3_bucket)) == ["0", "1", "2", "3"]


def test_another_querys_log_in_the_prefix_is_refused_with_the_fix(
        moto_server: MotoServer, s3_bucket: str, tmp_path: Path) -> None:
    sink = make_sink(moto_server, s3_bucket, batch_log=True)
    with start_run(sink, tmp_path / "first") as run:
        run.commit_batch(0, QUERY_ID, batch_handles(sink, 0, run.epoch))
    with start_run(sink, tmp_path / "second") as run, pytest.raises(
            FatalError, match=r"already lists other objects for batch 0.*Fix: give each query"):
        run.commit_batch(0, OTHER_QUERY_ID, [
            prepare(sink, orders(50, 2), query_id=OTHER_QUERY_ID, epoch=run.epoch)])


def test_a_retried_create_leaves_no_second_upload_behind(moto_server: MotoServer,
                                                         s3_bucket: str, tmp_path: Path) -> None:
    """CreateMultipartUpload retried after a lost reply: two uploads for one key. The commit
    completes the handle's; the sweep of the next batch aborts the twin, keeping the object."""
    sink: S3Sink = make_sink(moto_server, s3_bucket)
    client = moto_server.client()
    with start_run(sink, tmp_path / "state") as run:
        handle = prepare(sink, orders(0, 5), batch=0, epoch=run.epoch)
        client.create_multipart_upload(Bucket=s3_bucket, Key=handle.data["key"],
                                       Metadata={META_TXN: str(handle.txn_id)})
        run.commit_batch(0, QUERY_ID, [handle])
        run.commit_batch(1, QUERY_ID, [prepare(sink, orders(5, 5), batch=1, epoch=run.epoch)])
    assert open_uploads(moto_server, s3_bucket) == []
    assert len(objects(moto_server, s3_bucket)) == 2


def test_the_log_is_off_by_default_and_its_paths_are_s3a(moto_server: MotoServer,
                                                        s3_bucket: str) -> None:
    assert make_sink(moto_server, s3_bucket).batch_log_root is None
    assert make_sink(moto_server, s3_bucket, batch_log=True).batch_log_root == f"s3a://{s3_bucket}"
