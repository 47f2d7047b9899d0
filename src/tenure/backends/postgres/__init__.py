"""The PostgreSQL backend (asyncpg), the production store: `PostgresStore` (the JobStore), `PostgresSignals`
(LISTEN / NOTIFY) and `PostgresLeases` (on the store's pool, or on one of its own for lease-only processes);
`PostgresChannel` for quota wake-ups without Redis."""

from tenure.backends.postgres.channel import PostgresChannel
from tenure.backends.postgres.leases import PostgresLeases
from tenure.backends.postgres.signals import PostgresSignals
from tenure.backends.postgres.store import PostgresStore

__all__ = ["PostgresChannel", "PostgresLeases", "PostgresSignals", "PostgresStore"]
