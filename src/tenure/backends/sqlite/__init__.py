"""The SQLite backend: the embedded default, safe for several processes on one machine (WAL).

`SqliteStore` (the JobStore), `SqliteSignals` and `SqliteLeases` share one connection and its thread
(`_connection.py`)."""

from tenure.backends.sqlite._connection import SqliteConnection, database_files
from tenure.backends.sqlite.leases import SqliteLeases
from tenure.backends.sqlite.signals import SqliteSignals
from tenure.backends.sqlite.store import SqliteStore

__all__ = ["SqliteConnection", "SqliteLeases", "SqliteSignals", "SqliteStore", "database_files"]
