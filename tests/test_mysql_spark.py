"""MySQLXASink driven by real PySpark: bad input stops the query cleanly, the fix delivers all.

After every failure: the cause and the fix in the error, no row of the failed batch visible,
and no prepared XA branch left on the server once the query has stopped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from sinks.mysql import MySQLXASink
from tests.conftest import MYSQL_ORDERS_DDL
from tests.servers.mariadb import Db, MariaDBServer
from twophase import ConfigurationError, RetryableError, SchemaMismatchError
from twophase._harness import generate_feed, read_feed
from twophase.spark import write_stream

pytestmark = pytest.mark.spark

FILES, ROWS_PER_FILE = 3, 100
@pytest.fixture
def table(db: Db) -> str:
    return db.new_table(MYSQL_ORDERS_DDL, prefix="spark_orders_")


@pytest.fixture
def feed(tmp_path: Path) -> Path:
    generate_feed(tmp_path / "feed", files=FILES, rows_per_file=ROWS_PER_FILE)
    return tmp_path / "feed"


def sink_for(mariadb: MariaDBServer, **options: Any) -> MySQLXASink:
    return MySQLXASink(**{**mariadb.params.kwargs(), **options})


def run_to_end(spark: SparkSession, feed: Path, sink: MySQLXASink, checkpoint: Path) -> None:
    write_stream(read_feed(spark, feed), sink, checkpoint_location=str(checkpoint),
                 trigger={"availableNow": True}).awaitTermination()


def visible(db: Db, table: str) -> list[int]:
    return [row[0] for row in db.query(f"SELECT event_id FROM `{table}` ORDER BY 1")]


def test_a_row_violating_a_constraint_stops_the_query_then_the_fix_delivers_all(
    spark: SparkSession, mariadb: MariaDBServer, db: Db, table: str, feed: Path, tmp_path: Path
) -> None:
    bad_file = sorted(feed.iterdir())[1]
    stat = bad_file.stat()
    good = bad_file.read_text()
    lines = good.splitlines()
    lines[5] = json.dumps({**json.loads(lines[5]), "status": "bogus"})
    bad_file.write_text("\n".join(lines) + "\n")
    os.utime(bad_file, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # keep the file order
    sink = sink_for(mariadb, table=table)

    with pytest.raises(StreamingQueryException,
                       match=r"the server did not take the rows as given \(4025: CONSTRAINT "
                             r".* failed .*Fix: fix the rows that violate the CHECK"):
        run_to_end(spark, feed, sink, tmp_path / "ckpt")
    assert visible(db, table) == list(range(ROWS_PER_FILE))  # batch 0 only
    assert db.xa_recover() == []

    bad_file.write_text(good)
    os.utime(bad_file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    run_to_end(spark, feed, sink, tmp_path / "ckpt")
    assert visible(db, table) == list(range(FILES * ROWS_PER_FILE))
    assert db.xa_recover() == []


@pytest.mark.parametrize(("overrides", "error", "message"), [
    ({"password": "wrong"}, ConfigurationError,
     r"connecting as user 'twophase' on MySQL server 127\.0\.0\.1:\d+ failed: \[1045\].*"
     r"Fix: check the user and password"),
    ({"port": 1}, RetryableError,
     r"on MySQL server 127\.0\.0\.1:1 failed: \[2003\].*Fix: check that the server runs"),
    ({"table": "no_such_table"}, SchemaMismatchError, r"does not exist .*Fix: create it"),
])
def test_a_wrong_server_or_table_is_named_before_the_query_starts_then_the_fix_delivers_all(
    spark: SparkSession, mariadb: MariaDBServer, db: Db, table: str, feed: Path,
    tmp_path: Path, overrides: dict[str, Any], error: type[Exception], message: str,
) -> None:
    with pytest.raises(error, match=message):
        wrong = sink_for(mariadb, **{"table": table, **overrides})
        run_to_end(spark, feed, wrong, tmp_path / "ckpt")
    assert visible(db, table) == []
    assert db.xa_recover() == []
    assert "wrong" not in repr(sink_for(mariadb, table=table, password="wrong"))

    run_to_end(spark, feed, sink_for(mariadb, table=table), tmp_path / "ckpt")
    assert visible(db, table) == list(range(FILES * ROWS_PER_FILE))


def test_a_column_the_table_lacks_is_named_before_the_query_starts(
    spark: SparkSession, mariadb: MariaDBServer, table: str, feed: Path, tmp_path: Path
) -> None:
    df = read_feed(spark, feed).withColumnRenamed("status", "state")
    with pytest.raises(SchemaMismatchError, match=r"has no column 'state'.*Fix: ALTER TABLE"):
        write_stream(df, sink_for(mariadb, table=table), checkpoint_location=str(tmp_path / "ckpt"))
