"""The PostgreSQL claim reads only the jobs its worker can run, whatever the plan cache holds (issue 13).

A worker of agent `b` behind 20,000 queued jobs of agent `a` (and, the other case, behind 20,000 of another
tenant of its own agent) claims through `pg_temp.tenure_claim_start` as the store creates it. auto_explain, loaded
into the test's own session, logs the plan each call of the function ran for its candidate read, with buffers: the
read must go through `jobs_ready_agent`, remove no row by filter, and touch a handful of pages, on the first calls
(before the plan cache could keep anything) and after many (its kept plan). Walking `jobs_ready` with the agent as
a filter read every job of `a` first ("Rows Removed by Filter: 20000"); sorting the agent's queue read all of it. The
UPDATE that takes the candidates must be a Tid Scan, with or without statistics (without, it walked jobs_ready_agent).

"""

from __future__ import annotations

import re
import uuid

import asyncpg
import pytest

from tenure.app import open_backends
from tenure.backends._queries import load_queries
from tenure.settings import Settings
from tests.conftest import PG_BASE, drop_pg_schema, new_pg_schema, pg_url

BACKLOG = 20_000
CLAIM_FUNCTION = load_queries("tenure.backends.postgres")["claim_start_function"]

_FILL = """
INSERT INTO jobs (id, tenant, agent, input, request_fingerprint, fair_at, max_attempts)
SELECT gen_random_uuid(), $2, $3, '{}', '\\x00', $4 + g, 1 FROM generate_series(1, $1) AS g
"""


def _plans(messages: list[str], text: str) -> list[str]:
    return [m for m in messages if text in m]


@pytest.mark.parametrize("stats", ["analyzed", "none"])
@pytest.mark.parametrize("of", ["agent", "tenant"])
async def test_a_claim_reads_the_head_of_its_own_agent_whatever_the_backlog(of: str, stats: str) -> None:
    schema = await new_pg_schema()
    try:
        backends = await open_backends(Settings.of(database_url=pg_url(schema)))
        await backends.close()
        conn = await asyncpg.connect(PG_BASE, server_settings={"search_path": schema})
        try:
            # The backlog first (earlier turns), then 50 jobs of agent b, tenant b.
            if of == "agent":
                await conn.execute(_FILL, BACKLOG, "b", "a", 0.0)
            else:
                await conn.execute(_FILL, BACKLOG, "a", "b", 0.0)
            await conn.execute(_FILL, 50, "b", "b", float(BACKLOG if of == "agent" else 0) + 0.5)
            if stats == "analyzed":
                await conn.execute("ANALYZE jobs")
            await conn.execute(CLAIM_FUNCTION)
            await conn.execute("LOAD 'auto_explain'")
            for setting in ("log_min_duration = 0", "log_nested_statements = on", "log_analyze = on", "log_buffers = on"):
                await conn.execute(f"SET auto_explain.{setting}")
            await conn.execute("SET client_min_messages = log")
            messages: list[str] = []
            conn.add_log_listener(lambda _c, m: messages.append(m.message))
            claimed: list[str] = []
            plans: list[str] = []
            updates: list[str] = []
            for _ in range(12):
                messages.clear()
                rows = await conn.fetch(
                    "SELECT o_id::text, o_agent, o_tenant FROM pg_temp.tenure_claim_start"
                    "('w', '{b}', '{}', 2, 30, 1, $1::uuid[])",
                    [uuid.uuid4(), uuid.uuid4()],
                )
                assert len(rows) == 2 and {r["o_agent"] for r in rows} == {"b"}
                claimed += [r["o_tenant"] for r in rows]
                plans += _plans(messages, "SELECT array_agg")
                updates += _plans(messages, "Query Text: UPDATE jobs AS j")
            await conn.execute("SET client_min_messages = warning")
        finally:
            await conn.close()
        assert len(plans) == 12 and len(updates) == 12, (plans[:1], updates[:1])
        if of == "tenant":
            # Fair shares: tenant b's jobs came first in turn, interleaved with tenant a's.
            assert claimed.count("b") >= 10, claimed
        for plan in plans:
            assert "Index Scan using jobs_ready_agent" in plan, plan
            assert "Rows Removed by Filter" not in plan, plan
            totals = re.search(r"Buffers: shared (.*)", plan)  # the first: the whole read's
            assert totals is not None, plan
            assert sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", totals.group(1))) < 30, plan
        for plan in updates:
            # The claimed rows by their tuple ids, not a walk of a ready index (its predicate is implied).
            assert "Tid Scan on jobs" in plan and "Index Scan" not in plan, plan
    finally:
        await drop_pg_schema(schema)
