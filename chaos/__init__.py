"""Long chaos runs: the Spark chaos suite (chaos.run), the protocol model's long profile
(chaos.model) and the real Debezium pipeline's rounds (chaos.debezium). Run from the repository
root: they use the test suite's servers."""
