"""The tests of ``sinks/http``: contract, crash, keyed, security."""
