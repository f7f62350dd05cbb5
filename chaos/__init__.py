"""Long chaos runs: the Spark chaos suite (chaos.run) and the protocol model's long profile
(chaos.model). Run from the repository root: they use the test suite's servers."""
