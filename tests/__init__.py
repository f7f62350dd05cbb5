"""The test suite. The setups' modules hold fixtures and assertions: pytest rewrites them."""

import pytest

pytest.register_assert_rewrite("setups")
