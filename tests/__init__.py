"""The test suite, in tiers and rooms: ``unit/`` (no server, no Spark), ``sinks/<name>/`` (one
prebuilt sink's tests; ``sinks/`` itself those of several), ``spark/`` (the framework through
real Spark), ``repo/`` (docs, guarantees, registry, layering, budgets); the servers' fixtures
in ``fixtures/``. The setups' modules hold assertions: pytest rewrites them."""

from pathlib import Path

import pytest

#: The repository's root, and the test data checked in under it (whatever room a test is in).
REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"

pytest.register_assert_rewrite("setups")
