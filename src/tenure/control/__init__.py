"""The control plane: admission, idempotency, retries, the sweeper duty. Imports contracts only."""
