"""One test setup per sink: its external system as every suite takes it.

Each module holds one :class:`~setups.base.SinkSetup` (start or adopt the server, a fresh
target, the sink's options, how a reader sees the rows, what is in doubt); the contract
suite, the crash suite, the model, the chaos suite and the benchmarks all take it from here
(``tests/conftest.py`` builds them over the session's servers, ``chaos`` and ``bench`` start
their own with :meth:`~setups.base.SinkSetup.started`). The server processes themselves are
in :mod:`setups.servers`.

A sink's registration is its setup's line in :data:`SETUPS`: every suite derives its
parameters from the registered setups and their class attributes (the model's examples in
CI, the release the sink first shipped in, whether it joins the every-sink group, the
servers its setup is built over in a test session). Nothing else names the sink.
"""

from __future__ import annotations

from setups.base import Proxy, ProxyFactory, SinkSetup, Target
from setups.delta import DeltaSetup
from setups.http import HttpSetup
from setups.iceberg import IcebergSetup
from setups.kafka import KafkaSetup
from setups.mysql import MySQLSetup
from setups.nats import NatsSetup
from setups.postgres import PostgresSetup
from setups.redis import RedisSetup
from setups.s3 import S3Setup
from setups.sqlite import SQLiteSetup

#: Every prebuilt sink's setup, by name: the registry.
SETUPS: dict[str, type[SinkSetup]] = {
    setup.name: setup
    for setup in (SQLiteSetup, MySQLSetup, PostgresSetup, S3Setup, KafkaSetup, HttpSetup,
                  DeltaSetup, IcebergSetup, RedisSetup, NatsSetup)}

__all__ = ["SETUPS", "DeltaSetup", "HttpSetup", "IcebergSetup", "KafkaSetup", "MySQLSetup",
           "NatsSetup", "PostgresSetup", "Proxy", "ProxyFactory", "RedisSetup", "S3Setup",
           "SQLiteSetup", "SinkSetup", "Target"]
