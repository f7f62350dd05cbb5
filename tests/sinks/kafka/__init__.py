"""The tests of ``sinks/kafka``: contract, crash, keyed, security."""
