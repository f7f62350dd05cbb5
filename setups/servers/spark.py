"""One local SparkSession for the whole test run (a JVM start costs seconds).

Its JVM and Python workers run in a time zone that is neither UTC nor the session time zone,
so that every Spark test also checks that what a sink receives does not depend on either.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from twophase.testing.driver import local_session

#: The zone of the executors' processes, and Spark's session zone: both not UTC, not equal.
WORKER_TZ = "Asia/Kolkata"
SESSION_TZ = "America/Los_Angeles"


def require_java() -> None:
    if shutil.which("java") is None:
        pytest.fail("Spark tests need Java 17 on PATH "
                    "(Debian: apt-get install openjdk-17-jre-headless)")


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    require_java()
    own_tz = os.environ.get("TZ")
    os.environ["TZ"] = WORKER_TZ  # inherited by the JVM and every Python worker it starts
    try:
        session = local_session("twophase-tests", conf={"spark.sql.session.timeZone": SESSION_TZ})
    finally:
        if own_tz is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = own_tz
    yield session
    session.stop()
