"""The keyed mode (``mode="keyed"``): a compacted topic as the changelog of each key's state.

``KafkaSink(..., key="id", mode="keyed", version="lsn", deleted="op")`` gives the keyed mode
of the table sinks (:mod:`twophase.kit`, ``Keyed``) the meaning a topic can hold:

============  =====================================================================================
rule          on a topic
============  =====================================================================================
key           ``key=``: the record key (one column); every record of a key goes to one partition
              (the producer's murmur2 partitioner, as Java's), so compaction keeps its newest
reduce        a task reduces its rows to the newest change per key (the version; of one version,
              the first row), in Arrow on the data source path, and produces one record per key
              and hand-over: its held changes once it holds :data:`HELD_CHUNKS` chunks' worth of
              keys, and at the end. A key that comes again in a later hand-over of the same task
              is produced again only if its version is newer than the one the task produced
              (a version per key is kept for that: memory, the task's keys and versions; its
              rows: the held chunks), so a key's records follow its versions and the topic's
              last record of the key, the one compaction keeps, is the task's newest
version       a header, :data:`VERSION_HEADER` unless ``version_header=`` names another, holding
              the version's text as a ``headers=`` column's is encoded (a string as UTF-8, a
              number as its digits, anything else as its JSON text)
delete        ``deleted=`` (a true boolean or Debezium's ``'d'``) makes the record a
              **tombstone**: the key, a null value, the version header. The marker column is
              read, never written into the value (nor may it be ``value=`` or a header)
routing       the sink's ``route_key()`` is its key: ``write_stream`` routes each key's rows of a
              batch into one task. Two tasks' records of one key would land in its partition in
              the order their producers appended them, not by version, nor by the order the
              driver commits their transactions: without routing the newest would not win
batches       a batch's records are appended once the previous batch is decided (every record of
              it flushed before its handle reached the driver), so a later batch's record of a
              key follows an earlier batch's in the partition: a read_committed consumer and
              compaction see a key's changes in batch order
late          a late older change in a later batch is **not suppressed**: a topic keeps no
              version per key to compare it with, so its record follows the newer one and
              compaction keeps it. A consumer that must not go back compares the version header
              with what it holds; feeds that can be late belong in a table sink's keyed mode
policy        the preflight (``check_schema``) refuses a topic whose ``cleanup.policy`` lacks
              ``compact`` (``compact,delete`` is fine); ``topic_column=`` is refused with the
              keyed mode (its topics are unknown before the rows come)
tombstones    the topic's ``delete.retention.ms`` (1 day by default) keeps a tombstone for readers
              that lag; there is no ``tombstone_retention_s``
============  =====================================================================================

The principal needs DESCRIBE_CONFIGS on the topic besides WRITE (:mod:`~sinks.kafka.access`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from kafka.admin import ConfigResource, ConfigResourceType

from sinks.kafka.errors import SYSTEM
from sinks.kafka.records import Record, RecordShape, as_bytes
from twophase import Column, ConfigurationError
from twophase.kit import DEFAULT_CHUNK_SIZE, HELD_CHUNKS, Keyed, batch_chunks, chunks

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

#: The header holding a record's version (``version_header=`` names another).
VERSION_HEADER: Final = "twophase.version"
#: The topic setting the keyed mode needs, and the value it must include.
CLEANUP_POLICY: Final = "cleanup.policy"
COMPACT: Final = "compact"
#: Rows a keyed task reduces at a time; it produces its changes once it holds
#: :data:`HELD_CHUNKS` times as many keys (and at the end).
CHUNK_ROWS: Final = DEFAULT_CHUNK_SIZE
FIX_COMPACT = ("make the topic compacted: kafka-configs.sh --bootstrap-server ... --alter "
               "--entity-type topics --entity-name <topic> --add-config cleanup.policy=compact "
               "(or [compact,delete]), or create it with --config cleanup.policy=compact")
FIX_TOPIC_CONFIGS_ACCESS = ("grant the sink's principal DESCRIBE_CONFIGS on the topic "
                            "(mode='keyed' reads its cleanup.policy): kafka-acls.sh "
                            "--bootstrap-server ... --add --allow-principal User:<sink's user> "
                            "--operation DescribeConfigs --topic <topic>")


def validate_changelog(keyed: Keyed | None, shape: RecordShape,
                       version_header: str | None) -> Changelog | None:
    """The keyed mode of a KafkaSink's options (None in the insert mode), or
    ConfigurationError naming what cannot go with it."""
    if keyed is None:
        if version_header is not None:
            raise ConfigurationError(
                f"{SYSTEM}: version_header= belongs to mode='keyed'.",
                fix="pass mode='keyed' with version= (and deleted=), or leave version_header= "
                    "out")
        return None
    if shape.topic_column is not None:
        raise ConfigurationError(
            f"{SYSTEM}: mode='keyed' writes one compacted topic, named by topic=; "
            f"topic_column={shape.topic_column!r} names topics only the rows know, whose "
            f"{CLEANUP_POLICY} the start checks cannot read.",
            fix="pass topic='...' (one sink per topic: several sinks in a SinkGroup for "
                "several topics), or leave mode='keyed' out")
    if keyed.deleted is not None and keyed.deleted in (shape.value, *shape.headers):
        raise ConfigurationError(
            f"{SYSTEM}: deleted={keyed.deleted!r} marks deletes: it is read, never written, so "
            "it cannot be the value= column or a headers= column.",
            fix="name another column in value= / headers=, or another delete marker")
    header = VERSION_HEADER if version_header is None else version_header
    if not header or header in shape.headers:
        raise ConfigurationError(
            f"{SYSTEM}: version_header={header!r} must be a header name no headers= column "
            "takes.", fix=f"leave version_header= out (default {VERSION_HEADER!r}) or rename it")
    return Changelog(keyed, shape, header)


class Produced:
    """The version of each key one transaction has produced so far (see the module's
    ``reduce`` rule)."""

    def __init__(self) -> None:
        self.versions: dict[Any, Any] = {}

    def newer(self, keys: Sequence[Any], versions: Sequence[Any]) -> list[bool]:
        """For each change of one hand-over (its keys distinct), whether to produce it: its
        version is newer than what this transaction produced for its key (then it is
        remembered)."""
        held = self.versions
        fresh: list[bool] = []
        for key, version in zip(keys, versions, strict=True):
            before = held.get(key)
            newer = before is None or version > before
            if newer:
                held[key] = version
            fresh.append(newer)
        return fresh


@dataclass(frozen=True)
class Changelog:
    """The keyed mode of one KafkaSink: how its rows become one record per key and version."""

    keyed: Keyed
    shape: RecordShape
    version_header: str = VERSION_HEADER
    #: Rows reduced at a time (a hand-over: :data:`HELD_CHUNKS` times as many keys).
    chunk_rows: int = CHUNK_ROWS

    @property
    def key(self) -> str:
        """The record key's column (the keyed mode's one key column)."""
        return self.keyed.key[0]

    def check_columns(self, where: str, columns: Sequence[Column]) -> None:
        """The rows have the key, version and delete marker; the version orders."""
        self.keyed.check_columns(where, columns)

    def check_topic(self, admin: Any, topic: str, where: str) -> None:
        """Refuse a topic whose ``cleanup.policy`` does not include ``compact``."""
        described = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, configs={CLEANUP_POLICY: None})],
            config_filter="all")
        entry = described.get("topic", {}).get(topic, {}).get(CLEANUP_POLICY)
        raw = entry.get("value") if isinstance(entry, dict) else entry
        if raw is None:
            raise ConfigurationError(
                f"{SYSTEM}: the brokers did not report {CLEANUP_POLICY} of topic {topic!r} in "
                f"{where}.", fix=FIX_TOPIC_CONFIGS_ACCESS)
        policies = [part.strip() for part in str(raw).split(",")]
        if COMPACT not in policies:
            raise ConfigurationError(
                f"{SYSTEM}: mode='keyed' keeps each key's latest record on a compacted topic; "
                f"topic {topic!r} in {where} has {CLEANUP_POLICY}={raw}, which drops records by "
                "age and keeps every change of a key until then.", fix=FIX_COMPACT)
        log.debug("topic %s: %s=%s", topic, CLEANUP_POLICY, raw)

    def records(self, rows: Iterable[Sequence[Any]], columns: Sequence[str],
                produced: Produced) -> Iterator[Record]:
        """A task's rows (of ``columns``) as the records of their newest changes per key."""
        written = self.keyed.written(columns)
        key_at, version_at = written.index(self.key), written.index(self.keyed.version)
        encode, header = self.shape.encoder(), self.version_header
        for newest in self.keyed.newest_in_chunks(chunks(rows, self.chunk_rows), columns,
                                                  HELD_CHUNKS * self.chunk_rows):
            fresh = produced.newer([row[key_at] for row in newest],
                                   [row[version_at] for row in newest])
            for row, wanted in zip(newest, fresh, strict=True):
                if wanted:
                    topic, key, value, headers = encode(dict(zip(written, row[:-1],
                                                                 strict=True)))
                    yield (topic, key, None if row[-1] else value,
                           [*(headers or ()), (header, as_bytes(row[version_at]))])

    def arrow_records(self, batches: Iterable[pa.RecordBatch], produced: Produced
                      ) -> Iterator[Record]:
        """The same from a task's record batches: reduced in Arrow, encoded column-wise."""
        import pyarrow as pa  # noqa: PLC0415 - only the Arrow path needs pyarrow

        from sinks.kafka.arrow import changelog_columns  # noqa: PLC0415

        tables = (pa.Table.from_batches(chunk)
                  for chunk in batch_chunks(batches, self.chunk_rows))
        for newest in self.keyed.newest_in_tables(tables, HELD_CHUNKS * self.chunk_rows):
            fresh = produced.newer(newest.column(self.key).to_pylist(),
                                   newest.column(self.keyed.version).to_pylist())
            kept = newest if all(fresh) else newest.filter(pa.array(fresh, pa.bool_()))
            for batch in kept.to_batches():
                yield from changelog_columns(self.shape, batch, self.keyed.version,
                                             self.version_header).records()
