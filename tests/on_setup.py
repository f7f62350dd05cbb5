"""The shared suites over a setup (:mod:`setups`): a test class names its setup, the mixin
makes the contract suite's ``sink`` and the crash suite's ``target`` fresh targets of it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import pytest

from setups import SinkSetup, Target
from twophase import TwoPhaseCommitSink
from twophase.testing.crash import SinkTarget


class OnSetup:
    """Inherit it before the suite; override the ``sink_setup`` fixture (a setup fixture of
    ``tests/conftest.py``); ``target_options`` go to every target (or override the
    ``target_overrides`` fixture where they need other fixtures)."""

    target_options: ClassVar[Mapping[str, Any]] = {}
    current: Target

    @pytest.fixture
    def sink_setup(self) -> SinkSetup:
        raise NotImplementedError("override sink_setup: return one of conftest's setups")

    @pytest.fixture
    def target_overrides(self) -> Mapping[str, Any]:
        return self.target_options

    @pytest.fixture
    def sink(self, sink_setup: SinkSetup, target_overrides: Mapping[str, Any]
             ) -> TwoPhaseCommitSink[Any]:
        self.current = sink_setup.new_target(**target_overrides)
        return self.current.build()

    @pytest.fixture
    def target(self, sink_setup: SinkSetup, target_overrides: Mapping[str, Any]) -> SinkTarget:
        self.current = sink_setup.new_target(**target_overrides)
        return self.current.sink_target

    def visible(self, _: object) -> list[int]:
        return self.current.visible()

    def check_finished(self, _: object) -> None:
        assert self.current.in_doubt() == [], "left in doubt on the server"


class SQLiteTarget(OnSetup):
    @pytest.fixture
    def sink_setup(self, sqlite_setup: SinkSetup) -> SinkSetup:
        return sqlite_setup


class MySQLTarget(OnSetup):
    @pytest.fixture
    def sink_setup(self, mysql_setup: SinkSetup) -> SinkSetup:
        return mysql_setup


class PostgresTarget(OnSetup):
    @pytest.fixture
    def sink_setup(self, postgres_setup: SinkSetup) -> SinkSetup:
        return postgres_setup


class S3Target(OnSetup):
    @pytest.fixture
    def sink_setup(self, s3_setup: SinkSetup) -> SinkSetup:
        return s3_setup


class KafkaTarget(OnSetup):
    @pytest.fixture
    def sink_setup(self, kafka_setup: SinkSetup) -> SinkSetup:
        return kafka_setup


class HttpTarget(OnSetup):
    @pytest.fixture
    def sink_setup(self, http_setup: SinkSetup) -> SinkSetup:
        return http_setup
