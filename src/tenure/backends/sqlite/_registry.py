"""The broker's part of the registry on SQLite (docs/routing.md): drain requests and the agents of the live
registry. A mixin of `SqliteStore`."""

from __future__ import annotations

import sqlite3

from tenure.backends import _rows
from tenure.backends.sqlite._connection import Q, SqliteConnection
from tenure.contracts.types import WorkerInfo


class RegistryOps:
    """`request_drain` and `registry_agents` of `SqliteStore`."""

    connection: SqliteConnection

    async def request_drain(self, worker_id: str, timeout_s: float | None) -> WorkerInfo | None:
        def fn(db: sqlite3.Connection) -> WorkerInfo | None:
            if db.execute(Q["request_drain"], (worker_id, timeout_s)).rowcount != 1:
                return None
            row = db.execute(Q["list_workers"], (0, worker_id)).fetchone()
            return None if row is None else _rows.worker(row, _rows.json_list)

        conn = self.connection
        return await conn.run(lambda: conn.tx(fn), "request_drain")

    async def registry_agents(self) -> list[tuple[tuple[str, ...], str]]:
        def fn(db: sqlite3.Connection) -> list[tuple[tuple[str, ...], str]]:
            rows = db.execute(Q["registry_agents"]).fetchall()
            return [(_rows.json_list(r["agents"]), r["agent_specs"]) for r in rows]

        conn = self.connection
        return await conn.run(lambda: conn.read(fn), "registry_agents")
