"""Benchmarks: each sink side by side with the raw client, in one run (see RESULTS.md)."""
