"""Changing the target's schema while a crashed run left a decided batch prepared (MySQL).

The path the README documents ("Changing the target's schema"): stop the query; ``python -m
twophase.status`` names the prepared transactions holding locks on the target and the command
that releases them; ``python -m twophase.cleanup --settle`` commits the decided batch and
aborts every undecided transaction without starting the query; the ``ALTER TABLE`` then
succeeds at once, and the redeploy with the new column delivers every row exactly once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pymysql
import pytest
from pyspark.sql import SparkSession

from setups.mysql import ORDERS_DDL as MYSQL_ORDERS_DDL
from setups.servers.mariadb import Db, MariaDBServer
from sinks.mysql import MySQLXASink
from twophase._crash import AFTER_DECISION
from twophase.spark import write_stream
from twophase.testing.driver import DriverSpec, generate_feed, launch, read_feed

pytestmark = [pytest.mark.spark, pytest.mark.crash]

FILES, ROWS_PER_FILE = 3, 100
#: Seconds a migration waits for a lock (the table's, or InnoDB's on a row: 50 s by default).
LOCK_WAIT_TIMEOUT = 1
LOCK_WAIT_TIMEOUT_ERROR = 1205
ALTER = "ALTER TABLE `{table}` ADD COLUMN note VARCHAR(16) NULL"
PASSWORD_ENV = "ORDERS_DB_PASSWORD"


def alter(db: Db, table: str) -> None:
    db.query(ALTER.format(table=table),
             init_command=f"SET SESSION lock_wait_timeout = {LOCK_WAIT_TIMEOUT}, "
             f"innodb_lock_wait_timeout = {LOCK_WAIT_TIMEOUT}")


def cleanup_config(path: Path, mariadb: MariaDBServer, table: str, state: str) -> Path:
    """The cleanup config of the README (the password from the environment)."""
    params = mariadb.params
    path.write_text(
        "[[target]]\n"
        'sink = "sinks.mysql:MySQLXASink"\n'
        f'options = {{ host = "{params.host}", port = {params.port}, user = "{params.user}", '
        f'password = {{ env = "{PASSWORD_ENV}" }}, database = "{params.database}", '
        f'table = "{table}", tls = "{params.tls}" }}\n'
        f'states = ["{state}"]\n')
    return path


def test_a_migration_after_a_crash_with_a_decided_batch_prepared(
    spark: SparkSession, mariadb: MariaDBServer, db: Db, tmp_path: Path
) -> None:
    table = db.new_table(MYSQL_ORDERS_DDL, prefix="migrated_")
    generate_feed(tmp_path / "feed", files=FILES, rows_per_file=ROWS_PER_FILE)
    options = {**mariadb.params.kwargs(), "table": table}
    spec = DriverSpec(input_dir=str(tmp_path / "feed"), checkpoint=str(tmp_path / "ckpt"),
                      sink_factory="sinks.mysql:MySQLXASink", sink_kwargs=options)
    crashed = launch(spec, workdir=tmp_path / "runs", crash_at=f"{AFTER_DECISION}@1")
    assert crashed.crashed, f"the driver did not die: see {crashed.log}"
    state = spec.state_store()
    decided = [str(handle.txn_id) for handle in state.read_existing().pending[0].handles]
    assert len(db.xa_recover()) == len(decided), "the decided batch's branches are prepared"

    # Without the documented step the migration waits for the prepared branches' locks.
    with pytest.raises(pymysql.err.OperationalError) as waited:
        alter(db, table)
    assert waited.value.args[0] == LOCK_WAIT_TIMEOUT_ERROR

    status = subprocess.run([sys.executable, "-m", "twophase.status", spec.checkpoint],
                            capture_output=True, text=True, check=True)
    assert all(txn in status.stdout for txn in decided)
    assert "hold its locks" in status.stdout
    assert "python -m twophase.cleanup --settle --sink sinks.mysql" in status.stdout

    config = cleanup_config(tmp_path / "cleanup.toml", mariadb, table, state.location)
    settled = subprocess.run(
        [sys.executable, "-m", "twophase.cleanup", "--config", str(config), "--settle"],
        capture_output=True, text=True, check=False,
        env={**os.environ, PASSWORD_ENV: mariadb.params.password})
    assert settled.returncode == 0, settled.stderr
    assert [json.loads(line)["action"] for line in settled.stdout.splitlines()] == ["settle"]
    assert mariadb.params.password not in settled.stdout + settled.stderr
    assert db.xa_recover() == []

    alter(db, table)  # at once: nothing holds a lock on the table

    redeploy = read_feed(spark, tmp_path / "feed").selectExpr("*", "'redeployed' AS note")
    write_stream(redeploy, MySQLXASink(**options), checkpoint_location=spec.checkpoint,
                 trigger={"availableNow": True}).awaitTermination()
    rows = [row[0] for row in db.query(f"SELECT event_id FROM `{table}` ORDER BY 1")]
    assert rows == list(range(FILES * ROWS_PER_FILE))
    assert db.query(f"SELECT count(*) FROM `{table}` WHERE note = 'redeployed'") == [
        (ROWS_PER_FILE,)]  # the batch after the migration
    assert db.xa_recover() == []
