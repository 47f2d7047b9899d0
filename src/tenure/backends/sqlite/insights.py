"""`Insights` on SQLite: the dashboard's read side (contracts/insights.py), on a connection and a thread of its own.

The connection is `query_only` and separate from the store's: in WAL mode a reader never waits for the writer,
so a person paging the jobs list neither queues behind the store's connection thread (where every claim and
finish of an inline worker runs) nor holds up a write. sqlite3 blocks, so every query runs on that one thread.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from tenure.backends._queries import load_queries
from tenure.backends.sqlite._connection import sqlite_path
from tenure.backends.sqlite._state_pages import per_state
from tenure.contracts.errors import StoreUnavailable
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

Q = load_queries("tenure.backends.sqlite", "insights.sql")
QS = per_state(
    Q,
    ["count_by_state", "count_by_state_tenant", *(f"job_page{t}_state{e}" for t in ("", "_tenant") for e in ("", "_edge"))],
)
MAX_ID = "g"  # sorts after every id (ids are lowercase hex and dashes): "before" of the first page
T = TypeVar("T")


def _summary(r: Sequence[Any]) -> JobSummary:
    return JobSummary(
        id=r[0],
        tenant=r[1],
        agent=r[2],
        state=JobState(r[3]),
        priority=r[4],
        epoch=r[5],
        attempts=r[6],
        max_attempts=r[7],
        owner=r[8],
        worker=r[9],
        execution_id=r[10],
        error_code=r[11],
        error_message=r[12],
        created_at=r[13],
        updated_at=r[14],
        finished_at=r[15],
    )


class SqliteInsights:
    """The read side on SQLite. Create with `await SqliteInsights.connect(url)`; the schema must be migrated."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tenure-insights")
        self._db: sqlite3.Connection | None = None
        self._closed = False

    @classmethod
    async def connect(cls, url: str) -> SqliteInsights:
        """Open a query-only connection to the database file of `url`."""
        insights = cls(sqlite_path(url))
        await insights._run(insights._open, "connect (insights)")
        return insights

    def _open(self) -> None:
        db = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False, timeout=5.0)
        db.execute("PRAGMA query_only = 1")
        self._db = db

    async def _run(self, fn: Callable[[], T], what: str) -> T:
        if self._closed:
            raise StoreUnavailable("the insights connection is closed")
        try:
            return await asyncio.wrap_future(self._executor.submit(fn))
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"SQLite failed during {what}: {exc}") from exc

    async def _fetch(self, name: str, *params: Any) -> list[Any]:
        return await self._query(Q[name], name, *params)

    async def _query(self, sql: str, name: str, *params: Any) -> list[Any]:
        def fn() -> list[Any]:
            assert self._db is not None
            return self._db.execute(sql, params).fetchall()

        return await self._run(fn, name)

    async def close(self) -> None:
        if self._closed:
            return

        def _close() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None

        await asyncio.wrap_future(self._executor.submit(_close))
        self._closed = True
        self._executor.shutdown(wait=False)

    async def job_page(self, q: JobQuery) -> JobPage:
        if q.id_from is not None and q.id_to is not None:
            rows = await self._fetch("job_id_range", q.id_from, q.id_to, q.tenant, q.limit + 1)
            jobs = [_summary(r) for r in rows]
            jobs = [j for j in jobs if (q.state is None or j.state is q.state) and (q.agent is None or j.agent == q.agent)]
            return JobPage(jobs[: q.limit], None)
        name, extra = "job_page", []
        if q.tenant is not None:
            name, extra = "job_page_tenant", [q.tenant]
        if q.state is not None:
            name = name + "_state"
            extra.append(q.state.value)
        page, edges = (Q[name], Q[name + "_edge"]) if q.state is None else (QS[name, q.state], QS[name + "_edge", q.state])
        before = q.before or MAX_ID
        window = q.agent_window if q.agent is not None else q.limit
        jobs = [_summary(r) for r in await self._query(page, name, before, window, q.agent, q.limit, *extra)]
        if len(jobs) == q.limit:
            return JobPage(jobs, jobs[-1].id)
        if q.agent is None:
            return JobPage(jobs, None)
        # A short page with an agent filter: the end of the list, or only the end of the window it looked through
        # (a full window with an older job beyond it).
        ((edge, looked),) = await self._query(edges, name, before, window, *extra)
        if looked == window and (await self._query(edges, name, edge, 1, *extra))[0][1]:
            return JobPage(jobs, edge, edge)
        return JobPage(jobs, None)

    async def jobs_by_idempotency(self, keys: Sequence[tuple[str, bytes]]) -> list[JobSummary]:
        out: list[JobSummary] = []
        for tenant, digest in keys:
            out += [_summary(r) for r in await self._fetch("jobs_by_idempotency", tenant, digest)]
        return sorted(out, key=lambda j: j.id, reverse=True)

    async def jobs_by_execution(self, execution_ids: Sequence[str]) -> list[JobSummary]:
        if not execution_ids:
            return []
        return [_summary(r) for r in await self._fetch("jobs_by_execution", json.dumps(sorted(set(execution_ids))))]

    async def count_by_state(self, tenant: str | None, cap: int = COUNT_CAP) -> Mapping[str, int]:
        name, extra = ("count_by_state", ()) if tenant is None else ("count_by_state_tenant", (tenant,))

        def fn() -> dict[str, int]:  # one query per state, each on its own index, in one trip to the thread
            assert self._db is not None
            return {s.value: int(self._db.execute(QS[name, s], (cap, s.value, *extra)).fetchone()[0]) for s in JobState}

        return await self._run(fn, name)

    async def finished_since(self, tenant: str | None, since: float) -> list[FinishedBucket]:
        if tenant is None:
            rows = await self._fetch("finished_since", since)
        else:
            rows = await self._fetch("finished_since_tenant", since, tenant)
        return [FinishedBucket(int(r[0]), r[1], int(r[2])) for r in rows]

    async def latency_sample(self, tenant: str | None, since: float, limit: int) -> list[LatencySample]:
        if tenant is None:
            rows = await self._fetch("latency_sample", id_floor(since), limit)
        else:
            rows = await self._fetch("latency_sample_tenant", id_floor(since), limit, tenant)
        return [LatencySample(r[0], r[1]) for r in rows]

    async def circuit_failures(self, since: float) -> list[CircuitFailures]:
        return [CircuitFailures(r[0], int(r[1]), float(r[2])) for r in await self._fetch("circuit_failures", since)]

    async def tenants(self, limit: int = 1000) -> list[str]:
        return [r[0] for r in await self._fetch("tenants", limit)]


if TYPE_CHECKING:
    _PROTOCOL_CHECK: type[Insights] = SqliteInsights
