"""Shared fixtures. Servers are real processes started here and stopped at the end of the run."""
