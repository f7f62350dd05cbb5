"""The sink kit's pieces on their own: error tables, the committer's pool, the column checks,
the one S3 client."""

from __future__ import annotations

import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
from botocore.exceptions import ClientError

from twophase import (
    Column,
    ConfigurationError,
    FatalError,
    RetryableError,
    SchemaMismatchError,
)
from twophase.kit import Condition, ErrorTable, TableColumn, check_columns
from twophase.kit.s3 import S3Errors, S3Settings
from twophase.kit.sql import ConnectionPool
from twophase.testing.contract import ORDER_COLUMNS

TABLE = ErrorTable(
    "Db", rules={"55P03": (RetryableError, "locks")},
    classes={"08": (RetryableError, "network"), "0": (FatalError, "short prefix")},
    conditions={"55000": (Condition("are disabled", (ConfigurationError, "enable them")),
                          Condition("is busy", (RetryableError, "wait")))})


@pytest.mark.parametrize(("code", "message", "kind", "fix"), [
    ("55000", "prepared transactions are DISABLED", ConfigurationError, "enable them"),
    ("55000", "prepared transaction x is busy", RetryableError, "wait"),
    ("55000", "something else of 55000", FatalError, "fix the cause named above, then "
     "restart the query"),
    ("55P03", "lock timeout", RetryableError, "locks"),
    ("08006", "connection failure", RetryableError, "network"),  # the longest class wins
    ("01000", "a warning", FatalError, "short prefix"),
    (None, "no code", FatalError, "fix the cause named above, then restart the query"),
])
def test_a_verdict_by_condition_then_code_then_class_then_default(
        code: str | None, message: str, kind: type[Exception], fix: str) -> None:
    assert TABLE.verdict(code, message) == (kind, fix)


def test_an_error_ends_a_one_line_message_once_and_a_multi_line_one_as_it_is() -> None:
    one = TABLE.error("55P03", "writing", "lock timeout")
    assert str(one) == "Db: writing failed: lock timeout. Fix: locks"
    assert str(TABLE.error("55P03", "writing", "done.")) == "Db: writing failed: done. Fix: locks"
    many = TABLE.error("55P03", "writing", "duplicate key\nDETAIL:  Key (id)=(1) exists.\n")
    assert many.cause == "Db: writing failed: duplicate key\nDETAIL:  Key (id)=(1) exists."


class Conn:
    """A stand-in connection: which one, and whether it was closed."""

    def __init__(self, number: int) -> None:
        self.number, self.closed = number, False


def test_the_pool_lends_each_connection_to_one_thread_and_keeps_at_most_max_idle() -> None:
    made: list[Conn] = []
    lock, in_use = threading.Lock(), set()

    def connect() -> Conn:
        with lock:
            made.append(Conn(len(made)))
            return made[-1]

    def close(conn: Conn) -> None:
        conn.closed = True

    pool = ConnectionPool(connect, close=close, usable=lambda c: not c.closed, max_idle=2)

    def borrow(_: int) -> None:
        with pool.connection() as conn:
            with lock:
                assert conn.number not in in_use, "lent to two threads at once"
                in_use.add(conn.number)
            with lock:
                in_use.discard(conn.number)

    with ThreadPoolExecutor(max_workers=4) as threads:
        list(threads.map(borrow, range(200)))
    assert len(made) <= 4
    assert sum(not conn.closed for conn in made) <= 2  # the rest closed when given back
    with pytest.raises(RuntimeError), pool.connection() as failing:
        raise RuntimeError("the statement failed")
    assert failing.closed  # never lent again
    pool.close()
    assert all(conn.closed for conn in made)


WHERE = "table t"
CATALOG = [TableColumn("event_id", required=True), TableColumn("order_id", required=True),
           TableColumn("status"), TableColumn("ts", zoned=True), TableColumn("note", required=True)]


@pytest.mark.parametrize(("catalog", "columns", "key", "unique", "message"), [
    ([], ORDER_COLUMNS, None, (), "table t does not exist"),
    (CATALOG, [*ORDER_COLUMNS, Column("x", "int")], None, (), "has no column 'x'"),
    (CATALOG[:4], ORDER_COLUMNS[1:], None, (), "requires column 'event_id'"),
    ([*CATALOG[:3], TableColumn("ts", zoned=False)], ORDER_COLUMNS, None, (),
     "'ts' keeps no time zone"),
    (CATALOG[:4], ORDER_COLUMNS, ("order_id",), [["event_id"]],
     r"the upsert key \['order_id'\] is not a PRIMARY or UNIQUE key"),
    (CATALOG[:4], ORDER_COLUMNS[2:], (), [["event_id"], ["order_id", "status"]],
     "requires column 'event_id'"),
    ([TableColumn(c.name) for c in ORDER_COLUMNS], ORDER_COLUMNS[1:], (), [["event_id"]],
     "mode='upsert' needs a PRIMARY or UNIQUE key made of written columns"),
])
def test_the_column_checks_refuse_in_one_wording(
        catalog: list[TableColumn], columns: list[Column], key: tuple[str, ...] | None,
        unique: list[list[str]], message: str) -> None:
    with pytest.raises(SchemaMismatchError, match=message):
        check_columns(WHERE, catalog, columns, upsert_key=key, unique_keys=unique)


def test_the_column_checks_pass_what_fits() -> None:
    check_columns(WHERE, CATALOG[:4], ORDER_COLUMNS, upsert_key=("event_id",),
                  unique_keys=[["event_id"]])
    check_columns(WHERE, [TableColumn("EVENT_ID")], [Column("event_id", "bigint")],
                  upsert_key=(), unique_keys=[["Event_Id"]], case_sensitive=False)


# -- the one S3 client ---------------------------------------------------------------------------

SECRET = "s3cret-never-shown"
S3 = S3Settings("bucket-a", endpoint_url="http://127.0.0.1:9", region="us-east-1",
                access_key_id="key", secret_access_key=SECRET)


def test_one_s3_client_serves_every_bucket_and_one_session_every_client() -> None:
    assert replace(S3, bucket="bucket-b").client() is S3.client()
    other = replace(S3, access_key_id="other")
    assert other.client() is not S3.client()
    assert S3.client(max_attempts=1) is not S3.client()
    # one boto3 session per process: S3's service model is parsed once, for every client
    model = S3.client().meta.service_model._service_description
    assert other.client().meta.service_model._service_description is model


def test_s3_settings_refuse_unknown_options_and_half_a_key_and_hide_the_secrets() -> None:
    with pytest.raises(ConfigurationError,
                       match=r"staging_options: unknown S3 options \['password'\].*Fix: use only"):
        S3Settings.of("b", {"password": "x"}, named="staging_options")
    with pytest.raises(ConfigurationError, match="go together"):
        S3Settings.of("b", {"access_key_id": "key"}, named="state_options")
    assert S3Settings.of("bucket-a", {"region": "us-east-1"}, named="x").region == "us-east-1"
    assert SECRET not in repr(S3)


def s3_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "no"},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")


def test_s3_errors_are_classified_once_and_a_refusal_names_the_callers_permissions() -> None:
    errors = S3Errors(("s3:GetObject", "s3:PutObject"))
    refused = errors.classify(s3_error("AccessDenied", 403), "GetObject of s3://b/k")
    assert isinstance(refused, ConfigurationError)
    assert str(refused) == ("S3: GetObject of s3://b/k failed: AccessDenied (no). Fix: "
                            "GetObject needs s3:GetObject; grant s3:GetObject and s3:PutObject "
                            "on the bucket and prefix to these credentials")
    assert isinstance(errors.classify(s3_error("WhoKnows", 502), "x"), RetryableError)
    unknown = errors.classify(s3_error("WhoKnows", 400), "x")
    assert type(unknown) is FatalError
    assert isinstance(errors.error(S3Errors.NO_SUCH_BUCKET, "HeadBucket"), ConfigurationError)
    assert S3Errors.code(s3_error("NoSuchKey", 404)) in S3Errors.NOT_FOUND
    assert (S3Errors.code(ValueError()), S3Errors.status(ValueError())) == (None, 0)


def test_the_kit_imports_boto3_only_once_a_client_is_made() -> None:
    script = "import sys, twophase.kit; print('boto3' in sys.modules, 'botocore' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True, timeout=60)
    assert done.stdout.split() == ["False", "False"]
