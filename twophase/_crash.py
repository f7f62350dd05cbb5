"""Named crash points: the protocol SIGKILLs its own driver at a chosen step (for tests).

Armed only by the environment of the driver process, inherited by Spark's JVM and its Python
workers::

    TWOPHASE_CRASH_AT=<point>[@<batch>]      e.g. after_decision@2

When armed, reaching the point (for that batch, or for any batch if none is given) kills the
whole process *session* of the driver with SIGKILL: the driver's Python process, Spark's JVM and
every Python worker, exactly like ``kill -9`` of the job. Run an armed driver in a session of its
own (``subprocess.Popen(..., start_new_session=True)``), as the crash tests and the demo do.

Not armed (the variable unset), :func:`crash_point` returns at its first comparison.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

CRASH_ENV = "TWOPHASE_CRASH_AT"

#: The points, in protocol order.
AFTER_PRE_COMMIT = "after_pre_commit"  # executor: handle made, driver not told yet
BEFORE_DECISION = "before_decision"  # driver: all handles in, decision not written
AFTER_DECISION = "after_decision"  # driver: decision durable, nothing committed
MID_COMMIT = "mid_commit"  # driver: the first handle committed, the others not
BEFORE_DONE = "before_done"  # driver: every handle committed, batch not marked done
CRASH_POINTS = (AFTER_PRE_COMMIT, BEFORE_DECISION, AFTER_DECISION, MID_COMMIT, BEFORE_DONE)


def _parse(spec: str | None) -> tuple[str, int | None] | None:
    if not spec:
        return None
    point, _, batch = spec.partition("@")
    if point not in CRASH_POINTS:
        raise ValueError(f"{CRASH_ENV}={spec!r}: unknown point; known: {', '.join(CRASH_POINTS)}")
    return point, int(batch) if batch else None


_ARMED = _parse(os.environ.get(CRASH_ENV))


def crash_point(point: str, batch: int) -> None:
    """SIGKILL the driver's whole session if armed at ``point`` (and ``batch``)."""
    if _ARMED is None:
        return
    armed_point, armed_batch = _ARMED
    if point == armed_point and armed_batch in (None, batch):
        _kill_session()


def _kill_session() -> None:
    session = os.getsid(0)
    leader = Path(f"/proc/{session}/comm").read_text().strip()
    if not leader.startswith("python"):
        raise RuntimeError(
            f"{CRASH_ENV} is set but this session is led by {leader!r}, not a Python driver: "
            "refusing to kill it. Start the armed driver with start_new_session=True."
        )
    sys.stderr.write(f"twophase: crash point {_ARMED} reached, SIGKILL\n")
    sys.stderr.flush()
    kill_session(session, last=os.getpid())


def kill_session(session: int, *, last: int | None = None) -> None:
    """SIGKILL every process of ``session``; ``last`` (this process, say) after all others."""
    for pid in _session_members(session):
        if pid != last:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    if last is not None:
        os.kill(last, signal.SIGKILL)


def _session_members(session: int) -> Iterator[int]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == session:
                    yield int(entry.name)
            except (ProcessLookupError, PermissionError):
                continue
