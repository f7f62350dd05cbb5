"""The tests of ``sinks/iceberg``: contract, crash, keyed, security."""
