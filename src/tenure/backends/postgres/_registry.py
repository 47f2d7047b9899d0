"""The registry on PostgreSQL (docs/routing.md): registration, worker state and the list, drain requests, the
agents of the live registry, a job's routing, and the heartbeat's reply. A mixin of `PostgresStore`."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from tenure.backends import _rows
from tenure.backends._queries import load_queries
from tenure.backends.postgres._connections import StoreConnections
from tenure.contracts.profile import JobRoute
from tenure.contracts.states import WorkerState
from tenure.contracts.types import HeartbeatReply, WorkerInfo, is_uuid

Q = load_queries("tenure.backends.postgres")


def heartbeat_reply(rows: Sequence[asyncpg.Record]) -> HeartbeatReply:
    """The held rows renewed (id set), and the drain request (the one row without an id)."""
    drain = next((r for r in rows if r["drain"]), None)
    held = [r for r in rows if r["id"] is not None]
    return HeartbeatReply(
        frozenset(r["id"] for r in held),
        frozenset(r["id"] for r in held if r["cancel"]),
        drain is not None,
        None if drain is None else drain["drain_timeout_s"],
    )


class RegistryOps:
    """The registry's writes and reads of `PostgresStore`: registration, state, the list, drain requests and the
    agents of the live registry."""

    _db: StoreConnections

    async def register_worker(self, info: WorkerInfo) -> None:
        async with self._db.pooled("register_worker") as conn:
            await conn.execute(
                Q["register_worker"],
                info.id,
                info.host,
                info.pid,
                info.concurrency,
                list(info.agents),
                list(info.capabilities),
                info.state.value,
                list(info.features),
                info.agent_specs,
            )

    async def set_worker_state(self, worker_id: str, state: WorkerState) -> None:
        async with self._db.pooled("set_worker_state") as conn:
            await conn.execute(Q["set_worker_state"], worker_id, state.value)

    async def list_workers(self, include_gone: bool = False) -> list[WorkerInfo]:
        async with self._db.pooled("list_workers") as conn:
            rows = await conn.fetch(Q["list_workers"], include_gone)
        return [_rows.worker(r) for r in rows]

    async def request_drain(self, worker_id: str, timeout_s: float | None) -> WorkerInfo | None:
        async with self._db.pooled("request_drain") as conn:
            row = await conn.fetchrow(Q["request_drain"], worker_id, timeout_s)
        return None if row is None else _rows.worker(row)

    async def job_route(self, job_id: str) -> JobRoute | None:
        if not is_uuid(job_id):
            return None
        async with self._db.pooled("job_route") as conn:
            row = await conn.fetchrow(Q["job_route"], job_id)
        return None if row is None else _rows.job_route(row)

    async def registry_agents(self) -> list[WorkerInfo]:
        async with self._db.pooled("registry_agents") as conn:
            rows = await conn.fetch(Q["registry_agents"])
        return [_rows.worker(r) for r in rows]
