"""The tests of ``sinks/s3``: contract, crash, keyed, security."""
