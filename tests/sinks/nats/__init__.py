"""JetStreamSink's room: its contract and crash suites, and what only NATS needs."""
