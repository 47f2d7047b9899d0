"""The claim's candidate read on PostgreSQL reads the head of each of its worker's agents in `jobs_ready_agent`
(migration 0016), whichever plan PL/pgSQL caches: with `agent = ANY(...)` over `jobs_ready`, the generic plan
walked past every queued job of the agents the worker does not serve (bench/backlog.py: 545 ms per claim behind
1,000,000 of them). The statement EXPLAINed is the store's own (`claim_jobs`' `candidates`)."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import asyncpg

import tenure
from tenure.backends._queries import cte_body
from tenure.backends.postgres.store import Q
from tenure.settings import Settings

BACKLOG = 3000

app = tenure.Tenure()


@app.agent("a")
async def a(ctx: tenure.Context, input: Any) -> None:
    return None


@app.agent("b")
async def b(ctx: tenure.Context, input: Any) -> None:
    return None


def scans(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of `plan` that reads the jobs table or one of its indexes."""
    out = [plan] if plan.get("Relation Name") == "jobs" else []
    for child in plan.get("Plans", []):
        out += scans(child)
    return out


async def test_the_claim_reads_only_the_heads_of_its_agents_behind_another_agents_backlog(pg_database_url: str) -> None:
    settings = Settings.of(database_url=pg_database_url, max_queued=10**6, max_queued_per_tenant=10**6)
    async with tenure.connect(app, settings=settings) as client:
        for start in range(0, BACKLOG, 1000):
            await client.submit_many([tenure.JobRequest("a", i) for i in range(start, start + 1000)])
        await client.submit_many([tenure.JobRequest("b", i) for i in range(3)])
    candidates = cte_body(Q["claim_jobs"], "candidates")
    conn = await asyncpg.connect(pg_database_url)
    try:
        await conn.execute("ANALYZE jobs")
        for mode in ("force_custom_plan", "force_generic_plan"):
            with contextlib.suppress(_Rollback):
                async with conn.transaction():  # rolled back: the read locks the rows it returns
                    await conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
                    await conn.execute(f"PREPARE candidates(text, text[], text[], int4) AS {candidates}")
                    explained = await conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE candidates('w', '{b}', '{}', 4)")
                    await conn.execute("DEALLOCATE candidates")
                    raise _Rollback
            plan = json.loads(explained)[0]["Plan"]
            assert plan["Actual Rows"] == 3, (mode, plan)
            reads = scans(plan)
            assert reads and all(r.get("Index Name") == "jobs_ready_agent" for r in reads), (mode, reads)
            walked = sum(r["Actual Rows"] + r.get("Rows Removed by Filter", 0) for r in reads)
            assert walked <= 4, (mode, walked)  # the heads of agent b, never a job of agent a
    finally:
        await conn.close()


class _Rollback(Exception):
    pass
