"""The PostgreSQL store (asyncpg): the production backend."""

from tenure.backends.postgres.store import PostgresStore

__all__ = ["PostgresStore"]
