"""Repository tier: docs, guarantees, registry, layering and budgets, read from the files."""
