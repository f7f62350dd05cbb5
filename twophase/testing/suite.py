"""What every shipped pytest suite stands on: one fresh :class:`~twophase.testing.Target` per
test, the ``target`` fixture.

A suite class gets it one of two ways: name a fixture returning a
:class:`~twophase.testing.target.Setup` in ``setup_fixture`` (each test then gets
``setup.new_target(**target_options)``; override the ``target_overrides`` fixture where the
options need other fixtures), or override ``target`` itself::

    class TestMySinkContract(SinkContract):
        setup_fixture = "my_setup"

    class TestMySinkCrashes(CrashSuite):
        @pytest.fixture
        def target(self, tmp_path):
            return MyTarget("my_package.sinks:MySink", {"directory": str(tmp_path / "out")})
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import pytest

from twophase.testing.target import Setup, Target


class TargetSuite:
    """The base of the suites: the ``target`` fixture (see the module docstring)."""

    #: The fixture of the setup whose fresh targets the tests take (None: override ``target``).
    setup_fixture: ClassVar[str | None] = None
    #: Options of every target of the setup, over its defaults.
    target_options: ClassVar[Mapping[str, Any]] = {}

    @pytest.fixture
    def target_overrides(self) -> Mapping[str, Any]:
        """The options of this test's target over the setup's defaults."""
        return self.target_options

    @pytest.fixture
    def target(self, request: pytest.FixtureRequest,
               target_overrides: Mapping[str, Any]) -> Target:
        """A fresh, empty target of the setup that ``setup_fixture`` names."""
        if self.setup_fixture is None:
            raise NotImplementedError("name a setup fixture in setup_fixture, or override the "
                                      "target fixture: a fresh, empty target per test")
        setup: Setup = request.getfixturevalue(self.setup_fixture)
        return setup.new_target(**target_overrides)
