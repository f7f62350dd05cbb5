"""One local SparkSession for the whole test run (a JVM start costs seconds)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from twophase._harness import SPARK_CONF


def require_java() -> None:
    if shutil.which("java") is None:
        pytest.fail("Spark tests need Java 17 on PATH "
                    "(Debian: apt-get install openjdk-17-jre-headless)")


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    require_java()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = SparkSession.builder.master("local[2]").appName("twophase-tests")
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
