"""One local SparkSession for the whole test run (a JVM start costs seconds)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from twophase._harness import local_session


def require_java() -> None:
    if shutil.which("java") is None:
        pytest.fail("Spark tests need Java 17 on PATH "
                    "(Debian: apt-get install openjdk-17-jre-headless)")


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    require_java()
    session = local_session("twophase-tests")
    yield session
    session.stop()
