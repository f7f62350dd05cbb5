"""Spark tier: framework tests through real Spark that belong to no single sink."""
