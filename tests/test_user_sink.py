"""A sink written from the README alone (tests/user_sink.py) passes the shared suites."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.user_sink import JsonLinesSink
from twophase import TwoPhaseCommitSink
from twophase.testing.contract import SinkContract


class TestJsonLinesContract(SinkContract):
    purges_commit_records = False  # its proof of commit is the visible file itself
    has_schema = False  # JSON lines take any columns

    @pytest.fixture
    def sink(self, tmp_path: Path) -> JsonLinesSink:
        return JsonLinesSink(tmp_path / "out")

    def visible(self, sink: TwoPhaseCommitSink[Any]) -> list[int]:
        assert isinstance(sink, JsonLinesSink)
        return sorted(row["event_id"] for row in sink.rows())
