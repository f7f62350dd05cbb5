"""The tests of ``sinks/delta``: contract, crash, keyed, security."""
