"""One local SparkSession for a whole test run (a JVM start costs seconds): :func:`session`.

Its JVM and Python workers run in a time zone that is neither UTC nor the session time zone,
so that every Spark test also checks that what a sink receives does not depend on either.
The test fixture over it is ``spark`` (``tests/fixtures/spark.py``).
"""

from __future__ import annotations

import os
import shutil

from pyspark.sql import SparkSession

from setups.servers.local import ServerMissingError
from twophase.testing.driver import local_session
from twophase.testing.jvm import ensure_archive

#: The zone of the executors' processes, and Spark's session zone: both not UTC, not equal.
WORKER_TZ = "Asia/Kolkata"
SESSION_TZ = "America/Los_Angeles"


def require_java() -> None:
    """Raises :class:`ServerMissingError` if there is no Java to run Spark's JVM."""
    if shutil.which("java") is None:
        raise ServerMissingError("Spark tests need Java 17 on PATH "
                                 "(Debian: apt-get install openjdk-17-jre-headless)")


def session() -> SparkSession:
    """The local session of a test run, its workers in :data:`WORKER_TZ` and its session in
    :data:`SESSION_TZ`; the caller stops it."""
    require_java()
    ensure_archive()  # the run's drivers start from it (twophase.testing.jvm)
    own_tz = os.environ.get("TZ")
    os.environ["TZ"] = WORKER_TZ  # inherited by the JVM and every Python worker it starts
    try:
        return local_session("twophase-tests", conf={"spark.sql.session.timeZone": SESSION_TZ})
    finally:
        if own_tz is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = own_tz
