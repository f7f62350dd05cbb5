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
    """Inherit it before the suite and name the setup fixture of ``tests/conftest.py`` in
    ``setup_fixture``; ``target_options`` go to every target (or override the
    ``target_overrides`` fixture where they need other fixtures)."""

    setup_fixture: ClassVar[str]
    target_options: ClassVar[Mapping[str, Any]] = {}
    current: Target

    @pytest.fixture
    def sink_setup(self, request: pytest.FixtureRequest) -> SinkSetup:
        setup: SinkSetup = request.getfixturevalue(self.setup_fixture)
        return setup

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
    setup_fixture = "sqlite_setup"


class MySQLTarget(OnSetup):
    setup_fixture = "mysql_setup"


class PostgresTarget(OnSetup):
    setup_fixture = "postgres_setup"


class S3Target(OnSetup):
    setup_fixture = "s3_setup"


class KafkaTarget(OnSetup):
    setup_fixture = "kafka_setup"


class HttpTarget(OnSetup):
    setup_fixture = "http_setup"
