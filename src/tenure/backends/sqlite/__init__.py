"""The SQLite store: the embedded default, safe for several processes on one machine (WAL)."""

from tenure.backends.sqlite.store import SqliteStore, database_files

__all__ = ["SqliteStore", "database_files"]
