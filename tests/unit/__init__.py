"""Unit tier: the framework's pieces without Spark (a test that takes a server is marked
``server``, one that takes Spark ``spark``)."""
