"""Private Apache Iceberg REST catalogs for tests: Iceberg's own REST catalog server.

The server is ``org.apache.iceberg.rest.RESTCatalogServer`` (the class of the
``apache/iceberg-rest-fixture`` image): a Jetty servlet in front of Iceberg's ``JdbcCatalog``,
which commits a table by compare-and-swap of its metadata location in the JDBC store (a commit
whose requirements no longer hold, e.g. a stale ``assert-ref-snapshot-id``, gets 409:
pyiceberg's ``CommitFailedException``). Each :class:`IcebergRestServer` runs one JVM on a free
loopback port, with its own warehouse (a local directory: ``file://`` locations, written by
``HadoopFileIO`` on the server and by pyiceberg's own FileIO on the client) and its own SQLite
store in its directory, so a restart (:meth:`IcebergRestServer.restart`, after a SIGKILL too)
finds every table where it was.

The test fixtures over it (the pytest plugin ``tests/fixtures/iceberg_rest.py``):

* ``iceberg_rest_server`` (session): one server for the whole test session, stopped at the end.
* ``iceberg_rest`` (function): that server, started again if an earlier test killed it.

:func:`private_rest_catalog` starts one outside pytest (benchmarks, scratch scripts).
:meth:`IcebergRestServer.properties` are pyiceberg's catalog properties
(``load_catalog("rest", **server.properties())``).

The server runs from the jars ``scripts/iceberg-rest-jars`` fetches from Maven Central into
``~/.cache/twophase/iceberg-rest-<version>/libs`` (``scripts/test`` does it through
``scripts/bootstrap`` with ``TWOPHASE_NEED_ICEBERG_REST=1``). If they are missing the fixture
FAILS (it never skips) and says so.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from setups.servers.local import HOST, ServerMissingError, ServerProcess, free_port

REPO = Path(__file__).resolve().parents[2]
POM = REPO / "scripts" / "iceberg-rest" / "pom.xml"
JARS_HINT = ("run scripts/iceberg-rest-jars (scripts/test does it through scripts/bootstrap "
             "with TWOPHASE_NEED_ICEBERG_REST=1)")
MAIN_CLASS = "org.apache.iceberg.rest.RESTCatalogServer"
#: The JVM's options: a small heap grown from a smaller one, C1 only, the serial collector (on
#: 2 cores: start ~1.0 s and ~77 MiB resident, against ~2.3 s with C2 and ~125 MiB without
#: -Xms16m; a test catalog's load is light).
JVM_OPTIONS = ("-Xmx256m", "-Xms16m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
READY_TIMEOUT_S = 60.0
#: How long one ``GET /v1/config`` of the readiness probe may take.
PROBE_TIMEOUT_S = 2.0
STOP_TIMEOUT_S = 20.0
#: The server reads its catalog properties from environment variables with this prefix
#: (``CATALOG_JDBC_USER`` -> ``jdbc.user``): ours replace any the caller's environment has.
ENV_PREFIX = "CATALOG_"


class IcebergRestJarsMissingError(ServerMissingError):
    """The REST catalog server's jars are not in the cache."""


def iceberg_version() -> str:
    """The Iceberg version of the server's jars (``<iceberg.version>`` of the pom)."""
    match = re.search(r"<iceberg.version>(.+?)</iceberg.version>", POM.read_text())
    if match is None:
        raise IcebergRestJarsMissingError(f"no <iceberg.version> in {POM}")
    return match.group(1)


def _cache() -> Path:
    return Path(os.environ.get("TWOPHASE_CACHE", Path.home() / ".cache" / "twophase"))


def libs_dir() -> Path:
    """The cached server jars; raises :class:`IcebergRestJarsMissingError` naming the fix."""
    version = iceberg_version()
    libs = _cache() / f"iceberg-rest-{version}" / "libs"
    if (not (libs.parent / ".complete").exists()
            or not (libs / f"iceberg-open-api-{version}-test-fixtures.jar").exists()):
        raise IcebergRestJarsMissingError(
            f"the Apache Iceberg {version} REST catalog server jars are not in {libs}: "
            f"{JARS_HINT}")
    return libs


class IcebergRestServer(ServerProcess):
    """One REST catalog server process on a loopback port, restartable on the same port,
    warehouse and JDBC store (everything under ``base_dir``)."""

    program = "Iceberg REST catalog"
    ready_timeout_s = READY_TIMEOUT_S
    stop_timeout_s = STOP_TIMEOUT_S

    def __init__(self, base_dir: Path, libs: Path | None = None) -> None:
        super().__init__(base_dir / "server.log", free_port(HOST))
        self.base_dir = base_dir
        self.libs = libs if libs is not None else libs_dir()
        #: Where the tables' files are (the catalog's ``warehouse``: ``<ns>/<table>/...``).
        self.warehouse = base_dir / "warehouse"
        #: The JdbcCatalog's SQLite file (namespaces, and each table's metadata location).
        self.catalog_db = base_dir / "catalog.db"
        #: Seconds the last start took until the server answered ``GET /v1/config``.
        self.start_s = 0.0

    @property
    def uri(self) -> str:
        """The catalog's base URI (the REST paths are under ``/v1``)."""
        return f"http://{HOST}:{self.port}"

    @property
    def warehouse_uri(self) -> str:
        """The warehouse as the server's catalog has it (``file:///...``)."""
        return self.warehouse.as_uri()

    def properties(self, **overrides: str) -> dict[str, str]:
        """pyiceberg's catalog properties to reach the server (``type`` and ``uri``; the
        server puts new tables under its own warehouse, so no ``warehouse`` is needed),
        ``overrides`` over them."""
        return {"type": "rest", "uri": self.uri, **overrides}

    def _environment(self) -> dict[str, str]:
        environment = {key: value for key, value in os.environ.items()
                       if not key.startswith(ENV_PREFIX)}
        return environment | {
            f"{ENV_PREFIX}URI": f"jdbc:sqlite:{self.catalog_db}",
            f"{ENV_PREFIX}WAREHOUSE": self.warehouse_uri,
            f"{ENV_PREFIX}REST_PORT": str(self.port),  # -> the server's rest.port
        }

    def start(self) -> None:
        """Start the server (a no-op if it runs) and wait until it answers ``/v1/config``."""
        if self.running:
            return
        self.warehouse.mkdir(parents=True, exist_ok=True)
        tmp = self.base_dir / "tmp"  # where sqlite-jdbc unpacks its native library
        tmp.mkdir(exist_ok=True)
        command = ["java", *JVM_OPTIONS, f"-Djava.io.tmpdir={tmp}", "-cp", f"{self.libs}/*",
                   MAIN_CLASS]
        started = time.monotonic()
        with self.log.open("ab") as log:
            try:
                self._launch(command, stdout=log, stderr=log, env=self._environment(),
                             cwd=self.base_dir)
            except RuntimeError:
                self.kill()  # not ready in time: no JVM left behind
                raise
        self.start_s = time.monotonic() - started

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/v1/config",
                                        timeout=PROBE_TIMEOUT_S) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def restart(self, *, crash: bool = True) -> None:
        """Kill (SIGKILL, ``crash``) or stop the server and start it again on the same port,
        warehouse and store."""
        if crash:
            self.kill()
        else:
            self.stop()
        self.start()

    def rss_mib(self) -> float:
        """Resident memory of the server's JVM, in MiB."""
        status = Path(f"/proc/{self.pid}/status").read_text()
        match = re.search(r"VmRSS:\s+(\d+)", status)
        if match is None:
            raise RuntimeError(f"no VmRSS for process {self.pid}")
        return int(match.group(1)) / 1024


@contextlib.contextmanager
def private_rest_catalog(workdir: Path | None = None) -> Iterator[IcebergRestServer]:
    """A started server whose files are in ``workdir`` (created if missing, left for the
    caller), or in a temporary directory deleted after; stopped after the block."""
    base_dir = (Path(tempfile.mkdtemp(prefix="twophase-iceberg-rest-")) if workdir is None
                else workdir)
    base_dir.mkdir(parents=True, exist_ok=True)
    server = IcebergRestServer(base_dir)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        if workdir is None:
            shutil.rmtree(base_dir, ignore_errors=True)
