"""The secret canary: a unique marker in every secret option of a sink, then a search of every
byte the job and the operator's tools produced. 0 hits, or the test names where it leaked.

Per sink (SQLite has no secret), with its secrets held by the sink in clear text (the sink
pickled to the executors holds them) and given as :class:`twophase.Secret` references:

* a real driver with DEBUG logging and Spark's event log on, SIGKILLed after a decision and
  restarted (recovery commits the pending batch): every row exactly once;
* a driver whose secret is wrong (a failed start or batch: its errors, drivers' messages
  included), and the driver's sink factory given a wrong option (in the test's process: a
  driver builds its sink before Spark sees it; its traceback and DEBUG log are searched);
* the recovering driver's ``/metrics``, scraped while it runs;
* ``python -m twophase.status`` and ``python -m twophase.cleanup`` (JSON lines on stdout, its
  log on stderr, a metrics file) with the secret as an ``{"env": ...}`` reference;

then every file under the test's directories (driver logs, checkpoint, state, staging, Spark's
event log and local files, the tools' outputs) is read whole and searched for the marker; the
servers' own files are not (the HTTP receiver keeps the token it checks in a file).
The harness's own spec file holds references only (the clear text reaches the driver through
its environment, as a deployment's secret store would).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import subprocess
import sys
import traceback
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from setups.base import SinkSetup, Target
from setups.http import HttpSetup
from setups.kafka import SecuredKafkaSetup
from setups.least_privilege import GrantingSetup
from setups.servers.http_receiver import Receivers
from setups.servers.kafka import APP_USER
from setups.servers.local import free_port
from twophase import Secret, TwoPhaseCommitSink
from twophase._crash import AFTER_DECISION
from twophase._loader import build_sink
from twophase.spark import as_sink
from twophase.testing import GroupTarget
from twophase.testing.driver import DriverSpec, generate_feed, launch

pytestmark = [pytest.mark.spark, pytest.mark.crash]

log = logging.getLogger(__name__)

MARKER = f"canary{uuid.uuid4().hex[:16]}"
FILES, ROWS_PER_FILE = 3, 20
SCRAPE_TIMEOUT_S = 2
EVENT_LOG_CONF = {"spark.eventLog.enabled": "true", "spark.eventLog.compress": "false"}


def sink_with_secrets(factory: str, options: Mapping[str, Any], secrets: Mapping[str, str],
                      as_reference: bool) -> TwoPhaseCommitSink[Any]:
    """A sink whose ``secrets`` (option -> the environment variable holding it) are given as
    :class:`Secret` references, or read here and given in clear."""
    given = {name: Secret(env=variable) if as_reference else os.environ[variable]
             for name, variable in secrets.items()}
    return build_sink(factory, {**options, **given})


def group_with_secrets(members: Mapping[str, Mapping[str, Any]], as_reference: bool
                       ) -> TwoPhaseCommitSink[Any]:
    """The driver's sink factory: a group of :func:`sink_with_secrets` members."""
    return as_sink({name: sink_with_secrets(**member, as_reference=as_reference)
                    for name, member in members.items()})


@dataclass
class Canary:
    """One sink's target with its secret options, their values (each holding the marker) in
    environment variables, and the folders whose files the search covers."""

    setup: SinkSetup
    options: dict[str, Any]
    #: The sink's factory (the setup's unless told).
    factory: str = ""
    secrets: dict[str, str] = field(default_factory=dict)  # option -> variable
    values: dict[str, str] = field(default_factory=dict)  # variable -> secret
    #: Folders of the servers' own files (not searched: a receiver keeps its token).
    servers: tuple[Path, ...] = ()

    def env(self, wrong: bool = False) -> dict[str, str]:
        return {variable: f"{value}-wrong" if wrong else value
                for variable, value in self.values.items()}

    def references(self) -> dict[str, Any]:
        """The sink's options with each secret as an ``{"env": ...}`` reference (CLI form)."""
        return {**self.options, **{name: {"env": variable}
                                   for name, variable in self.secrets.items()}}

    @property
    def sink_factory(self) -> str:
        return self.factory or self.setup.factory

    def member(self) -> dict[str, Any]:
        """The arguments of :func:`sink_with_secrets` for this sink."""
        return {"factory": self.sink_factory, "options": self.options, "secrets": self.secrets}

    def target(self) -> Target:
        return Target(self.sink_factory, self.options, self.setup)

    def needles(self) -> set[str]:
        """What the search looks for: the marker, and each secret that cannot hold it (a
        password the broker made)."""
        return {MARKER, *(value for value in self.values.values() if MARKER not in value)}


def secret(canary: Canary, option: str) -> str:
    """A secret option of ``canary``, its value holding the marker; returns the value."""
    variable = f"TWOPHASE_CANARY_{option.upper()}"
    value = f"{MARKER}-{option}"
    canary.secrets[option], canary.values[variable] = variable, value
    canary.options.pop(option, None)  # the sink takes it from the variable only
    return value


# -- each sink's secrets -----------------------------------------------------------------------


def sql_canary(setup_fixture: str, request: pytest.FixtureRequest) -> Canary:
    """A user of the test's own on the secured server (verified TLS), holding exactly the
    sink's grants, whose password holds the marker."""
    setup: SinkSetup = request.getfixturevalue(setup_fixture)
    canary = Canary(setup, setup.target_options())
    password = secret(canary, "password")
    user = f"canary_{uuid.uuid4().hex[:8]}"
    assert isinstance(setup, GrantingSetup)
    setup.create_sink_user(user, password, [grant for grant in
                                            setup.sink_grants(canary.options).values()
                                            if grant[0]])
    canary.options["user"] = user
    return canary


def s3_canary(request: pytest.FixtureRequest) -> Canary:
    setup = request.getfixturevalue("s3_setup")
    canary = Canary(setup, dict(setup.new_target().options))
    secret(canary, "secret_access_key")  # moto takes any key: the marker goes on the wire
    secret(canary, "session_token")
    return canary


def http_canary(request: pytest.FixtureRequest) -> Canary:
    """A receiver of the test's own that requires the marked token and signing secret."""
    receivers: Receivers = request.getfixturevalue("private_receiver")
    tmp_path: Path = request.getfixturevalue("tmp_path")
    token, signing = f"{MARKER}-token", f"{MARKER}-signing_secret"
    receiver = receivers(token=token, signing_secret=signing)
    setup = HttpSetup(tmp_path / "http", receiver)
    canary = Canary(setup, dict(setup.new_target().options), servers=(receiver.workdir,))
    assert secret(canary, "token") == token and secret(canary, "signing_secret") == signing
    return canary


def kafka_canary(request: pytest.FixtureRequest) -> Canary:
    """The secured broker's SCRAM user (its password made by the broker's setup, 32 random
    hex digits), with exactly the listed ACLs."""
    setup: SecuredKafkaSetup = request.getfixturevalue("kafka_secured_setup")
    options = setup.target_options()
    del options["sasl_password_file"]
    canary = Canary(setup, options, factory="sinks.kafka:KafkaSink",
                    servers=(setup.password_file,))
    variable = "TWOPHASE_CANARY_SASL_PLAIN_PASSWORD"
    canary.secrets["sasl_plain_password"] = variable
    assert setup.broker.security is not None
    canary.values[variable] = setup.broker.security.passwords[APP_USER]
    return canary


CANARIES: dict[str, Callable[[pytest.FixtureRequest], Canary]] = {
    "mysql": functools.partial(sql_canary, "secured_mysql_setup"),
    "postgres": functools.partial(sql_canary, "secured_postgres_setup"),
    "s3": s3_canary, "http": http_canary,
    "kafka": kafka_canary}


# -- the search --------------------------------------------------------------------------------


@dataclass
class Searched:
    files: int = 0
    bytes: int = 0
    hits: list[str] = field(default_factory=list)


def search(folders: list[Path], needles: set[str], *, servers: tuple[Path, ...] = ()
           ) -> Searched:
    """Every file under ``folders`` but the servers' own (a receiver's token file, the
    mounted password file a sink reads) searched for each of ``needles``."""
    found = Searched()
    for folder in folders:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()
                           and not any(p.is_relative_to(server) for server in servers)):
            data = path.read_bytes()
            found.files += 1
            found.bytes += len(data)
            found.hits += [f"{path}: {data.count(needle.encode())}" for needle in needles
                           if needle.encode() in data]
    return found


# -- the runs --------------------------------------------------------------------------------


@pytest.fixture
def secrets_in_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Mapping[str, str]],
                                                                          None]]:
    def put(values: Mapping[str, str]) -> None:
        for variable, value in values.items():
            monkeypatch.setenv(variable, value)
    yield put


def driver_spec(canaries: Mapping[str, Canary], workdir: Path, checkpoint: Path, *,
                as_reference: bool, metrics_port: int | None = None) -> DriverSpec:
    members = {name: canary.member() for name, canary in canaries.items()}
    return DriverSpec(
        input_dir=str(workdir.parent / "feed"), checkpoint=str(checkpoint),
        sink_factory="tests.spark.test_secret_canary:group_with_secrets",
        sink_kwargs={"members": members, "as_reference": as_reference}, log_level="DEBUG",
        metrics_port=metrics_port,
        spark_conf={**EVENT_LOG_CONF, "spark.eventLog.dir": str(_made(workdir / "eventlog"))})


def _made(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def refused_build(canaries: Mapping[str, Canary], as_reference: bool, workdir: Path) -> Path:
    """The driver's sink factory given a wrong option, in this process (a driver builds its
    sink before Spark sees it: what it writes is this traceback and the DEBUG log up to it);
    returns the file holding both, as a driver's log would."""
    members = {name: canary.member() for name, canary in canaries.items()}
    first = next(iter(members))
    members[first]["options"] = {**members[first]["options"], "no_such_option": 1}
    workdir.mkdir(parents=True)
    written = workdir / "driver.log"
    handler = logging.FileHandler(written)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        group_with_secrets(members, as_reference=as_reference)
    except Exception as refused:  # whatever it is, its text is searched
        with written.open("a") as log_file:
            log_file.writelines(traceback.format_exception(refused))
    else:
        pytest.fail("a sink given no_such_option was built")
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        handler.close()
    return written


def tool(workdir: Path, name: str, *args: str) -> int:
    """``python -m twophase.<name> args``, its stdout and stderr kept in ``workdir``."""
    with (workdir / f"{name}.out").open("w") as out, (workdir / f"{name}.err").open("w") as err:
        return subprocess.run([sys.executable, "-m", f"twophase.{name}", *args], stdout=out,
                              stderr=err, check=False).returncode


@dataclass
class Scrapes:
    """``/metrics`` of a running driver, scraped while it runs (each kept in ``path``)."""

    port: int
    path: Path
    taken: int = 0

    def scrape(self) -> None:
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics",
                                        timeout=SCRAPE_TIMEOUT_S) as response:
                body = response.read()
            with self.path.open("ab") as out:
                out.write(body)
            self.taken += 1


def group_references(canaries: Mapping[str, Canary]) -> str:
    """The group's options for status and cleanup, each secret a reference (JSON)."""
    return json.dumps({"members": {name: {"sink": canary.sink_factory,
                                          "options": canary.references()}
                                   for name, canary in canaries.items()}})


@pytest.mark.server  # every sink's servers, taken by name at run time (CANARIES)
@pytest.mark.parametrize("as_reference", [
    pytest.param(False, id="clear"), pytest.param(True, id="reference", marks=pytest.mark.long)])
def test_no_secret_reaches_anything_the_job_or_its_tools_produce(
        as_reference: bool, request: pytest.FixtureRequest, tmp_path: Path,
        secrets_in_env: Callable[[Mapping[str, str]], None]) -> None:
    """Every sink with secrets, as members of one group: one driver run covers them all (each
    member's secrets, its own reader, its own files searched)."""
    canaries = {name: build(request) for name, build in CANARIES.items()}
    group = GroupTarget.of({name: canary.target() for name, canary in canaries.items()})
    generate_feed(tmp_path / "feed", files=FILES, rows_per_file=ROWS_PER_FILE)
    env = {variable: value for canary in canaries.values()
           for variable, value in canary.env().items()}
    wrong = {variable: f"{value}-wrong" for variable, value in env.items()}

    secrets_in_env(wrong)  # the first member's server refuses it: the start fails
    failed = launch(driver_spec(canaries, tmp_path / "wrong", tmp_path / "wrong" / "ckpt",
                                as_reference=as_reference), workdir=tmp_path / "wrong")
    assert failed.returncode != 0 and not failed.crashed
    assert group.visible() == []
    secrets_in_env(env)
    bad = refused_build(canaries, as_reference, tmp_path / "bad")
    assert "no_such_option" in bad.read_text()

    run, checkpoint = tmp_path / "run", tmp_path / "run" / "ckpt"
    crashed = launch(driver_spec(canaries, run, checkpoint, as_reference=as_reference),
                     workdir=run, crash_at=f"{AFTER_DECISION}@1")
    assert crashed.crashed
    assert tool(run, "status", str(checkpoint), "--sink", "twophase:SinkGroup",
                "--options", group_references(canaries)) == 0
    assert "pending" in (run / "status.out").read_text()
    scrapes = Scrapes(free_port(), run / "metrics.scrape")
    recovered = launch(driver_spec(canaries, run, checkpoint, as_reference=as_reference,
                                   metrics_port=scrapes.port),
                       workdir=run, while_running=scrapes.scrape)
    assert recovered.returncode == 0, recovered.log.read_text()[-3000:]
    assert scrapes.taken and "twophase_" in scrapes.path.read_text(), "no /metrics scrape"
    assert tool(run, "cleanup", "--sink", "twophase:SinkGroup", "--options",
                group_references(canaries), "--state", str(checkpoint / "twophase"),
                "--metrics-file", str(run / "cleanup.prom")) == 0
    assert group.visible() == list(range(FILES * ROWS_PER_FILE))
    assert group.in_doubt() == []
    assert any((run / "eventlog").iterdir()), "Spark's event log was not written"

    folders = [tmp_path, *(canary.setup.scratch for canary in canaries.values()
                           if not canary.setup.scratch.is_relative_to(tmp_path))]
    servers = tuple(server for canary in canaries.values() for server in canary.servers)
    needles = set().union(*(canary.needles() for canary in canaries.values()))
    searched = search(folders, needles, servers=servers)
    log.warning("searched %d files, %d bytes under %s: %d hits", searched.files, searched.bytes,
                ", ".join(map(str, folders)), len(searched.hits))
    assert searched.files > 20 and searched.bytes > 100_000, searched
    assert searched.hits == [], f"the secret leaked into: {searched.hits}"
