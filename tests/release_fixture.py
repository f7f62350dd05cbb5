"""``scripts/release-fixture <tag or commit>``: check in a release for the upgrade tests.

Run it when a release lands (then set :data:`tests.releases.PREVIOUS` to its version, and
drop the older release's files). It writes under ``tests/data/releases/``:

1. ``twophase-<version>-py3-none-any.whl``: the release's wheel (``pip wheel --no-deps`` of
   ``git archive <tag>``: its ``twophase`` and ``sinks`` packages, about 300 KB), which
   :mod:`tests.spark.test_upgrade` runs against every sink's real server;
2. ``<version>/sqlite/``: what that release leaves in the self-contained case, written by the
   release's own driver and sink: ``twophase/state.json`` (batch 0 done, batch 1 decided and
   pending: the driver SIGKILLed after the decision), ``orders.db`` (batch 0 committed, batch
   1 and two orphans staged) and ``fixture.json`` (the rows of each, the orphans' ids).

Usage: ``scripts/release-fixture v0.2.0`` (any git revision of this repository).
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from io import BytesIO
from pathlib import Path

from setups.sqlite import orders_database
from tests import REPO
from tests.releases import RELEASES, launch_release, leave_orphans, unpacked, wheel
from twophase._crash import AFTER_DECISION
from twophase.testing.driver import DriverSpec, generate_feed

log = logging.getLogger("release-fixture")
ROWS_PER_FILE, FILES, ORPHANS = 20, 3, 2


def build_wheel(revision: str, scratch: Path) -> str:
    """The wheel of ``revision`` into RELEASES; its version."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision], check=True,
                             capture_output=True).stdout
    source = scratch / "source"
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(source, filter="data")
    version: str = tomllib.loads((source / "pyproject.toml").read_text())["project"]["version"]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(RELEASES), str(source)], check=True)
    log.info("wrote %s", wheel(version))
    return version


def sqlite_state(version: str, scratch: Path) -> Path:
    """The release's state and database with a decided batch pending and orphans left."""
    release = unpacked(scratch / "release", version)
    rows = generate_feed(scratch / "feed", files=FILES, rows_per_file=ROWS_PER_FILE)
    database = orders_database(scratch / "orders.db")
    spec = DriverSpec(input_dir=str(scratch / "feed"), checkpoint=str(scratch / "ckpt"),
                      sink_factory="sinks.sqlite:SQLiteSink",
                      sink_kwargs={"path": str(database), "table": "orders"})
    crashed = launch_release(release, spec, workdir=scratch / "runs",
                             crash_at=f"{AFTER_DECISION}@1")
    if not crashed.crashed:
        raise SystemExit(f"the release's driver did not die after deciding: see {crashed.log}")
    orphans = leave_orphans(release, spec, count=ORPHANS)
    out = RELEASES / version / "sqlite"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(Path(spec.state_store().location), out / "twophase",
                    ignore=shutil.ignore_patterns("*.lock"))
    shutil.copy(database, out / "orders.db")
    facts = {"version": version, "decided_batch": 1, "committed": list(range(ROWS_PER_FILE)),
             "decided": list(range(ROWS_PER_FILE, 2 * ROWS_PER_FILE)), "rows_in_feed": rows,
             "orphans": orphans}
    (out / "fixture.json").write_text(  # one line per fact: a small diff at the next release
        "{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in facts.items())
        + "\n}\n")
    log.info("wrote %s", out)
    return out


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    if len(argv) != 1:
        raise SystemExit(__doc__)
    with tempfile.TemporaryDirectory(prefix="release-fixture-") as scratch:
        version = build_wheel(argv[0], Path(scratch))
        sqlite_state(version, Path(scratch))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
