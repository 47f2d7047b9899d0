"""Implementations of the contracts' protocols: sqlite/, postgres/, redis/. Import contracts only."""
