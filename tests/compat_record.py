"""A pytest plugin for tests/spark/test_compat.py: records every warning of a pytest run (collection
included) as JSON lines in the file that ``COMPAT_WARNINGS`` names."""

from __future__ import annotations

import json
import os
import warnings


def pytest_warning_recorded(warning_message: warnings.WarningMessage, when: str,
                            nodeid: str) -> None:
    record = {"category": warning_message.category.__name__,
              "message": str(warning_message.message),
              "filename": warning_message.filename, "when": when, "nodeid": nodeid}
    with open(os.environ["COMPAT_WARNINGS"], "a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")
