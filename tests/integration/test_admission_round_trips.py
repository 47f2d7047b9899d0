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
