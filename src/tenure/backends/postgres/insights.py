"""`Insights` on PostgreSQL: the dashboard's read side (contracts/insights.py), on a small pool of its own.

Its connections are read-only (`default_transaction_read_only`) and apart from the store's pool, so a person
paging the jobs list never takes a connection a worker's finish is waiting for. Queries are in `insights.sql`,
one per filter combination (each planned for the index that serves it).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING

import asyncpg

from tenure.backends._queries import load_queries
from tenure.backends.postgres._connections import CONNECT_TIMEOUT_S, DRIVER_ERRORS, translate
from tenure.backends.postgres._connections import dsn as _dsn
from tenure.contracts.insights import (
    COUNT_CAP,
    CircuitFailures,
    FinishedBucket,
    Insights,
    JobPage,
    JobQuery,
    JobSummary,
    LatencySample,
    id_floor,
)
from tenure.contracts.states import JobState
from tenure.contracts.types import is_uuid

Q = load_queries("tenure.backends.postgres", "insights.sql")
MAX_ID = "ffffffff-ffff-ffff-ffff-ffffffffffff"  # the greatest uuid: "before" of the first page


def _summary(r: asyncpg.Record) -> JobSummary:
    return JobSummary(
        id=r["id"],
        tenant=r["tenant"],
        agent=r["agent"],
        state=JobState(r["state"]),
        priority=r["priority"],
        epoch=r["epoch"],
        attempts=r["attempts"],
        max_attempts=r["max_attempts"],
        owner=r["owner"],
        worker=r["worker"],
        execution_id=r["execution_id"],
        error_code=r["error_code"],
        error_message=r["error_message"],
        created_at=r["created_at"],
        updated_at=r["updated_at"],
        finished_at=r["finished_at"],
    )


class PostgresInsights:
    """The read side on PostgreSQL. Create with `await PostgresInsights.connect(url)`; the schema must be migrated."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._closed = False

    @classmethod
    async def connect(cls, url: str, pool_size: int = 2) -> PostgresInsights:
        """Open a read-only pool of `pool_size` connections (`application_name` tenure-insights)."""
        with translate("connect (insights)"):
            pool = await asyncpg.create_pool(
                _dsn(url),
                min_size=1,
                max_size=pool_size,
                timeout=CONNECT_TIMEOUT_S,
                server_settings={"application_name": "tenure-insights", "default_transaction_read_only": "on"},
            )
        return cls(pool)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(*DRIVER_ERRORS):
            await self._pool.close()

    @contextlib.asynccontextmanager
    async def _conn(self, what: str) -> AsyncIterator[asyncpg.Connection]:
        with translate(what):
            async with self._pool.acquire() as conn:
                yield conn

    async def job_page(self, q: JobQuery) -> JobPage:
        if q.id_from is not None and q.id_to is not None:
            async with self._conn("job_id_range") as conn:
                rows = await conn.fetch(Q["job_id_range"], q.id_from, q.id_to, q.tenant, q.limit + 1)
            jobs = [_summary(r) for r in rows if q.state is None or r["state"] == q.state.value]
            jobs = [j for j in jobs if q.agent is None or j.agent == q.agent]
            return JobPage(jobs[: q.limit], None)
        name, extra = "job_page", []
        if q.tenant is not None:
            name, extra = "job_page_tenant", [q.tenant]
        if q.state is not None:
            name = name + "_state"
            extra.append(q.state.value)
        before = q.before if q.before is not None and is_uuid(q.before) else MAX_ID
        window = q.agent_window if q.agent is not None else q.limit
        async with self._conn(name) as conn:
            rows = await conn.fetch(Q[name], before, window, q.agent, q.limit, *extra)
            jobs = [_summary(r) for r in rows]
            if len(jobs) == q.limit:
                return JobPage(jobs, jobs[-1].id)
            if q.agent is None:
                return JobPage(jobs, None)
            # A short page with an agent filter: the end of the list, or only the end of the window it looked
            # through (a full window with an older job beyond it).
            edge, looked = await conn.fetchrow(Q[name + "_edge"], before, window, *extra)
            if looked == window and (await conn.fetchrow(Q[name + "_edge"], edge, 1, *extra))[1]:
                return JobPage(jobs, edge, edge)
        return JobPage(jobs, None)

    async def jobs_by_idempotency(self, keys: Sequence[tuple[str, bytes]]) -> list[JobSummary]:
        if not keys:
            return []
        async with self._conn("jobs_by_idempotency") as conn:
            rows = await conn.fetch(Q["jobs_by_idempotency"], [t for t, _ in keys], [d for _, d in keys])
        return [_summary(r) for r in rows]

    async def jobs_by_execution(self, execution_ids: Sequence[str]) -> list[JobSummary]:
        ids = sorted({e for e in execution_ids if is_uuid(e)})
        if not ids:
            return []
        async with self._conn("jobs_by_execution") as conn:
            rows = await conn.fetch(Q["jobs_by_execution"], ids)
        return [_summary(r) for r in rows]

    async def count_by_state(self, tenant: str | None, cap: int = COUNT_CAP) -> Mapping[str, int]:
        states = [s.value for s in JobState]
        async with self._conn("count_by_state") as conn:
            if tenant is None:
                rows = await conn.fetch(Q["count_by_state"], cap, states)
            else:
                rows = await conn.fetch(Q["count_by_state_tenant"], cap, states, tenant)
        return {r[0]: int(r[1]) for r in rows}

    async def finished_since(self, tenant: str | None, since: float) -> list[FinishedBucket]:
        async with self._conn("finished_since") as conn:
            if tenant is None:
                rows = await conn.fetch(Q["finished_since"], since)
            else:
                rows = await conn.fetch(Q["finished_since_tenant"], since, tenant)
        return [FinishedBucket(int(r[0]), r[1], int(r[2])) for r in rows]

    async def latency_sample(self, tenant: str | None, since: float, limit: int) -> list[LatencySample]:
        async with self._conn("latency_sample") as conn:
            if tenant is None:
                rows = await conn.fetch(Q["latency_sample"], id_floor(since), limit)
            else:
                rows = await conn.fetch(Q["latency_sample_tenant"], id_floor(since), limit, tenant)
        return [LatencySample(r[0], r[1]) for r in rows]

    async def circuit_failures(self, since: float) -> list[CircuitFailures]:
        async with self._conn("circuit_failures") as conn:
            rows = await conn.fetch(Q["circuit_failures"], since)
        return [CircuitFailures(r[0], int(r[1]), float(r[2])) for r in rows]

    async def tenants(self, limit: int = 1000) -> list[str]:
        async with self._conn("tenants") as conn:
            rows = await conn.fetch(Q["tenants"], limit)
        return [r[0] for r in rows]


if TYPE_CHECKING:
    _PROTOCOL_CHECK: type[Insights] = PostgresInsights
