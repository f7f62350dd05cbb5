"""One test setup per sink: its external system as every suite takes it.

Each module holds one :class:`~setups.base.SinkSetup` (start or adopt the server, a fresh
target, the sink's options, how a reader sees the rows, what is in doubt); the contract
suite, the crash suite, the model, the chaos suite and the benchmarks all take it from here
(``tests/conftest.py`` builds them over the session's servers, ``chaos`` and ``bench`` start
their own with :meth:`~setups.base.SinkSetup.started`). The server processes themselves are
in :mod:`setups.servers`. Adding a sink to every suite is one module here and one line in
:data:`SETUPS`.
"""

from __future__ import annotations

from setups.base import Proxy, ProxyFactory, SinkSetup, Target
from setups.http import HttpSetup
from setups.kafka import KafkaSetup
from setups.mysql import MySQLSetup
from setups.postgres import PostgresSetup
from setups.s3 import S3Setup
from setups.sqlite import SQLiteSetup

SETUPS: dict[str, type[SinkSetup]] = {
    setup.name: setup
    for setup in (SQLiteSetup, MySQLSetup, PostgresSetup, S3Setup, KafkaSetup, HttpSetup)}

__all__ = ["SETUPS", "HttpSetup", "KafkaSetup", "MySQLSetup", "PostgresSetup", "Proxy",
           "ProxyFactory", "S3Setup", "SQLiteSetup", "SinkSetup", "Target"]
