"""python -m twophase.check against the real servers of the test session, through the command
(the executors' check through the session's SparkSession, in-process: one test)."""

from __future__ import annotations

import contextlib
import functools
import http.client
import http.server
import importlib.metadata
import json
import pickle
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyspark
import pytest
from pyspark import cloudpickle

from setups import SinkSetup
from setups.least_privilege import least_privileged_target
from setups.servers.moto import MotoServer
from setups.servers.tls import CertificateAuthority
from sinks.postgres import PostgresSink
from sinks.sqlite import SQLiteSink
from twophase._eligibility import is_orphan
from twophase._handle import PROBE_QUERY_ID, TxnId
from twophase._loader import build_sink
from twophase._preflight import (
    EXECUTOR_TARGET_CHECK,
    ExecutorReport,
    ExecutorsSeen,
    Outcome,
    check_executor_imports,
    check_executors,
    import_failures,
    install_extras,
    report_here,
    run_checks,
    shipped_by_value,
    versions,
)
from twophase.check import EXIT_FAILED, EXIT_OK, EXIT_USAGE, parse_columns
from twophase.group import SinkGroup
from twophase.kit.s3 import S3_OPTIONS
from twophase.testing import Target
from twophase.testing.contract import ORDER_COLUMNS, QUERY_ID, list_in_doubt

COLUMNS = ", ".join(f"{c.name} {c.type}{'' if c.nullable else ' not null'}"
                    for c in ORDER_COLUMNS)
#: Headers a store without conditional writes ignores (the relay below drops them).
CONDITIONS = frozenset({"if-none-match", "if-match"})
CHECK_TIMEOUT_S = 60


def run_check(target: Target, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "twophase.check", "--sink", target.factory,
         "--options", json.dumps(target.options), *extra],
        capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, check=False)


def rows_of(output: str) -> dict[str, str]:
    """Each check's result, from the first line of its row (the one naming the result)."""
    rows = [(line[:24].strip(), line[26:38].strip()) for line in output.splitlines()[2:]]
    return {check: result for check, result in rows if result}


@pytest.mark.parametrize("setup_name", [
    "sqlite_setup", "mysql_setup", "postgres_setup", "s3_setup",
    # CI time: Kafka's checks run in CI on the secured broker (kafka_secured_setup below)
    pytest.param("kafka_setup", marks=pytest.mark.long),
    # the secured servers: verified TLS, SASL_SSL with ACLs, IAM-checked keys
    "secured_mysql_setup", "secured_postgres_setup", "kafka_secured_setup", "s3_secured_setup",
    "redis_secured_setup", "nats_secured_setup"])
def test_every_check_passes_on_a_sound_target(setup_name: str, tmp_path: Path,
                                              request: pytest.FixtureRequest) -> None:
    setup: SinkSetup = request.getfixturevalue(setup_name)
    target = setup.new_target()
    state = tmp_path / "state"
    done = run_check(target, "--state", str(state), "--columns", COLUMNS)
    assert done.returncode == EXIT_OK, done.stdout + done.stderr
    assert set(rows_of(done.stdout).values()) == {"pass"}, done.stdout
    assert "probe file removed" in done.stdout
    assert target.in_doubt() == [], "the probe was left in doubt"
    assert target.visible() == []
    assert [p.name for p in state.iterdir()] == ["state.lock"]


def test_a_state_on_s3_takes_conditional_writes(s3_setup: SinkSetup, moto_server: MotoServer,
                                                s3_bucket: str) -> None:
    done = run_check(s3_setup.new_target(), "--state", f"s3://{s3_bucket}/checks/ok",
                     "--state-options", json.dumps(_state_options(moto_server)))
    assert done.returncode == EXIT_OK, done.stdout + done.stderr
    assert "conditional writes honoured" in done.stdout
    listed = moto_server.client().list_objects_v2(Bucket=s3_bucket, Prefix="checks/ok/")
    assert listed.get("KeyCount") == 0, "the probe object was left"


@pytest.mark.parametrize("setup_name", ["mysql_setup", "postgres_setup"])
def test_a_missing_grant_fails_naming_it_and_leaves_nothing_in_doubt(
        setup_name: str, request: pytest.FixtureRequest) -> None:
    setup: SinkSetup = request.getfixturevalue(setup_name)
    target = least_privileged_target(setup, without=("markers", "INSERT"))
    done = run_check(target, "--columns", COLUMNS)
    assert done.returncode == EXIT_FAILED, done.stdout + done.stderr
    rows = rows_of(done.stdout)
    assert (rows["target"], rows["grants (probe)"]) == ("FAIL", "FAIL"), done.stdout
    flat = " ".join(done.stdout.split())
    assert "lacks INSERT ON" in flat and "GRANT INSERT ON" in flat, done.stdout
    assert target.in_doubt() == [], "XA RECOVER / pg_prepared_xacts lists a probe"


def test_a_certificate_of_another_ca_fails_naming_tls(
        secured_postgres_setup: SinkSetup, other_ca: CertificateAuthority) -> None:
    target = secured_postgres_setup.new_target()
    wrong = replace(target, options={**target.options, "ca_bundle": str(other_ca.cafile)})
    done = run_check(wrong)
    assert done.returncode == EXIT_FAILED, done.stdout + done.stderr
    assert rows_of(done.stdout)["target"] == "FAIL", done.stdout
    flat = " ".join(done.stdout.split())
    assert "certificate verify failed" in flat and "ca_bundle=" in flat, done.stdout
    assert "TLS" in flat or "SSL" in flat, done.stdout


def test_an_s3_state_without_conditional_writes_fails(
        s3_setup: SinkSetup, moto_server: MotoServer, s3_bucket: str) -> None:
    with condition_dropping_relay(moto_server.endpoint_url) as relay:
        options = {**_state_options(moto_server), "endpoint_url": relay}
        done = run_check(s3_setup.new_target(), "--state", f"s3://{s3_bucket}/checks/none",
                         "--state-options", json.dumps(options))
    assert done.returncode == EXIT_FAILED, done.stdout + done.stderr
    flat = " ".join(done.stdout.split())
    assert "ignores conditional writes" in flat and "If-None-Match" in flat, done.stdout


def test_the_http_sink_says_what_it_could_not_verify(http_setup: SinkSetup,
                                                     tmp_path: Path) -> None:
    target = http_setup.new_target()
    done = run_check(target, "--state", str(tmp_path / "state"))
    assert done.returncode == EXIT_OK, done.stdout + done.stderr
    assert rows_of(done.stdout)["grants (probe)"] == "not verified", done.stdout
    assert "visible write" in " ".join(done.stdout.split())
    assert target.visible() == []


def test_bad_usage_exits_2() -> None:
    done = subprocess.run([sys.executable, "-m", "twophase.check", "--options", "{}"],
                          capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, check=False)
    assert done.returncode == EXIT_USAGE
    assert "no sink given" in done.stderr


def test_the_executors_report_the_drivers_versions_and_clock(sqlite_setup: SinkSetup,
                                                             spark: Any) -> None:
    target = sqlite_setup.new_target()
    sink = build_sink(target.factory, target.options)
    results = {r.check: r for r in run_checks(sink, "orders", columns=ORDER_COLUMNS,
                                              spark=spark)}
    assert results["imports (executors)"].outcome is Outcome.PASSED, results
    assert "pyspark" in results["imports (executors)"].cause
    assert results["clocks (executors)"].outcome is Outcome.PASSED, results
    assert results[EXECUTOR_TARGET_CHECK].outcome is Outcome.PASSED, results
    assert list_in_doubt(sink, "orders") == []


#: A proxy no executor can reach (the discard port, closed): what a firewall between the
#: executors and the target does, while the driver reaches it.
CLOSED_PROXY = "http://127.0.0.1:9"


def test_an_executor_that_cannot_reach_the_target_fails_naming_it(
        s3_setup: SinkSetup, moto_server: MotoServer, spark: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    target = s3_setup.new_target()
    sink = build_sink(target.factory, target.options)
    for name in ("HTTP_PROXY", "http_proxy"):  # the executors' Python workers' environment
        monkeypatch.setitem(spark.sparkContext.environment, name, CLOSED_PROXY)
    results = {r.check: r for r in run_checks(sink, "orders", columns=ORDER_COLUMNS,
                                              spark=spark)}
    assert results["grants (probe)"].outcome is Outcome.PASSED, results  # from the driver
    refused = results[EXECUTOR_TARGET_CHECK]
    assert refused.outcome is Outcome.FAILED, results
    assert "proxy" in refused.cause.lower() and refused.fix, refused
    assert list_in_doubt(sink, "orders") == []
    assert moto_server.client().list_multipart_uploads(
        Bucket=target.options["bucket"]).get("Uploads", []) == []


def test_the_executors_of_a_group_import_each_members_client(orders_db: Path,
                                                             spark: Any) -> None:
    group = SinkGroup({"db": SQLiteSink(orders_db, "orders"),
                       "lake": PostgresSink(host="localhost", user="u", password="p",
                                            database="d", table="orders")})
    assert install_extras(group) == "sqlite,postgres"
    (imports, _clocks) = check_executors(spark, group)
    assert imports.outcome is Outcome.PASSED, imports
    assert f"psycopg {importlib.metadata.version('psycopg')}" in imports.cause
    report = ExecutorReport("executor-1", {"psycopg": None}, {"psycopg": "not installed"}, 0.0)
    lacking = check_executor_imports(ExecutorsSeen((report,), 0.0, 0.0), {"psycopg": "3.2"},
                                     install_extras(group))
    assert lacking.outcome is Outcome.FAILED
    assert "executor-1: psycopg: not installed" in lacking.cause
    assert "twophase[sqlite,postgres]" in lacking.fix


def test_a_probe_id_is_never_a_querys() -> None:
    probe = TxnId.probe("orders")
    assert probe.is_probe and not TxnId.parse(str(probe)).belongs_to("orders", QUERY_ID)
    assert not is_orphan(probe, query_id=QUERY_ID, epoch=probe.epoch + 1, up_to_batch=99)
    with pytest.raises(ValueError, match="reserved for preflight probes"):
        TxnId.open(namespace="orders", query_id=PROBE_QUERY_ID, epoch=1, batch=0,
                   partition=0, attempt=0)


def test_columns_read_with_nested_types() -> None:
    columns = parse_columns("id bigint not null, price decimal(12,2), m map<string,int>")
    assert [(c.name, c.type, c.nullable) for c in columns] == [
        ("id", "bigint", False), ("price", "decimal(12,2)", True), ("m", "map<string,int>", True)]


# -- helpers --------------------------------------------------------------------------------


def _state_options(moto: MotoServer) -> dict[str, Any]:
    return {key: value for key, value in moto.options().items() if key in S3_OPTIONS}


class _Relay(http.server.BaseHTTPRequestHandler):
    """Forwards every request to ``upstream`` without its conditional headers."""

    upstream: str

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
        headers = {k: v for k, v in self.headers.items() if k.lower() not in CONDITIONS}
        parts = urlsplit(self.upstream)
        connection = http.client.HTTPConnection(parts.netloc, timeout=CHECK_TIMEOUT_S)
        try:
            connection.request(self.command, self.path, body=body, headers=headers)
            reply = connection.getresponse()
            data = reply.read()
            dropped = {"transfer-encoding", "connection"}
            if self.command != "HEAD":  # a HEAD's length is the object's: kept
                dropped.add("content-length")
            self.send_response(reply.status)
            for key, value in reply.getheaders():
                if key.lower() not in dropped:
                    self.send_header(key, value)
            if self.command != "HEAD":
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        finally:
            connection.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@contextlib.contextmanager
def condition_dropping_relay(upstream: str) -> Iterator[str]:
    """An S3 endpoint in front of ``upstream`` that ignores If-None-Match and If-Match."""
    handler = type("Relay", (_Relay,), {"upstream": upstream})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


#: An executor's Python with only Spark's own zips on its path (``python -S``: no
#: site-packages), running the executors' check task as Spark ships it (pickled by value).
_BARE_EXECUTOR = """
import pickle, sys
task = pickle.loads(sys.stdin.buffer.read())
(seen,) = task([])
sys.stdout.buffer.write(pickle.dumps(seen))
"""


def bare_executor_reports(path: Sequence[Path], distributions: tuple[str, ...],
                          cwd: Path) -> ExecutorReport:
    """What the executors' check task reports in a Python whose path is Spark's own zips and
    ``path`` only (``python -S``: no site-packages), the task pickled by value as Spark
    ships it."""
    spark_lib = Path(pyspark.__file__).parent / "python" / "lib"
    entries = [*map(str, path), *sorted(str(p) for p in spark_lib.glob("*.zip"))]
    task = cloudpickle.dumps(  # type: ignore[no-untyped-call]
        functools.partial(shipped_by_value(report_here, versions, import_failures),
                          distributions))
    run = subprocess.run([sys.executable, "-S", "-c", _BARE_EXECUTOR], input=task,
                         capture_output=True, timeout=60, check=True,
                         env={"PYTHONPATH": ":".join(entries)}, cwd=cwd)
    return ExecutorReport(*pickle.loads(run.stdout))


def test_the_executors_check_reads_pyspark_from_sparks_own_zip(tmp_path: Path) -> None:
    """pyspark.zip, which Spark puts on its workers' path, has no package metadata: its
    version is read from the module (a packed venv without pyspark is not refused)."""
    report = bare_executor_reports([], ("pyspark", "twophase"), tmp_path)
    assert report.versions == {"pyspark": pyspark.__version__, "twophase": None}
    assert report.failures == {"twophase": "not installed"}


def test_a_version_mismatch_on_an_executor_fails_naming_both_versions(tmp_path: Path) -> None:
    """An executor whose pyarrow (installed, with its metadata) is not the driver's."""
    site = tmp_path / "site-packages"
    (site / "pyarrow").mkdir(parents=True)
    (site / "pyarrow" / "__init__.py").write_text('__version__ = "0.0.1"\n')
    (site / "pyarrow-0.0.1.dist-info").mkdir()
    (site / "pyarrow-0.0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: pyarrow\nVersion: 0.0.1\n")
    names = ("pyspark", "pyarrow")
    report = bare_executor_reports([site], names, tmp_path)
    result = check_executor_imports(ExecutorsSeen((report,), 0.0, 0.0), versions(names),
                                    "sqlite")
    assert result.outcome is Outcome.FAILED
    assert (f"{report.host}: pyarrow 0.0.1, the driver has "
            f"{importlib.metadata.version('pyarrow')}") in result.cause
    assert "pyspark" not in result.cause  # Spark's own zip: the driver's version
    assert "same versions" in result.fix
