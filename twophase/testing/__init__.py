"""What a sink's tests need, ours and our users': shipped with twophase, knowing no sink.

================================  ==============================================================
module                            what it gives
================================  ==============================================================
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

The suites need pytest (the model also hypothesis); the driver needs pyspark.
"""
