"""Rotated credentials (issue 38): a decided batch whose commit meets a revoked password or key
commits, in the same process through the same sink, once the new one is in the
``Secret(file=...)`` it came from; with no new one there, it fails with the
:class:`ConfigurationError` naming the credentials, and the batch stays decided.

Each test revokes the old credential on the real server (``ALTER USER``, ``ALTER ROLE``, an
IAM access key deleted, a SCRAM credential altered) and ends the sessions made with it, as an
operator rotating a leaked credential does, so the next step must log in again. No Spark:
the driver's side is :class:`twophase._coordinator.Coordinator` over a state in ``tmp_path``.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

from setups.least_privilege import LeastPrivileged
from setups.s3 import read_rows
from setups.servers.kafka import HOST, SESSION_LIFETIME_MS, KafkaBroker
from setups.servers.moto import MIN_PART_SIZE, MotoServer
from sinks.kafka import KafkaSink
from sinks.kafka.access import grants
from sinks.s3 import S3Sink
from twophase import CommitOutcome, ConfigurationError, RetryPolicy, Secret, TwoPhaseCommitSink
from twophase._coordinator import Coordinator, Decided
from twophase._state import StateStore
from twophase.testing.contract import (
    NAMESPACE,
    ORDER_COLUMNS,
    QUERY_ID,
    commit,
    list_in_doubt,
    orders,
    prepare,
)

#: Dead pooled sessions (ended by the rotation) are retried: a few fast attempts.
RETRY = RetryPolicy(max_attempts=5, initial_backoff_s=0.01, max_backoff_s=0.05)
ROWS = 3
KAFKA_FAST: dict[str, Any] = {"connect_timeout_ms": 5000, "request_timeout_ms": 5000,
                              "max_block_ms": 5000}


#: Task attempt ids drawn for the tests' transactions.
ATTEMPT_IDS = 10**9


def decided(sink: TwoPhaseCommitSink[Any], tmp_path: Path) -> tuple[Coordinator, Decided]:
    """A run that pre-committed one transaction of ``ROWS`` rows and decided batch 0."""
    sink.check_schema(ORDER_COLUMNS)
    store = StateStore(tmp_path / "state")
    run = Coordinator(sink, store, namespace=NAMESPACE,
                      epoch=store.start_run(NAMESPACE, {}).epoch, retry=RETRY)
    # an attempt of its own: the least-privileged targets are shared by the session's tests,
    # and a transaction id another test committed there is refused as reused
    attempt = secrets.randbelow(ATTEMPT_IDS)
    decision = run.decide_batch(0, QUERY_ID, [prepare(sink, orders(0, ROWS), attempt=attempt)])
    assert decision is not None
    return run, decision


def pending(run: Coordinator) -> list[int]:
    state = run.store.read()
    assert state is not None
    return [decision.batch for decision in state.pending]


def write_secret(path: Path, value: str) -> None:
    path.write_text(value + "\n")


def refused_then_committed(run: Coordinator, decision: Decided, rotate: Any,
                           match: str) -> None:
    """The commit fails while the file holds the revoked credential (the batch stays
    decided), then succeeds once ``rotate()`` has written the new one: same run, same sink."""
    with pytest.raises(ConfigurationError, match=match) as refused:
        run.finish_decided(decision)
    assert refused.value.fix
    assert pending(run) == [0]
    rotate()
    run.finish_decided(decision)
    assert pending(run) == []
    run.close()


# -- MySQL / MariaDB ---------------------------------------------------------------------------


def test_mysql_commits_with_the_rotated_password_and_names_a_revoked_one(
        least_privileged_mysql_setup: LeastPrivileged, tmp_path: Path) -> None:
    setup = least_privileged_mysql_setup.setup
    target = least_privileged_mysql_setup.new_target()
    user, password_file = target.options["user"], Path(target.options["password_file"])
    run, decision = decided(target.build(), tmp_path)
    new = secrets.token_hex(12)
    setup.server.root_sql(  # type: ignore[attr-defined]
        f"ALTER USER '{user}'@'%' IDENTIFIED BY '{new}'; KILL CONNECTION USER '{user}'")

    refused_then_committed(run, decision, lambda: write_secret(password_file, new),
                           match=rf"\[1045\].*{user}")
    assert sorted(target.visible()) == list(range(ROWS))
    assert target.in_doubt() == []


# -- PostgreSQL --------------------------------------------------------------------------------


def test_postgres_commits_with_the_rotated_password(
        least_privileged_postgres_setup: LeastPrivileged, tmp_path: Path) -> None:
    setup = least_privileged_postgres_setup.setup
    target = least_privileged_postgres_setup.new_target()
    user, password_file = target.options["user"], Path(target.options["password_file"])
    run, decision = decided(target.build(), tmp_path)
    new = secrets.token_hex(12)
    with setup.server.superuser() as conn:  # type: ignore[attr-defined]
        conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(user),
                                                                sql.Literal(new)))
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE usename = %s", (user,))

    refused_then_committed(run, decision, lambda: write_secret(password_file, new),
                           match="password authentication failed")
    assert sorted(target.visible()) == list(range(ROWS))
    assert target.in_doubt() == []


# -- S3 (moto checking IAM keys) ---------------------------------------------------------------


def test_s3_commits_with_rotated_access_keys(moto_checking_credentials: MotoServer,
                                             tmp_path: Path) -> None:
    """The committer's cached boto3 client holds the deleted key: it is made again from the
    files once they hold the new key."""
    server = moto_checking_credentials
    user = f"rotation-{secrets.token_hex(4)}"
    key_id, secret = server.add_user(user, ["s3:*"])
    bucket = server.new_bucket("rotation")
    key_id_file, secret_file = tmp_path / "key-id", tmp_path / "secret"
    write_secret(key_id_file, key_id)
    write_secret(secret_file, secret)
    sink = S3Sink(bucket, "orders", **{
        **server.options(), "access_key_id": Secret(file=str(key_id_file)),
        "secret_access_key": Secret(file=str(secret_file)), "part_size": MIN_PART_SIZE})
    run, decision = decided(sink, tmp_path)
    committer: Any = run.committer
    assert committer.client is sink.settings.client(max_attempts=1)  # made with the old key
    iam = server.client("iam")
    new = iam.create_access_key(UserName=user)["AccessKey"]
    iam.delete_access_key(UserName=user, AccessKeyId=key_id)

    def rotate() -> None:
        write_secret(key_id_file, new["AccessKeyId"])
        write_secret(secret_file, new["SecretAccessKey"])

    refused_then_committed(run, decision, rotate, match="403|InvalidAccessKeyId")
    s3 = server.client()
    (found,) = s3.list_objects_v2(Bucket=bucket, Prefix="orders")["Contents"]
    body = s3.get_object(Bucket=bucket, Key=found["Key"])["Body"].read()
    assert sorted(row["event_id"] for row in read_rows(body, found["Key"])) == list(range(ROWS))
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


# -- Kafka (SCRAM over SASL_SSL) ---------------------------------------------------------------


def sink_of_new_user(broker: KafkaBroker, user: str, password_file: Path) -> KafkaSink:
    """A sink on a fresh topic, as ``user`` (its password in ``password_file``, granted the
    ACLs it needs), through the broker's listener that ends SASL sessions."""
    topic = broker.new_topic("rotation")
    prefix, registry_topic = f"{topic}-", f"{topic}-registry"
    broker.grant(grant.acl(f"User:{user}") for grant in grants(
        [topic], prefix, registry_topic, create_registry=True))
    return KafkaSink(**{
        **broker.options(), "bootstrap_servers": f"{HOST}:{broker.reauth_port}",
        "sasl_plain_username": user, "sasl_plain_password": Secret(file=str(password_file)),
        "topic": topic, "key": "order_id", "transactional_id_prefix": prefix,
        "registry_topic": registry_topic, **KAFKA_FAST})


def rotate_again(broker: KafkaBroker, user: str, password_file: Path) -> None:
    """A new password for ``user`` on the broker and in its file, every session of the one
    before ended."""
    newest = secrets.token_hex(12)
    broker.set_password(user, newest)
    time.sleep(SESSION_LIFETIME_MS / 1000)
    write_secret(password_file, newest)


def test_kafka_commits_checks_and_begins_with_the_rotated_sasl_password(
        kafka_secured_broker: KafkaBroker, tmp_path: Path) -> None:
    """The broker ends every SASL session within ``SESSION_LIFETIME_MS`` of its login unless
    the client logs in again (KIP-368): once the password is changed, the committer's admin
    client, made with the old one, must log in again. kafka-python mostly reports the refusal
    as a lost connection (it drops the broker's answer); the sink's own login names it."""
    broker = kafka_secured_broker
    user = f"rotation-{secrets.token_hex(4)}"
    old, new = secrets.token_hex(12), secrets.token_hex(12)
    password_file = tmp_path / "kafka.password"
    broker.set_password(user, old)
    write_secret(password_file, old)
    sink = sink_of_new_user(broker, user, password_file)
    run, decision = decided(sink, tmp_path)
    broker.set_password(user, new)
    time.sleep(SESSION_LIFETIME_MS / 1000)  # every session of the old password has ended

    refused_then_committed(run, decision, lambda: write_secret(password_file, new),
                           match=rf"SASL_AUTHENTICATION_FAILED.*{user}")
    topic = sink.shape.topic
    assert topic is not None
    assert broker.event_ids(topic) == list(range(ROWS))

    rotate_again(broker, user, password_file)
    # the next run's start check and its task's begin ask through the admin client made with
    # the password before: each makes it again with the file's, as the commit does
    sink.check_schema(ORDER_COLUMNS)
    handle = prepare(sink, orders(ROWS, ROWS), batch=1, attempt=secrets.randbelow(ATTEMPT_IDS))
    assert commit(sink, handle) is CommitOutcome.COMMITTED
    assert broker.event_ids(topic) == list(range(2 * ROWS))
    assert list_in_doubt(sink, NAMESPACE) == []
    assert broker.open_transactions(sink.transactional_id_prefix) == {}
