"""MySQLXASink driven by real PySpark: bad input stops the query cleanly, the fix delivers all.

After every failure: the cause and the fix in the error, no row of the failed batch visible,
and no prepared XA branch left on the server once the query has stopped.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from setups.mysql import ORDERS_DDL as MYSQL_ORDERS_DDL
from setups.servers.mariadb import Db, MariaDBServer
from sinks.mysql import MySQLXASink
from twophase import ConfigurationError, FatalError, SchemaMismatchError
from twophase._crash import AFTER_DECISION
from twophase.spark import write_stream
from twophase.testing.driver import FEED_START, DriverSpec, generate_feed, launch, read_feed

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
     r"connecting as user 'twophase' \(tls='off'\) on MySQL server 127\.0\.0\.1:\d+ failed: "
     r"\[1045\].*Fix: check the user and password"),
    ({"port": 1}, FatalError,  # retried as the query's RetryPolicy says, then given up
     r"still failing after \d+ attempts: .*on MySQL server 127\.0\.0\.1:1 failed: \[2003\]"
     r".*Fix: fix the cause.*check that the server runs"),
    ({"table": "no_such_table"}, SchemaMismatchError,
     r"no_such_table' doesn't exist.*Fix: create the table"),
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


def test_instants_are_stored_in_utc_whatever_the_server_and_worker_zones(
    spark: SparkSession, mariadb: MariaDBServer, db: Db, table: str, feed: Path, tmp_path: Path
) -> None:
    """Workers in Asia/Kolkata, session zone America/Los_Angeles, the server at +05:30."""
    db.query(f"ALTER TABLE `{table}` ADD COLUMN at TIMESTAMP(6) NULL")
    df = read_feed(spark, feed).selectExpr("*", "ts AS at")
    with mariadb.global_variable("time_zone", "'+05:30'"):
        write_stream(df, sink_for(mariadb, table=table), checkpoint_location=str(tmp_path / "c"),
                     trigger={"availableNow": True}).awaitTermination()
        stored = db.query(f"SELECT event_id, ts, UNIX_TIMESTAMP(at) FROM `{table}` ORDER BY 1")
    expected = [(i, (FEED_START + timedelta(seconds=i)).replace(tzinfo=None),
                 Decimal(int(FEED_START.timestamp()) + i).quantize(Decimal("0.000001")))
                for i in range(FILES * ROWS_PER_FILE)]
    assert stored == expected  # DATETIME: the UTC wall clock; TIMESTAMP: the instant


def test_a_schema_change_with_a_decided_batch_pending_is_refused_but_unblocked(
    spark: SparkSession, mariadb: MariaDBServer, db: Db, table: str, feed: Path, tmp_path: Path
) -> None:
    """A driver dies after deciding batch 1; the redeploy adds a column. The column check
    refuses it, but only after committing the decided batch, so ALTER TABLE is not blocked by
    the prepared branches' locks; then the redeploy delivers everything once."""
    spec = DriverSpec(input_dir=str(feed), checkpoint=str(tmp_path / "ckpt"),
                      sink_factory="sinks.mysql:MySQLXASink",
                      sink_kwargs={**mariadb.params.kwargs(), "table": table})
    crashed = launch(spec, workdir=tmp_path / "runs", crash_at=f"{AFTER_DECISION}@1")
    assert crashed.crashed, f"the driver did not die: see {crashed.log}"
    assert db.xa_recover(), "nothing was prepared when the driver died"

    def with_note() -> DataFrame:
        return read_feed(spark, feed).selectExpr("*", "'redeployed' AS note")

    sink = sink_for(mariadb, table=table)
    with pytest.raises(SchemaMismatchError, match=r"has no column 'note'.*Decided batches of "
                       r"earlier runs are committed.*Fix: ALTER TABLE"):
        write_stream(with_note(), sink, checkpoint_location=spec.checkpoint)
    assert db.xa_recover() == []
    assert visible(db, table) == list(range(2 * ROWS_PER_FILE))
    db.query(f"ALTER TABLE `{table}` ADD COLUMN note VARCHAR(16) NULL",
             init_command="SET SESSION lock_wait_timeout = 5")

    write_stream(with_note(), sink, checkpoint_location=spec.checkpoint,
                 trigger={"availableNow": True}).awaitTermination()
    assert visible(db, table) == list(range(FILES * ROWS_PER_FILE))
    assert db.query(f"SELECT count(*) FROM `{table}` WHERE note = 'redeployed'") == [
        (ROWS_PER_FILE,)]
    assert db.xa_recover() == []
