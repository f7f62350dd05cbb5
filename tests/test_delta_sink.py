"""sinks.delta at the sink level, on a local table read back by DuckDB's Delta reader: the
shared contract suite, and what only this sink does (one commit per batch, its proof after an
OPTIMIZE, a file vacuumed before its commit, the sweep after an OPTIMIZE, racing committers, a
checkpoint reset, exact statistics, refusals)."""

from __future__ import annotations

from twophase.testing.contract import SinkContract


class TestDeltaContract(SinkContract):
    setup_fixture = "delta_setup"
    purges_commit_records = False  # the proof is the table's own log
