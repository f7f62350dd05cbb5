"""The tests of ``sinks/mysql``: contract, crash, keyed, security."""
