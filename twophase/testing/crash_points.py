"""The named crash points, and how a harness arms a driver at one and kills what it started.

The protocol SIGKILLs its own driver at a named step when the driver's environment says so::

    TWOPHASE_CRASH_AT=<point>[@<batch>]      e.g. after_decision@2

(:data:`CRASH_ENV`; how a reached point kills the driver's whole process session, or on a
cluster one executor, is told in :mod:`twophase._crash`). This is what a harness outside the
framework takes of it (the demo, the chaos rounds, a Spark Connect server armed by the tests):
the points' names, in protocol order, the variable that arms one, and the session signals that
end, freeze and thaw a driver with its JVM and Python workers.

=====================  ===========  ======================================================
point                  runs on      the moment
=====================  ===========  ======================================================
``after_pre_commit``   executor     a handle made, the driver not told yet
``before_decision``    driver       every handle in, the decision not written
``after_decision``     driver       the decision durable, nothing committed
``mid_commit``         driver       the first handle committed, the others not
``between_members``    driver       a sink group only (:data:`GROUP_CRASH_POINTS`): every
                                    transaction of a member committed, the next member's not
``before_done``        driver       every handle committed, the batch not marked done
``committing_behind``  driver       a stream that runs until stopped: the batch decided,
                                    its callback returned to Spark, its commit behind the
                                    next batch not begun
=====================  ===========  ======================================================
"""

from twophase._crash import (
    AFTER_DECISION,
    AFTER_PRE_COMMIT,
    BEFORE_DECISION,
    BEFORE_DONE,
    BETWEEN_MEMBERS,
    COMMITTING_BEHIND,
    CRASH_ENV,
    CRASH_POINTS,
    GROUP_CRASH_POINTS,
    MID_COMMIT,
    kill_session,
    signal_session,
)

__all__ = [
    "AFTER_DECISION",
    "AFTER_PRE_COMMIT",
    "BEFORE_DECISION",
    "BEFORE_DONE",
    "BETWEEN_MEMBERS",
    "COMMITTING_BEHIND",
    "CRASH_ENV",
    "CRASH_POINTS",
    "GROUP_CRASH_POINTS",
    "MID_COMMIT",
    "kill_session",
    "signal_session",
]
