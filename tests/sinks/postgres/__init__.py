"""The tests of ``sinks/postgres``: contract, crash, keyed, security."""
