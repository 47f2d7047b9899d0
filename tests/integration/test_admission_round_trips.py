"""The gateway's submit path on PostgreSQL, counted in round trips: the insert, which makes the gate's read
(`Gate.ask`), and its flush barrier (it was five: the circuit, the queue depth, the insert, the barrier and a
re-read of the job; then three, with the gate's read on its own)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import asyncpg
import httpx
import pytest

from tenure.app import load_app, open_backends
from tenure.gateway.app import Gateway
from tenure.gateway.auth import Auth
from tenure.serve import gateway_config
from tenure.settings import Settings


def count_statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement asyncpg sends from now on (each `fetch*` / `execute` call is one round trip)."""
    sent: list[str] = []

    def counted(name: str) -> Callable[..., Any]:
        original = getattr(asyncpg.Connection, name)

        async def call(self: asyncpg.Connection, query: str, *args: Any, **kw: Any) -> Any:
            sent.append(query.strip().splitlines()[0])
            return await original(self, query, *args, **kw)

        return call

    for name in ("fetch", "fetchrow", "fetchval", "execute", "executemany"):
        monkeypatch.setattr(asyncpg.Connection, name, counted(name))
    return sent


async def test_a_gateway_submit_costs_two_round_trips(pg_database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings.of(database_url=pg_database_url)
    backends = await open_backends(settings)
    try:
        gateway = Gateway(backends, load_app("tenure.demos.examples:app").specs(), Auth.open(), gateway_config(settings))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(gateway.asgi), base_url="http://gateway") as http:
            warm = await http.post("/v1/jobs", json={"agent": "echo", "input": 0})  # statements prepared once
            assert warm.status_code == 201, warm.text
            sent = count_statements(monkeypatch)
            r = await http.post("/v1/jobs", json={"agent": "echo", "input": {"n": 1}})
            assert r.status_code == 201 and r.json()["input"] == {"n": 1} and r.json()["state"] == "queued"
            assert len(sent) == 2, sent  # enqueue_jobs (with the gate's read), flush_barrier
            del sent[:]
            r = await http.post("/v1/jobs", json={"agent": "echo", "input": 2}, headers={"Idempotency-Key": "k"})
            again = await http.post("/v1/jobs", json={"agent": "echo", "input": 2}, headers={"Idempotency-Key": "k"})
            assert (r.status_code, again.status_code) == (201, 200) and again.json() == r.json()
            assert len(sent) == 2 + 3, sent  # a replay: the insert (and the gate), the existing job, the barrier
    finally:
        await backends.close()


async def test_the_enqueue_is_a_function_that_keeps_its_generic_plan(pg_database_url: str) -> None:
    # As a prepared statement the enqueue was planned again at every bind (0.40 ms of 0.57 on the server for one
    # job); the function's own plan_cache_mode keeps PL/pgSQL's generic plan (migration 0014). Dropping the SET
    # clause, or going back to the statement, fails this.
    from tenure.backends.postgres.store import Q

    statement = "\n".join(line for line in Q["enqueue_jobs"].splitlines() if not line.lstrip().startswith("--"))
    assert statement.lstrip().startswith("SELECT * FROM tenure_enqueue("), statement
    backends = await open_backends(Settings.of(database_url=pg_database_url))
    await backends.close()
    conn = await asyncpg.connect(pg_database_url)
    try:
        config = await conn.fetchval(
            "SELECT proconfig FROM pg_proc WHERE proname = 'tenure_enqueue'"
            " AND pronamespace = current_schema()::regnamespace"
        )
    finally:
        await conn.close()
    assert config == ["plan_cache_mode=force_generic_plan"], config


async def test_the_gates_read_planned_on_an_empty_table_never_scans_every_job(pg_database_url: str) -> None:
    # The gate's counts are planned once per session (the enqueue's plan_cache_mode holds for the functions it
    # calls). Planned while the table was empty, the total was a sequential scan of `jobs`, kept for the
    # session: every submit then read every job the table held, finished ones included. Taking the SET clause of
    # migration 0016 off fails this.
    backends = await open_backends(Settings.of(database_url=pg_database_url))
    await backends.close()
    conn = await asyncpg.connect(pg_database_url)
    read = "SELECT total, mine FROM tenure_admission_state('t', 'c', 60, 501)"
    try:
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        assert tuple(await conn.fetchrow(read)) == (0, 0)  # planned now, on an empty table
        await conn.execute(
            "INSERT INTO jobs (id, tenant, agent, input, request_fingerprint, max_attempts, state, finished_at)"
            " SELECT gen_random_uuid(), 't', 'a', '{}', '\\x00', 1, 'succeeded', now()"
            " FROM generate_series(1, 5000)"
        )
        async with conn.transaction():
            assert tuple(await conn.fetchrow(read)) == (0, 0)
            scans = await conn.fetchval("SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relid = 'jobs'::regclass")
        assert scans == 0, f"the gate's read scanned the jobs table {scans} time(s)"
    finally:
        await conn.close()
