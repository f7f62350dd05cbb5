"""A sink written from the README alone (tests/user_sink.py) passes the shared suites."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.user_sink import JsonLinesSink
from twophase.testing import Target
from twophase.testing.contract import SinkContract


class JsonLinesTarget(Target):
    """A fresh directory of JSON-lines files, read as a reader of the files reads it."""

    @classmethod
    def in_directory(cls, directory: Path) -> JsonLinesTarget:
        return cls("tests.user_sink:JsonLinesSink", {"directory": str(directory)})

    def visible(self) -> list[int]:
        return sorted(row["event_id"] for row in JsonLinesSink(**self.options).rows())


class TestJsonLinesContract(SinkContract):
    purges_commit_records = False  # its proof of commit is the visible file itself
    has_schema = False  # JSON lines take any columns

    @pytest.fixture
    def target(self, tmp_path: Path) -> JsonLinesTarget:
        return JsonLinesTarget.in_directory(tmp_path / "out")
