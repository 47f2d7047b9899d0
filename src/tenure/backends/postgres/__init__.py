"""The PostgreSQL store (asyncpg): the production backend; `PostgresLeases` for lease-only processes."""

from tenure.backends.postgres.channel import PostgresChannel
from tenure.backends.postgres.leases import PostgresLeases
from tenure.backends.postgres.store import PostgresStore

__all__ = ["PostgresChannel", "PostgresLeases", "PostgresStore"]
