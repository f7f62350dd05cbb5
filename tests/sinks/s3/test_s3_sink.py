"""sinks.s3 at the sink level, against a private moto S3 server: the shared contract suite for
each format, and what only this sink does (streamed parts, proven commits, keys, errors)."""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import signal
import subprocess
import sys
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from botocore.exceptions import ClientError

from setups.s3 import moto_policy, read_rows
from setups.servers.moto import MotoServer
from setups.servers.tls import CertificateAuthority
from sinks.s3 import S3Sink
from sinks.s3.errors import classify, iam_policy
from sinks.s3.sink import CONNECTION_OPTIONS
from sinks.s3.upload import META_TXN
from tests import REPO
from tests.sinks import as_connection_json, committed_through_its_pickled_copy
from twophase import (
    AbortOutcome,
    Column,
    CommitOutcome,
    ConfigurationError,
    FatalError,
    Handle,
    RetryableError,
    SchemaMismatchError,
    Secret,
    TransactionLostError,
    _s3,
)
from twophase._s3 import OPERATION_PERMISSIONS
from twophase.testing.contract import (
    NAMESPACE,
    ORDER_COLUMNS,
    SinkContract,
    abort,
    commit,
    context,
    list_in_doubt,
    orders,
    prepare,
)

PART_SIZE = 16 * 1024


def make_sink(server: MotoServer, bucket: str, **options: Any) -> S3Sink:
    return S3Sink(bucket, "orders", **{**server.options(), "part_size": PART_SIZE, **options})


def objects(server: MotoServer, bucket: str, prefix: str = "") -> list[str]:
    reply = server.client().list_objects_v2(Bucket=bucket, Prefix=prefix)
    return sorted(item["Key"] for item in reply.get("Contents", ()))


def visible_rows(sink: S3Sink, server: MotoServer) -> list[dict[str, Any]]:
    client, bucket = server.client(), sink.settings.bucket
    return [row for key in objects(server, bucket, sink.prefix)
            for row in read_rows(client.get_object(Bucket=bucket, Key=key)["Body"].read(), key)]


def open_uploads(server: MotoServer, bucket: str) -> list[str]:
    return [u["Key"] for u in
            server.client().list_multipart_uploads(Bucket=bucket).get("Uploads", ())]


class TestS3ParquetContract(SinkContract):
    setup_fixture = "s3_setup"
    purges_commit_records = False  # the proof of commit is the object itself
    has_schema = False  # an object takes any columns
    target_options: ClassVar[Mapping[str, Any]] = {"format": "parquet", "part_size": PART_SIZE}


class TestS3CsvContract(TestS3ParquetContract):
    target_options: ClassVar[Mapping[str, Any]] = {"format": "csv", "part_size": PART_SIZE}


class TestS3JsonLinesGzipContract(TestS3ParquetContract):
    target_options: ClassVar[Mapping[str, Any]] = {"format": "jsonl", "compression": "gzip",
                                                "part_size": PART_SIZE}


# -- streaming, bounded memory -----------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_parts_are_uploaded_while_rows_stream_in(moto_server: MotoServer, s3_bucket: str,
                                                 fmt: str) -> None:
    sink = make_sink(moto_server, s3_bucket, format=fmt, chunk_size=500)
    txn = sink.begin_transaction(context(batch=2))
    seen_parts = []

    def rows() -> Any:
        for start in range(0, 20_000, 500):
            yield from orders(start, 500)
            seen_parts.append(len(txn.uploader._parts) + len(txn.uploader._pending))
            assert len(txn.uploader._buffer) < PART_SIZE + 64 * 1024  # never the partition
            assert len(txn.uploader._pending) <= sink.max_in_flight

    sink.write(txn, rows())
    assert txn.uploader.upload_id is not None  # created with the first part, not at the end
    assert seen_parts[len(seen_parts) // 2] >= 2  # halfway through, parts were on their way
    handle = sink.pre_commit(txn)
    assert len(handle.data["parts"]) >= 5
    assert handle.data["size"] >= 5 * PART_SIZE
    assert commit(sink, handle) is CommitOutcome.COMMITTED
    assert sorted(int(r["event_id"]) for r in visible_rows(sink, moto_server)) == list(
        range(20_000))


def test_arrow_batches_become_parquet_row_groups_without_per_row_python(
        moto_server: MotoServer, s3_bucket: str) -> None:
    sink = make_sink(moto_server, s3_bucket)
    txn = sink.begin_transaction(context())
    schema = pa.schema([("event_id", pa.int64()), ("order_id", pa.int64()),
                        ("status", pa.string()), ("ts", pa.timestamp("us", tz="UTC"))])
    batches = [pa.record_batch([pa.array(range(i, i + 1000)), pa.array(range(i, i + 1000)),
                                pa.array(["paid"] * 1000),
                                pa.array([0] * 1000, pa.timestamp("us", tz="UTC"))],
                               schema=schema) for i in range(0, 5000, 1000)]
    sink.write_arrow(txn, iter(batches))
    handle = sink.pre_commit(txn)
    assert handle.rows == 5000
    assert commit(sink, handle) is CommitOutcome.COMMITTED
    body = moto_server.client().get_object(Bucket=s3_bucket, Key=handle.data["key"])["Body"]
    table = pq.read_table(io.BytesIO(body.read()))
    assert table.num_rows == 5000 and table.schema.field("ts").type.tz == "UTC"


def test_nested_types_round_trip_through_parquet(moto_server: MotoServer,
                                                 s3_bucket: str) -> None:
    columns = (Column("id", "bigint"), Column("tags", "array<string>"),
               Column("attrs", "map<string,int>"), Column("point", "struct<x:double,y:double>"),
               Column("price", "decimal(10,2)"))
    sink = make_sink(moto_server, s3_bucket)
    sink.check_schema(columns)
    row = (1, ["a", "b"], {"k": 1}, {"x": 1.0, "y": 2.0}, Decimal("9.99"))
    handle = prepare(sink, [row, (2, None, None, None, None)], columns=columns)
    assert commit(sink, handle) is CommitOutcome.COMMITTED
    got = visible_rows(sink, moto_server)
    assert got[0]["tags"] == ["a", "b"] and got[0]["price"] == Decimal("9.99")
    assert got[0]["point"] == {"x": 1.0, "y": 2.0} and list(got[0]["attrs"]) == [("k", 1)]


# -- keys and metadata -------------------------------------------------------------------------

def test_the_key_comes_from_the_template_and_the_txn_id_is_in_the_metadata(
        moto_server: MotoServer, s3_bucket: str) -> None:
    sink = make_sink(moto_server, s3_bucket, format="jsonl")
    handle = prepare(sink, orders(0, 3), batch=5, partition=3)
    assert handle.data["key"] == f"orders/batch=5/part-3-{handle.txn_id}.jsonl"
    commit(sink, handle)
    head = moto_server.client().head_object(Bucket=s3_bucket, Key=handle.data["key"])
    assert head["Metadata"][META_TXN] == str(handle.txn_id)


@pytest.mark.parametrize("template", ["{prefix}/batch={batch}/part-{partition}.parquet",
                                      "{prefix}/{namespace}/{batch}.{ext}"])
def test_a_key_template_that_could_collide_is_refused_with_the_fix(template: str) -> None:
    with pytest.raises(ConfigurationError, match=r"no \{txn\}.*Fix: .*\{txn\}"):
        S3Sink("bucket", "orders", key_template=template)


def test_unknown_template_fields_and_bad_options_are_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"unknown field \{day\}"):
        S3Sink("bucket", key_template="{day}/{txn}.{ext}")
    with pytest.raises(ConfigurationError, match=r"part_size.*Fix: use part_size >= 5242880"):
        S3Sink("bucket", part_size=1024)
    with pytest.raises(ConfigurationError, match=r"compression='gzip' is not possible"):
        S3Sink("bucket", compression="gzip")


def test_a_custom_template_is_listed_and_parsed_back(moto_server: MotoServer,
                                                     s3_bucket: str) -> None:
    sink = make_sink(moto_server, s3_bucket, format="csv",
                     key_template="data/{namespace}/{batch}/{txn}.{ext}")
    txn = sink.begin_transaction(context(batch=1))
    sink.write(txn, orders(0, 2000))  # enough for a part: the upload exists
    assert [h.txn_id for h in list_in_doubt(sink, NAMESPACE)] == [txn.txn_id]
    sink.discard(txn)
    assert list_in_doubt(sink, NAMESPACE) == [] and open_uploads(moto_server, s3_bucket) == []


# -- proven commits ----------------------------------------------------------------------------

def test_a_commit_after_an_outside_abort_is_lost(moto_server: MotoServer,
                                                 s3_bucket: str) -> None:
    sink = make_sink(moto_server, s3_bucket)
    handle = prepare(sink, orders(0, 10))
    moto_server.client().abort_multipart_upload(Bucket=s3_bucket, Key=handle.data["key"],
                                                UploadId=handle.data["upload_id"])
    with pytest.raises(TransactionLostError, match=r"upload .* is gone.*Fix: "):
        commit(sink, handle)


def test_complete_never_overwrites_another_transactions_object(moto_server: MotoServer,
                                                                s3_bucket: str) -> None:
    sink = make_sink(moto_server, s3_bucket, format="jsonl")
    handle = prepare(sink, orders(0, 10))
    client, key = moto_server.client(), handle.data["key"]
    client.put_object(Bucket=s3_bucket, Key=key, Body=b"{}\n", Metadata={META_TXN: "other"})
    with pytest.raises(ClientError, match="PreconditionFailed"):  # what the sink relies on
        client.complete_multipart_upload(
            Bucket=s3_bucket, Key=key, UploadId=handle.data["upload_id"], IfNoneMatch="*",
            MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e}
                                       for n, e in handle.data["parts"]]})
    with pytest.raises(TransactionLostError, match=r"another transaction's object \(other\)"):
        commit(sink, handle)
    assert client.get_object(Bucket=s3_bucket, Key=key)["Body"].read() == b"{}\n"


def test_an_empty_partition_creates_no_upload_and_no_object(moto_server: MotoServer,
                                                            s3_bucket: str) -> None:
    for fmt in ("parquet", "csv", "jsonl"):
        sink = make_sink(moto_server, s3_bucket, format=fmt)
        handle = prepare(sink, [])
        assert (handle.rows, handle.data["upload_id"]) == (0, None)
        assert commit(sink, handle) is CommitOutcome.ALREADY_COMMITTED
    assert objects(moto_server, s3_bucket) == [] and open_uploads(moto_server, s3_bucket) == []


def test_abort_never_deletes_a_committed_object(moto_server: MotoServer, s3_bucket: str) -> None:
    sink = make_sink(moto_server, s3_bucket)
    handle = prepare(sink, orders(0, 3))
    assert commit(sink, handle) is CommitOutcome.COMMITTED
    assert abort(sink, handle) is AbortOutcome.NOT_FOUND
    assert len(objects(moto_server, s3_bucket)) == 1


# -- errors with the fix -----------------------------------------------------------------------

def test_a_missing_bucket_is_a_configuration_error_naming_it(moto_server: MotoServer) -> None:
    sink = make_sink(moto_server, "no-such-bucket-here")
    with pytest.raises(ConfigurationError,
                       match=r"s3://no-such-bucket-here at http://127.*Fix: create the bucket"):
        sink.check_schema(ORDER_COLUMNS)
    with pytest.raises(ConfigurationError, match=r"NoSuchBucket.*Fix: create the bucket"):
        prepare(sink, orders(0, 2000))


@pytest.mark.parametrize("code", ["InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied"])
def test_refused_credentials_are_configuration_errors_with_the_fix(code: str) -> None:
    exc = ClientError({"Error": {"Code": code, "Message": "no"},
                       "ResponseMetadata": {"HTTPStatusCode": 403}}, "PutObject")
    error = classify(exc, "UploadPart of s3://b/k")
    assert isinstance(error, ConfigurationError)
    assert "s3://b/k" in str(error) and "Fix: " in str(error)


@pytest.mark.parametrize(("code", "status"), [("SlowDown", 503), ("InternalError", 500),
                                               ("WhoKnows", 502)])
def test_throttling_and_5xx_are_retryable(code: str, status: int) -> None:
    exc = ClientError({"Error": {"Code": code, "Message": "later"},
                       "ResponseMetadata": {"HTTPStatusCode": status}}, "UploadPart")
    assert isinstance(classify(exc, "UploadPart"), RetryableError)


def test_an_unreachable_endpoint_is_retryable_and_names_it(moto_server: MotoServer) -> None:
    sink = S3Sink("bucket", **{**moto_server.options(), "endpoint_url": "http://127.0.0.1:9",
                               "max_attempts": 1})
    with pytest.raises(RetryableError, match=r"127\.0\.0\.1:9.*Fix: .*endpoint_url"):
        sink.check_target()


def test_an_unencodable_type_is_refused_before_the_start_with_the_fix(
        moto_server: MotoServer, s3_bucket: str) -> None:
    columns = (*ORDER_COLUMNS, Column("attrs", "map<string,int>"), Column("raw", "binary"))
    sink = make_sink(moto_server, s3_bucket, format="csv")
    with pytest.raises(SchemaMismatchError,
                       match=r"csv cannot hold column\(s\) attrs map<string,int>, raw binary.*"
                       r"Fix: .*to_json"):
        sink.check_schema(columns)
    make_sink(moto_server, s3_bucket, format="jsonl").check_schema(columns)


def test_a_short_abort_incomplete_upload_rule_is_reported(moto_server: MotoServer,
                                                          s3_bucket: str) -> None:
    moto_server.client().put_bucket_lifecycle_configuration(
        Bucket=s3_bucket, LifecycleConfiguration={"Rules": [{
            "ID": "cleanup", "Status": "Enabled", "Filter": {"Prefix": ""},
            "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}}]})
    sink = make_sink(moto_server, s3_bucket)
    with pytest.raises(ConfigurationError, match=r"rule 'cleanup'.*after 1 day.*Fix: raise"):
        sink.check_schema(ORDER_COLUMNS)
    make_sink(moto_server, s3_bucket, min_incomplete_upload_days=1).check_schema(ORDER_COLUMNS)


def test_credentials_stay_out_of_repr_and_pickles_hold_no_client(moto_server: MotoServer,
                                                                 s3_bucket: str) -> None:
    sink = make_sink(moto_server, s3_bucket)
    prepare(sink, orders(0, 1))  # a client exists in this process now
    secret = moto_server.options()["secret_access_key"]
    assert secret not in repr(sink) and secret not in repr(sink.settings)
    assert b"botocore" not in pickle.dumps(sink)


# -- a writer killed mid-upload ----------------------------------------------------------------

_KILLED_MID_UPLOAD = """
import os, pickle, signal, sys
from twophase.testing.contract import context, orders
sink = pickle.loads(bytes.fromhex(sys.argv[1]))
txn = sink.begin_transaction(context(batch=9))
def rows():
    for start in range(0, 100_000, 1000):
        yield from orders(start, 1000)
        if len(txn.uploader._parts) >= 3:
            print(txn.uploader.upload_id, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
sink.write(txn, rows())
"""


def test_a_writer_killed_mid_upload_leaves_an_upload_the_sweep_aborts(
        moto_server: MotoServer, s3_bucket: str) -> None:
    sink = make_sink(moto_server, s3_bucket, format="csv")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    writer = subprocess.run([sys.executable, "-c", _KILLED_MID_UPLOAD, pickle.dumps(sink).hex()],
                            capture_output=True, text=True, env=env, timeout=60, check=False)
    assert writer.returncode == -signal.SIGKILL, writer.stderr
    assert len(open_uploads(moto_server, s3_bucket)) == 1
    in_doubt = list_in_doubt(sink, NAMESPACE)
    assert [h.data["upload_id"] for h in in_doubt] == [writer.stdout.strip()]
    assert in_doubt[0].txn_id.batch == 9
    for handle in in_doubt:  # what the driver's sweep and cleanup do
        assert abort(sink, handle) is AbortOutcome.ABORTED
    assert open_uploads(moto_server, s3_bucket) == [] and objects(moto_server, s3_bucket) == []
    assert list_in_doubt(sink, NAMESPACE) == []


def test_a_reused_id_aborts_its_upload_and_raises(moto_server: MotoServer,
                                                  s3_bucket: str) -> None:
    sink = make_sink(moto_server, s3_bucket)
    assert commit(sink, prepare(sink, orders(0, 2000))) is CommitOutcome.COMMITTED
    with pytest.raises(FatalError, match="already committed once"):
        prepare(sink, orders(0, 2000))
    assert open_uploads(moto_server, s3_bucket) == []
    assert isinstance(Handle, type)


# -- credentials and permissions, checked by a server that checks them --------------------------

def test_wrong_credentials_fail_before_the_first_batch_and_after_the_fix_all_arrives(
        moto_checking_credentials: MotoServer) -> None:
    server = moto_checking_credentials
    bucket = server.new_bucket()
    good = make_sink(server, bucket)
    good.check_target()
    key_id = server.access_key_id
    for wrong in ({"access_key_id": "AKIAWRONGWRONGWRONG0"},
                  {"access_key_id": key_id, "secret_access_key": "not-the-secret"}):
        sink = make_sink(server, bucket, max_attempts=1, **wrong)
        with pytest.raises(ConfigurationError, match=r"HeadBucket .*Fix: fix the credentials"):
            sink.check_target()
        with pytest.raises(ConfigurationError,
                           match=r"(InvalidAccessKeyId|SignatureDoesNotMatch).*Fix: fix the "
                           r"credentials"):
            prepare(sink, orders(0, 2000))
        assert "not-the-secret" not in repr(sink)
    assert open_uploads(server, bucket) == [] and objects(server, bucket) == []
    assert commit(good, prepare(good, orders(0, 2000))) is CommitOutcome.COMMITTED
    assert len(visible_rows(good, server)) == 2000


def test_credentials_that_cannot_list_uploads_fail_at_the_start_naming_the_permissions(
        moto_checking_credentials: MotoServer) -> None:
    server = moto_checking_credentials
    bucket = server.new_bucket()
    key_id, secret = server.add_user("writer", ["s3:HeadBucket", "s3:GetObject", "s3:PutObject",
                                                "s3:ListBucket"])
    sink = make_sink(server, bucket, access_key_id=key_id, secret_access_key=secret,
                     max_attempts=1)
    with pytest.raises(ConfigurationError,
                       match=r"ListMultipartUploads .*AccessDenied.*Fix: ListMultipartUploads "
                       r"needs s3:ListBucketMultipartUploads; grant .*s3:PutObject"):
        sink.check_target()


# -- TLS: verified by default --------------------------------------------------------------------

def test_the_secured_store_is_reached_over_verified_https_only(moto_secured: MotoServer) -> None:
    server = moto_secured
    bucket = server.new_bucket()
    sink = make_sink(server, bucket)
    assert sink.settings.endpoint_url is not None
    assert sink.settings.endpoint_url.startswith("https://")
    assert sink.settings.ca_bundle is not None and sink.settings.tls == "verify"
    assert commit(sink, prepare(sink, orders(0, 10))) is CommitOutcome.COMMITTED
    plain = make_sink(server, bucket, max_attempts=1,
                      endpoint_url=server.endpoint_url.replace("https://", "http://"))
    with pytest.raises(RetryableError, match=r"HeadBucket .* at http://"):
        plain.check_target()  # the server speaks TLS only: a plain request gets no answer
    assert len(visible_rows(sink, server)) == 10


def _refused_before_anything_is_written(sink: S3Sink, server: MotoServer, bucket: str,
                                        cause: str) -> None:
    """``sink``'s check and its first upload are refused naming ``cause`` and the fix; the
    bucket holds nothing."""
    fix = r"Fix: the store's certificate was not verified: pass ca_bundle=.*tls='require'"
    with pytest.raises(ConfigurationError, match=rf"HeadBucket .*{cause}.*{fix}"):
        sink.check_target()
    with pytest.raises(ConfigurationError, match=rf"{cause}.*{fix}"):
        prepare(sink, orders(0, 2000))
    assert objects(server, bucket) == [] and open_uploads(server, bucket) == []


@pytest.mark.parametrize("trusted", ["other CA", "default CAs"])
def test_a_store_whose_certificate_another_ca_issued_is_refused_before_anything_is_written(
        moto_secured: MotoServer, other_ca: CertificateAuthority, trusted: str) -> None:
    bucket = moto_secured.new_bucket()
    ca_bundle = str(other_ca.cafile) if trusted == "other CA" else None
    sink = make_sink(moto_secured, bucket, ca_bundle=ca_bundle, max_attempts=1)
    _refused_before_anything_is_written(sink, moto_secured, bucket, "CERTIFICATE_VERIFY_FAILED")


def test_a_store_whose_certificate_names_another_host_is_refused_before_anything_is_written(
        moto_wrong_host: MotoServer) -> None:
    bucket = moto_wrong_host.new_bucket()
    sink = make_sink(moto_wrong_host, bucket, max_attempts=1)
    assert sink.settings.ca_bundle is not None  # the right CA: only the host name is wrong
    _refused_before_anything_is_written(sink, moto_wrong_host, bucket,
                                        "hostname '127.0.0.1' doesn't match")
    # the one relaxing option
    unverified = make_sink(moto_wrong_host, bucket, tls="require", ca_bundle=None)
    unverified.check_target()


# -- least privilege ------------------------------------------------------------------------------

def test_the_readme_policy_is_the_sinks_least_privilege_policy() -> None:
    page = (REPO / "docs" / "sinks" / "s3.md").read_text()
    section = page.split("\n## Grants (least privilege)\n", 1)[1].split("\n## ", 1)[0]
    written = json.loads(section.split("```json", 1)[1].split("```", 1)[0])
    assert written == iam_policy("my-bucket", "orders", state_bucket="my-bucket",
                                 state_prefix="checkpoints/orders/twophase")
    actions = {a for statement in written["Statement"] for a in statement["Action"]}
    assert set(OPERATION_PERMISSIONS.values()) - {"s3:DeleteObject"} <= actions


@pytest.mark.parametrize(("missing", "operation"), [("s3:GetObject", "HeadObject"),
                                                    ("s3:AbortMultipartUpload",
                                                     "AbortMultipartUpload")])
def test_a_policy_without_an_action_fails_naming_the_action(
        moto_checking_credentials: MotoServer, missing: str, operation: str) -> None:
    server = moto_checking_credentials
    bucket = server.new_bucket()
    policy = moto_policy(bucket, "orders")
    for statement in policy["Statement"]:
        statement["Action"] = [a for a in statement["Action"] if a != missing]
    key_id, secret = server.add_user_with_policy(f"without-{operation}", policy)
    sink = make_sink(server, bucket, access_key_id=key_id, secret_access_key=secret,
                     max_attempts=1)
    sink.check_target()  # the check needs neither
    refused = rf"{operation} of .*Fix: .*{operation} needs {missing}"
    with pytest.raises(ConfigurationError, match=refused):
        handle = prepare(sink, orders(0, 2000))  # pre-commit HEADs the key
        abort(sink, handle)
    assert objects(server, bucket) == []


# -- secrets by reference -------------------------------------------------------------------------

def test_a_connection_in_a_secret_writes_and_commits(
        moto_server: MotoServer, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``connection=Secret(env=...)`` holding every connection option as JSON, the keys too:
    the executors' copy of the sink (pickled, without the secret key) writes, the driver's
    commits, the object is there."""
    held, options = as_connection_json(moto_server.options(), CONNECTION_OPTIONS)
    monkeypatch.setenv("TWOPHASE_TEST_S3_CONNECTION", held)
    sink = S3Sink(s3_bucket, "orders", connection=Secret(env="TWOPHASE_TEST_S3_CONNECTION"),
                  part_size=PART_SIZE, **options)
    secret = moto_server.secret_access_key
    committed_through_its_pickled_copy(sink, secret, orders(0, 5), sink.settings)
    assert sorted(int(row["event_id"]) for row in visible_rows(sink, moto_server)) == [
        0, 1, 2, 3, 4]


CANARY_SECRET, CANARY_TOKEN = "canary-s3-secret-5e1f", "canary-s3-token-9a7c"


def test_secrets_by_reference_stay_out_of_repr_pickles_logs_and_errors(
        moto_server: MotoServer, s3_bucket: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("TWOPHASE_S3_SECRET", CANARY_SECRET)
    monkeypatch.setenv("TWOPHASE_S3_TOKEN", CANARY_TOKEN)
    caplog.set_level(logging.DEBUG)
    references = {"secret_access_key": Secret(env="TWOPHASE_S3_SECRET"),
                  "session_token": Secret(env="TWOPHASE_S3_TOKEN")}
    sink = make_sink(moto_server, s3_bucket, **references)
    sink.check_target()
    assert commit(sink, prepare(sink, orders(0, 2000))) is CommitOutcome.COMMITTED
    with pytest.raises(ConfigurationError) as refused:
        make_sink(moto_server, "no-such-bucket-here", **references).check_target()
    assert "x-amz-security-token" in caplog.text.lower()  # botocore did log the request
    produced = [repr(sink), repr(sink.settings), str(refused.value), caplog.text,
                repr(list(_s3._clients))]
    for canary in (CANARY_SECRET, CANARY_TOKEN):
        assert not any(canary in text for text in produced), canary
        assert canary.encode() not in pickle.dumps(sink)
    assert len(visible_rows(sink, moto_server)) == 2000
