"""The previous release of twophase, checked in, to run against the current code.

``tests/data/releases/`` holds the wheel of the last landed release (:data:`PREVIOUS`), built
by ``scripts/release-fixture`` from its git tag or commit, and the state files that release
wrote for the self-contained case (SQLite, :data:`SQLITE_STATE`). A test unpacks the wheel
(pure Python: unpacking is installing it) and runs that release's own driver with its
directory first on the path (:func:`launch_release`), or its sink to leave orphans
(:func:`leave_orphans`); the current code then recovers what it left.

When a release lands, run ``scripts/release-fixture <its tag>`` and set :data:`PREVIOUS` to its
version: the upgrade tests then start from that release's state.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

from twophase.testing.driver import DriverSpec, RunResult, driver_environment, launch

RELEASES = Path(__file__).resolve().parent / "data" / "releases"
#: The last landed release, whose wheel and state files are checked in.
PREVIOUS = "0.1.0"
#: Its state, written with a decided batch pending and orphans left, and the SQLite database
#: it wrote into (table ``orders``; what was decided is staged there).
SQLITE_STATE = RELEASES / PREVIOUS / "sqlite"


def wheel(version: str = PREVIOUS) -> Path:
    return RELEASES / f"twophase-{version}-py3-none-any.whl"


def unpacked(directory: Path, version: str = PREVIOUS) -> Path:
    """``directory`` holding the release's packages (``twophase``, ``sinks``)."""
    with zipfile.ZipFile(wheel(version)) as archive:
        archive.extractall(directory)
    return directory


def launch_release(release: Path, spec: DriverSpec, *, workdir: Path,
                   crash_at: str | None = None) -> RunResult:
    """One run of the release's own driver (``python -m twophase.testing.driver``)."""
    assert_runs_release(release, workdir)
    return launch(spec, workdir=workdir, crash_at=crash_at, python_path=[release])


def assert_runs_release(release: Path, workdir: Path) -> None:
    """A driver launched in ``workdir`` with ``release`` first imports the release's code."""
    workdir.mkdir(parents=True, exist_ok=True)
    imported = subprocess.run(
        [sys.executable, "-c", "import twophase, sinks; print(twophase.__file__, "
         "sinks.__file__)"], cwd=workdir, env=driver_environment(workdir, [release]),
        capture_output=True, text=True, check=True).stdout.split()
    assert all(Path(module).is_relative_to(release) for module in imported), imported


def leave_orphans(release: Path, spec: DriverSpec, *, count: int) -> list[str]:
    """``count`` orphans of the query left in its sink by the release's own code (see
    :mod:`tests.release_orphans`); their transaction ids."""
    spec_path = Path(spec.checkpoint).parent / "orphans-spec.json"
    spec_path.write_text(json.dumps(spec.fields_set()))
    workdir = Path(spec.checkpoint).parent / "orphans"
    ran = subprocess.run([sys.executable, "-m", "tests.release_orphans", str(spec_path),
                          str(count)], capture_output=True, text=True, check=False,
                         cwd=release, env=driver_environment(workdir, [release]))
    assert ran.returncode == 0, ran.stderr
    left = json.loads(ran.stdout.splitlines()[-1])
    assert Path(left["twophase"]).is_relative_to(release), "not the release's code"
    orphans: list[str] = left["orphans"]
    return orphans
