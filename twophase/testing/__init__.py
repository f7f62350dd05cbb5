"""What a sink's tests need, ours and our users': shipped with twophase, knowing no sink.

================================  ==============================================================
module                            what it gives
================================  ==============================================================
:mod:`twophase.testing.target`    :class:`Target` (exported here): one fresh, empty target of a
                                  sink, what every suite takes: how a driver builds the sink
                                  over it, what a reader sees, what is in doubt on the server;
                                  :class:`GroupTarget`: several, as one sink group
:mod:`twophase.testing.suite`     :class:`~twophase.testing.suite.TargetSuite`: the suites'
                                  ``target`` fixture, from a setup a test class names
:mod:`twophase.testing.driver`    a crashable streaming driver (``python -m
                                  twophase.testing.driver``), a generated order feed, a local
                                  Spark session tuned for small machines
:mod:`twophase.testing.contract`  :class:`SinkContract`: every rule of ``TwoPhaseCommitSink``
                                  as tests a sink's test module inherits in a few lines
:mod:`twophase.testing.crash`     :class:`CrashSuite`: a real Spark driver SIGKILLed at every
                                  named crash point, restarted, checked for exactly once (also
                                  on a cluster, and with the driver moved to another host)
:mod:`twophase.testing.model`     :func:`run_model`: hypothesis-generated crash schedules
                                  (task attempts, driver and executor kills, zombies, replays,
                                  cleanup) over a sink and its real system, checked after
                                  every step
================================  ==============================================================

Harnesses outside the framework (the demo, the chaos rounds, the benchmarks, a test server
armed to crash) take two more: :mod:`twophase.testing.crash_points`, the named crash points,
the variable that arms a driver at one and the signals that kill, freeze and thaw its session;
and :mod:`twophase.testing.protocol`, the driver's half of the protocol without Spark
(``Coordinator``) and the state file (``StateStore``).

The suites need pytest (the model also hypothesis); the driver needs pyspark.

What is public: ``__all__`` here (docs/versioning.md's table "What ``twophase.testing``
exports" lists exactly it), and the modules above with their documented classes; a ``_`` name
is internal.
0.1.0's ``SinkTarget`` and the suites' ``sink``/``visible`` are deprecated shims until 0.6.0
(``CHANGELOG.md``).
"""

from twophase.testing.target import ExactlyOnceError, GroupTarget, Target

__all__ = ["ExactlyOnceError", "GroupTarget", "Target"]
