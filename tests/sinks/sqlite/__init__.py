"""The tests of ``sinks/sqlite``: contract, crash, keyed, security."""
