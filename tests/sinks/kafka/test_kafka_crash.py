"""The crash suite against a real Kafka broker: a Spark driver SIGKILLed at every crash point,
judged by a read_committed consumer; at the end no open transaction of the query is left.

Under ``-m long`` (CI time) it runs against the secured broker (SASL_SSL, SCRAM-SHA-512,
certificate and host name verified, ACLs enforced), as a user holding exactly the ACLs
:mod:`sinks.kafka.access` lists, its password read from a file by the driver and every
executor, and over the plain broker. In CI Kafka is crashed in the PostgreSQL + Iceberg + Kafka
group (``tests/spark/test_group_crash.py``), and the listed ACLs are checked call by call by
``tests/sinks/kafka/test_kafka_security.py``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from setups.base import Target as SetupTarget
from setups.kafka import SecuredKafkaSetup
from setups.servers.kafka import APP_USER
from tests.sinks.sqlite.test_sqlite_crash import PIPELINED_TRIGGER
from twophase._crash import COMMITTING_BEHIND, CRASH_POINTS
from twophase.testing.crash import DECISION_POINTS, CrashSuite, FeedSource
from twophase.testing.target import Target

pytestmark = [pytest.mark.spark, pytest.mark.crash]


@pytest.mark.long
class TestKafkaCrashes(CrashSuite):
    """A crash leaves open transactions (invisible to read_committed), never a duplicate."""

    setup_fixture = "kafka_setup"


@pytest.mark.long
class TestPipelinedKafkaCrashes(TestKafkaCrashes):
    """Batches commit behind the next one (Kafka's id pool: batch b + 2 begins only after
    batch b is committed): killed at every point, and as a commit behind begins."""

    trigger = PIPELINED_TRIGGER
    crash_points = (*CRASH_POINTS, COMMITTING_BEHIND)


@pytest.mark.long  # CI time: Kafka crashed in CI in the PostgreSQL + Iceberg + Kafka group; its
class TestSecuredKafkaCrashes(CrashSuite):  # ACLs, every step, in test_kafka_security.py
    """The same over SASL_SSL with least privilege; the broker's authorizer saw the sink's
    user write the records (the executors' librdkafka) and end the transactions (the driver's
    kafka-python)."""

    setup_fixture = "kafka_secured_setup"
    #: Either side of the decision: every point over the plain broker (TestKafkaCrashes) and in
    #: the MySQL + Kafka group (tests/spark/test_group_crash.py) under -m long; in CI in the model
    crash_points = DECISION_POINTS

    def test_a_driver_killed_at_every_point_in_turn_delivers_every_row_exactly_once(
        self, target: Target, state: tuple[str | None, dict[str, Any]],
        spark_conf: dict[str, str], driver_disk: Path, tmp_path: Path, *,
        source: FeedSource | None
    ) -> None:
        super().test_a_driver_killed_at_every_point_in_turn_delivers_every_row_exactly_once(
            target, state, spark_conf, driver_disk, tmp_path, source=source)
        assert isinstance(target, SetupTarget)
        assert isinstance(target.setup, SecuredKafkaSetup)
        broker = target.setup.broker
        assert target.options["bootstrap_servers"] == broker.bootstrap_servers
        assert target.options["tls"] == "verify" and target.options["sasl_mechanism"]
        allowed = broker.authorizer_log.read_text()
        prefix = re.escape(target.options["transactional_id_prefix"])
        for request, resource in (("Produce", f"Topic:LITERAL:{target.options['topic']}"),
                                  ("EndTxn", f"TransactionalId:LITERAL:{prefix}\\S+")):
            assert re.search(f"Principal = User:{APP_USER} is Allowed operation = WRITE .* "
                             f"on resource = {resource} for request = {request} ",
                             allowed), f"no {request} by {APP_USER} in the authorizer's log"
