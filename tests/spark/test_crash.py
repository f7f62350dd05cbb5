"""Crash tests of the sink a user wrote from the README: a real Spark driver SIGKILLed at the
named protocol points, then restarted.

Every prebuilt sink runs the shared crash suite (twophase.testing.crash) over its setup
(:mod:`setups`) in its own module, ``tests/test_<sink>_crash.py``; here the JSON Lines sink of
"Writing your own sink" (:mod:`tests.user_sink`) runs the same suite, as a user's would.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_user_sink import JsonLinesTarget
from twophase.testing.crash import CrashSuite

pytestmark = [pytest.mark.spark, pytest.mark.crash]


@pytest.mark.long
class TestJsonLinesCrashes(CrashSuite):
    """The sink a user wrote from the README survives the same crashes (its contract suite
    runs in CI: tests/unit/test_user_sink.py)."""

    @pytest.fixture
    def target(self, tmp_path: Path) -> JsonLinesTarget:
        return JsonLinesTarget.in_directory(tmp_path / "out")
