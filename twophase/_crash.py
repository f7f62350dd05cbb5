"""Named crash points: the protocol SIGKILLs its own driver at a chosen step (for tests).

Armed only by the environment of the driver process, inherited by Spark's JVM and its Python
workers::

    TWOPHASE_CRASH_AT=<point>[@<batch>]      e.g. after_decision@2

When armed, reaching the point (for that batch, or for any batch if none is given) kills the
whole process *session* of the driver with SIGKILL: the driver's Python process, Spark's JVM and
every Python worker, exactly like ``kill -9`` of the job. Run an armed driver in a session of its
own (``subprocess.Popen(..., start_new_session=True)``), as the crash tests and the demo do.

On a cluster, executors get the variable through ``spark.executorEnv`` with two more:
``TWOPHASE_CRASH_SCOPE=executor`` makes a point reached in a task SIGKILL that task's executor
(its JVM, then the task's Python worker) instead, and ``TWOPHASE_CRASH_ONCE=<file>`` lets only
the first process that creates the file crash (the retried task then succeeds elsewhere).

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
CRASH_SCOPE_ENV = "TWOPHASE_CRASH_SCOPE"
CRASH_ONCE_ENV = "TWOPHASE_CRASH_ONCE"
EXECUTOR_SCOPE = "executor"

#: The points, in protocol order.
AFTER_PRE_COMMIT = "after_pre_commit"  # executor: handle made, driver not told yet
BEFORE_DECISION = "before_decision"  # driver: all handles in, decision not written
AFTER_DECISION = "after_decision"  # driver: decision durable, nothing committed
MID_COMMIT = "mid_commit"  # driver: the first handle committed, the others not
BEFORE_DONE = "before_done"  # driver: every handle committed, batch not marked done
CRASH_POINTS = (AFTER_PRE_COMMIT, BEFORE_DECISION, AFTER_DECISION, MID_COMMIT, BEFORE_DONE)
#: Between two commit stages (a sink group's members): every transaction of one stage
#: committed, the next stage's not begun.
BETWEEN_MEMBERS = "between_members"
#: The points a sink group's driver passes, in protocol order.
GROUP_CRASH_POINTS = (*CRASH_POINTS[:-1], BETWEEN_MEMBERS, BEFORE_DONE)
#: A commit behind the next batch (``twophase._pipeline``): the batch decided, its callback
#: returned to Spark (which runs the next batch), its commit not begun.
COMMITTING_BEHIND = "committing_behind"
#: Every point a driver can be armed at.
KNOWN_POINTS = (*GROUP_CRASH_POINTS, COMMITTING_BEHIND)


def _parse(spec: str | None) -> tuple[str, int | None] | None:
    if not spec:
        return None
    point, _, batch = spec.partition("@")
    if point not in KNOWN_POINTS:
        raise ValueError(f"{CRASH_ENV}={spec!r}: unknown point; known: "
                         f"{', '.join(KNOWN_POINTS)}")
    return point, int(batch) if batch else None


_ARMED = _parse(os.environ.get(CRASH_ENV))


def crash_point(point: str, batch: int) -> None:
    """SIGKILL the driver's whole session if armed at ``point`` (and ``batch``)."""
    if _ARMED is None:
        return
    armed_point, armed_batch = _ARMED
    if point != armed_point or armed_batch not in (None, batch):
        return
    executor = _executor_jvm() if os.environ.get(CRASH_SCOPE_ENV) == EXECUTOR_SCOPE else None
    if executor is None:  # the driver (Spark may hand executor variables to its workers too)
        _kill_session()
    elif _first_to_crash():
        _kill_executor(executor)


def _first_to_crash() -> bool:
    marker = os.environ.get(CRASH_ONCE_ENV)
    if not marker:
        return True
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    return True


def _executor_jvm() -> int | None:
    """The executor JVM this process runs under, if it runs under one."""
    pid = os.getpid()
    while pid > 1:
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        if b"CoarseGrainedExecutorBackend" in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    return None


def _kill_executor(jvm: int) -> None:
    """SIGKILL the executor JVM this task's Python worker runs under, then the worker."""
    sys.stderr.write(f"twophase: crash point {_ARMED} reached, SIGKILL executor {jvm}\n")
    sys.stderr.flush()
    os.kill(jvm, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


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
    signal_session(session, signal.SIGKILL, last=last)


def signal_session(session: int, signum: int, *, last: int | None = None) -> None:
    """Send ``signum`` to every process of ``session`` (Spark's Python daemons run in process
    groups of their own, so a group signal misses them); ``last`` after all others."""
    for pid in _session_members(session):
        if pid != last:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
    if last is not None:
        os.kill(last, signum)


def _session_members(session: int) -> Iterator[int]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == session:
                    yield int(entry.name)
            except (ProcessLookupError, PermissionError):
                continue
