"""KafkaSink's keyed mode (``mode="keyed"``, :mod:`sinks.kafka.changelog`) against the private
Apache Kafka broker: a batch's newest change per key, its version in a header, deletes as
tombstones, a key's records in one partition, the compacted topic checked at start, each batch
seen once by a read_committed reader after a commit retry and a recommit, and the topic folded
by key (what compaction keeps) equal to the reference computed from the feed."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import pytest

from setups.servers.kafka import TOPIC_PARTITIONS, KafkaBroker
from sinks.kafka import KafkaSink
from sinks.kafka.access import grants
from sinks.kafka.changelog import CLEANUP_POLICY, VERSION_HEADER
from twophase import AbortOutcome, Column, CommitOutcome, ConfigurationError, Handle
from twophase.testing.contract import abort, commit, prepare

CHANGE_COLUMNS = (
    Column("id", "bigint", False),
    Column("lsn", "bigint", False),
    Column("op", "string", False),
    Column("name", "string", True),
)
#: One key's changes as they come in one batch: late, repeated, deleting, re-inserting.
BATCH = [
    (1, 1, "c", "one"), (1, 3, "u", "one v3"), (1, 2, "u", "one v2 (late in the batch)"),
    (2, 1, "c", "two"), (2, 5, "d", "two"),
    (3, 2, "d", "three"), (3, 4, "c", "three again"),
    (4, 7, "u", "first of version 7"), (4, 7, "u", "second of version 7"),
    (5, 1, "r", "five"),
]
#: The newest change of each key of :data:`BATCH`: its version and value (None: deleted).
NEWEST = {1: (3, "one v3"), 2: (5, None), 3: (4, "three again"),
          4: (7, "first of version 7"), 5: (1, "five")}
RANDOM_SEED = 49


def compacted_topic(broker: KafkaBroker, policy: str = "compact") -> str:
    """A new topic of ``cleanup.policy=policy``, once the broker lists it."""
    return broker.new_topic("changelog", TOPIC_PARTITIONS, {CLEANUP_POLICY: policy})


def keyed_sink(broker: KafkaBroker, topic: str, **options: Any) -> KafkaSink:
    """A keyed sink with a pool of its own, checked as the driver does."""
    sink = KafkaSink(**{**broker.options(), "topic": topic, "key": "id", "mode": "keyed",
                        "version": "lsn", "deleted": "op",
                        "transactional_id_prefix": f"{topic}-",
                        "transaction_timeout_ms": 60_000, "min_commit_window_ms": 0, **options})
    sink.check_schema(CHANGE_COLUMNS)
    return sink


def put(sink: KafkaSink, rows: Sequence[Sequence[Any]], *, arrow: bool = False,
        **ctx: Any) -> Handle:
    """One task's transaction of change rows, pre-committed."""
    return prepare(sink, rows, arrow=arrow, columns=CHANGE_COLUMNS, **ctx)


def version_of(record: Any, header: str = VERSION_HEADER) -> int:
    """The version a record's header holds."""
    return int(dict(record.headers)[header])


def fold(records: Sequence[Any]) -> dict[int, tuple[int, str | None]]:
    """The topic as compaction leaves it: each key's last record (read in offset order per
    partition; a key has one), as (version, name or None for a tombstone)."""
    last: dict[int, tuple[int, str | None]] = {}
    for record in records:
        value = None if record.value is None else json.loads(record.value)["name"]
        last[int(record.key)] = (version_of(record), value)
    return last


def one_partition_per_key(records: Sequence[Any]) -> bool:
    partitions: dict[bytes, set[int]] = {}
    for record in records:
        partitions.setdefault(record.key, set()).add(record.partition)
    return all(len(found) == 1 for found in partitions.values())


@pytest.mark.parametrize("arrow", [False, True], ids=["rows", "arrow"])
def test_a_batch_is_one_record_per_key_its_newest_change_deletes_as_tombstones(
        kafka_broker: KafkaBroker, arrow: bool) -> None:
    topic = compacted_topic(kafka_broker)
    sink = keyed_sink(kafka_broker, topic)
    handle = put(sink, BATCH, arrow=arrow)
    assert handle.rows == len(NEWEST)  # records produced: one per key
    assert kafka_broker.read(topic) == []  # pre-committed: hidden from read_committed
    assert commit(sink, handle) is CommitOutcome.COMMITTED
    records = kafka_broker.read(topic)
    assert sorted(int(r.key) for r in records) == sorted(NEWEST)
    assert fold(records) == NEWEST
    by_key = {int(r.key): r for r in records}
    assert by_key[2].key == b"2" and by_key[2].value is None  # a tombstone keeps its key
    assert json.loads(by_key[1].value) == {"id": 1, "lsn": 3, "name": "one v3"}  # no "op"
    assert list(by_key[1].headers) == [(VERSION_HEADER, b"3")]
    assert one_partition_per_key(records)


@pytest.mark.parametrize("arrow", [False, True], ids=["rows", "arrow"])
def test_a_key_again_in_a_later_hand_over_of_a_task_is_produced_only_if_newer(
        kafka_broker: KafkaBroker, arrow: bool) -> None:
    """A task hands its held changes over every HELD_CHUNKS chunks' worth of keys (here ten
    one-row chunks): a key that comes again later must not go back to an older version."""
    topic = compacted_topic(kafka_broker)
    sink = keyed_sink(kafka_broker, topic, headers=("name",), version_header="v")
    assert sink.changelog is not None
    sink.changelog = replace(sink.changelog, chunk_rows=1)
    rows = [(0, 10, "c", "ten"), *((key, 1, "c", f"key {key}") for key in range(1, 10)),
            (0, 5, "u", "five: older than ten, held after it was produced"),
            (1, 1, "u", "key 1 again, same version"), (0, 20, "u", "twenty")]
    assert commit(sink, put(sink, rows, arrow=arrow)) is CommitOutcome.COMMITTED
    records = kafka_broker.read(topic)
    zero = [r for r in records if r.key == b"0"]
    assert [version_of(r, "v") for r in zero] == [10, 20]
    assert [json.loads(r.value)["name"] for r in zero] == ["ten", "twenty"]
    assert list(zero[-1].headers) == [("name", b"twenty"), ("v", b"20")]
    assert len([r for r in records if r.key == b"1"]) == 1
    assert len(records) == 11


def test_each_batch_is_read_once_after_a_commit_retry_and_a_recommit(
        kafka_broker: KafkaBroker) -> None:
    """Two tasks per batch (keys routed: odd and even), a failed attempt's orphan aborted, every
    handle committed twice (the second time from its JSON, as recovery does)."""
    topic = compacted_topic(kafka_broker)
    sink = keyed_sink(kafka_broker, topic)
    expected: list[tuple[int, int]] = []
    for batch in range(2):
        changes = [(key, 10 * batch + key, "u", f"{key} in {batch}") for key in range(6)]
        orphan = put(sink, changes[:2], batch=batch, partition=0, attempt=0)
        handles = [put(sink, [c for c in changes if c[0] % 2 == part], batch=batch,
                       partition=part, attempt=1 + part, arrow=part == 1)
                   for part in range(2)]
        assert abort(sink, orphan) is AbortOutcome.ABORTED
        for handle in handles:
            assert commit(sink, handle) is CommitOutcome.COMMITTED
        for handle in handles:
            assert commit(sink, Handle.loads(handle.dumps())) is \
                CommitOutcome.ALREADY_COMMITTED
        expected += [(key, lsn) for key, lsn, _, _ in changes]
        records = kafka_broker.read(topic)
        assert sorted((int(r.key), version_of(r)) for r in records) == sorted(expected)


def feed(batches: int, keys: int, per_batch: int) -> Iterator[list[tuple[Any, ...]]]:
    """Seeded batches of changes: versions mostly increasing per key, some late within a
    batch, some deletes and re-inserts."""
    rng = random.Random(RANDOM_SEED)
    lsn = 0
    for _ in range(batches):
        rows = []
        for _ in range(per_batch):
            lsn += 1
            stamp = lsn - rng.randrange(3) * 2  # now and then older than one already sent
            op = "d" if rng.random() < 0.2 else rng.choice("cu")
            rows.append((rng.randrange(keys), stamp, op, f"v{stamp}"))
        yield rows


def newest(rows: Sequence[tuple[Any, ...]]) -> dict[int, tuple[int, str | None]]:
    """The reference reduce of one batch: each key's highest version (the first of one)."""
    held: dict[int, tuple[int, str | None]] = {}
    for key, lsn, op, name in rows:
        if key not in held or lsn > held[key][0]:
            held[key] = (lsn, None if op == "d" else name)
    return held


def test_the_topic_folded_by_key_equals_the_feed_and_a_late_change_is_not_suppressed(
        kafka_broker: KafkaBroker) -> None:
    """What compaction keeps (each key's last record) equals each batch's newest change per
    key applied batch after batch; a late older change of a later batch wins (documented:
    a topic keeps no version per key to compare it with)."""
    topic = compacted_topic(kafka_broker, "compact,delete")  # both policies: accepted
    sink = keyed_sink(kafka_broker, topic)
    batches = list(feed(batches=4, keys=12, per_batch=40))
    batches.append([(3, 1, "u", "late: older than every version of key 3")])
    reference: dict[int, tuple[int, str | None]] = {}
    for number, rows in enumerate(batches):
        handles = [put(sink, [r for r in rows if r[0] % 2 == part], batch=number,
                       partition=part, arrow=part == 0) for part in range(2)]
        for handle in handles:
            assert commit(sink, handle) is CommitOutcome.COMMITTED
        reference.update(newest(rows))
    records = kafka_broker.read(topic)
    assert fold(records) == reference
    assert reference[3] == (1, "late: older than every version of key 3")
    assert len(records) == sum(len(newest(rows)) for rows in batches)
    assert one_partition_per_key(records)


def test_a_topic_that_is_not_compacted_is_refused_at_start_naming_cleanup_policy(
        kafka_broker: KafkaBroker, kafka_topic: str) -> None:
    with pytest.raises(ConfigurationError,
                       match=r"cleanup\.policy=delete.*Fix: .*--add-config cleanup\.policy="
                             r"compact"):
        keyed_sink(kafka_broker, kafka_topic)
    KafkaSink(**kafka_broker.options(), topic=kafka_topic, key="id",
              min_commit_window_ms=0).check_schema(CHANGE_COLUMNS)  # insert mode: any policy


@pytest.mark.parametrize(("options", "refusal"), [
    ({"mode": "keyed", "version": "lsn"}, r"needs key=.*Fix: pass key="),
    ({"key": "id", "mode": "keyed"}, r"key columns and a version column"),
    ({"key": "id", "mode": "keyed", "version": "lsn", "topic": None, "topic_column": "t"},
     r"topic_column='t'.*Fix: pass topic="),
    ({"key": "id", "version": "lsn"}, r"belong to mode='keyed'"),
    ({"key": "id", "version_header": "v"}, r"version_header= belongs to mode='keyed'"),
    ({"key": "id", "mode": "keyed", "version": "lsn", "deleted": "op", "headers": ("op",)},
     r"deleted='op' marks deletes.*never written"),
    ({"key": "id", "mode": "keyed", "version": "lsn", "version_header": "name",
      "headers": ("name",)}, r"version_header='name'"),
    ({"key": "id", "mode": "keyed", "version": "id"}, r"different columns"),
    ({"key": "id", "mode": "upsert"}, r"unknown mode 'upsert'.*Fix: pass mode='insert'"),
])
def test_options_that_do_not_go_with_the_keyed_mode_are_refused_with_the_fix(
        options: dict[str, Any], refusal: str) -> None:
    with pytest.raises(ConfigurationError, match=refusal):
        KafkaSink("127.0.0.1:9", **{"topic": "changes", **options})


def test_the_keyed_mode_routes_by_its_key_and_needs_describe_configs_on_its_topic() -> None:
    keyed = KafkaSink("127.0.0.1:9", "changes", key="id", mode="keyed", version="lsn")
    assert keyed.route_key() == ("id",)
    assert KafkaSink("127.0.0.1:9", "changes", key="id").route_key() is None
    commands = [g.command("User:etl") for g in grants(["changes"], "etl-", "reg", keyed=True)]
    assert "--add --allow-principal User:etl --operation DescribeConfigs --topic changes" in \
        commands
