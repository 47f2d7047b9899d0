"""The registry on SQLite (docs/routing.md): registration, worker state and the list, drain requests, the
agents of the live registry and a job's routing. A mixin of `SqliteStore`."""

from __future__ import annotations

import json
import sqlite3

from tenure.backends import _rows
from tenure.backends.sqlite._connection import Q, SqliteConnection
from tenure.contracts.profile import JobRoute
from tenure.contracts.states import WorkerState
from tenure.contracts.types import WorkerInfo


class RegistryOps:
    """The registry's writes and reads of `SqliteStore`, each one transaction on the connection thread."""

    connection: SqliteConnection

    async def register_worker(self, info: WorkerInfo) -> None:
        args = (
            info.id,
            info.host,
            info.pid,
            info.concurrency,
            json.dumps(list(info.agents)),
            json.dumps(list(info.capabilities)),
            info.state.value,
            json.dumps(list(info.features)),
            info.agent_specs,
        )
        conn = self.connection
        await conn.run(lambda: conn.tx(lambda db: db.execute(Q["register_worker"], args)), "register_worker")

    async def set_worker_state(self, worker_id: str, state: WorkerState) -> None:
        args = (worker_id, state.value)
        conn = self.connection
        await conn.run(lambda: conn.tx(lambda db: db.execute(Q["set_worker_state"], args)), "set_worker_state")

    async def list_workers(self, include_gone: bool = False) -> list[WorkerInfo]:
        conn = self.connection
        rows = await conn.run(
            lambda: conn.read(lambda db: db.execute(Q["list_workers"], (int(include_gone), None)).fetchall()),
            "list_workers",
        )
        return [_rows.worker(r, _rows.json_list) for r in rows]

    async def request_drain(self, worker_id: str, timeout_s: float | None) -> WorkerInfo | None:
        def fn(db: sqlite3.Connection) -> WorkerInfo | None:
            if db.execute(Q["request_drain"], (worker_id, timeout_s)).rowcount != 1:
                return None
            row = db.execute(Q["list_workers"], (0, worker_id)).fetchone()
            return None if row is None else _rows.worker(row, _rows.json_list)

        conn = self.connection
        return await conn.run(lambda: conn.tx(fn), "request_drain")

    async def job_route(self, job_id: str) -> JobRoute | None:
        conn = self.connection
        row = await conn.run(lambda: conn.read(lambda db: db.execute(Q["job_route"], (job_id,)).fetchone()), "job_route")
        return None if row is None else _rows.job_route(row)

    async def registry_agents(self) -> list[WorkerInfo]:
        def fn(db: sqlite3.Connection) -> list[WorkerInfo]:
            rows = db.execute(Q["registry_agents"]).fetchall()
            return [_rows.worker(r, _rows.json_list) for r in rows]

        conn = self.connection
        return await conn.run(lambda: conn.read(fn), "registry_agents")
