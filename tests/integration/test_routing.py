"""Weighted routing with real worker processes (docs/routing.md): three `tenure worker`s whose records (success
rate, latency) the test writes into their profiles through the store's heartbeat; a gateway admits the job. The
job starts on the worker the formula picks, and the test recomputes the formula from the profiles of
`GET /v1/workers` and checks it against `GET /v1/jobs/{id}`'s `route`. With that worker SIGSTOPped, the next job
still starts, on another worker, once the grace ended (grace + one poll; the assertion is on where, not how fast).
On SQLite and PostgreSQL, and once with the Redis ready index."""

from __future__ import annotations

import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tenure.app import open_backends
from tenure.contracts.profile import WorkerRecord
from tenure.contracts.states import WorkerState
from tenure.control.scoring import score
from tenure.settings import Settings
from tests.integration.procs import TTL, TenureProc, WorkerProc, eventually
from tests.integration.redisproc import RedisProc

pytestmark = pytest.mark.slow

# name → (success rate, latency ms): "good" scores best with the default weights, "bad" worst.
RECORDS = {"good": (1.0, 100.0), "mid": (0.5, 2000.0), "bad": (0.2, 5000.0)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def routed_start(database_url: str, tmp_path: Path, env: dict[str, str]) -> None:
    b = await open_backends(Settings.of(database_url=database_url))
    # The worker to be frozen heartbeats and sweeps rarely, so that SIGSTOP does not catch it inside a write
    # transaction (on SQLite, a frozen writer holds the one write lock: no other process could write at all).
    quiet = {"TENURE_HEARTBEAT_S": "10", "TENURE_CLAIM_TTL_S": "30", "TENURE_SWEEP_INTERVAL_S": "10"}
    workers = {n: WorkerProc(database_url, tmp_path, n, concurrency=4, env=env | (quiet if n == "good" else {}))
               for n in RECORDS}  # fmt: skip
    gateway: TenureProc | None = None
    try:
        pids = {w.pid: n for n, w in workers.items()}

        async def registered() -> dict[str, str] | None:
            live = [w for w in await b.jobs.list_workers() if w.state is WorkerState.ACTIVE and w.pid in pids]
            return {pids[w.pid]: w.id for w in live} if len(live) == len(RECORDS) else None

        ids = await eventually(registered, 60, "three active workers")
        for name, (success, latency) in RECORDS.items():  # the record, as a worker's own heartbeat writes it
            await b.jobs.heartbeat(ids[name], WorkerState.ACTIVE, 0, [], TTL, WorkerRecord(success, latency))
        port = free_port()
        gateway = TenureProc(database_url, tmp_path, "gw", ["gateway", "--port", str(port)], env={"TENURE_UI": "off", **env})
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:

            async def up() -> bool:
                try:
                    return (await http.get("/v1/workers")).status_code == 200
                except httpx.HTTPError:
                    return False

            await eventually(up, 60, "the gateway to answer")
            profiles = {w["id"]: w for w in (await http.get("/v1/workers")).json()["workers"]}

            first = await submit_and_start(http)
            route = first["route"]
            expected = recompute(route, profiles)
            assert expected == ids["good"]
            assert route["preferred_worker"] == expected and route["reason"] == "preferred"
            assert route["claimed_by"] == expected and route["why"] == f"preferred worker claimed it ({expected})"

            await eventually(lambda: finished(http, first["id"]), 30, "the first job to finish")
            workers["good"].signal(signal.SIGSTOP)  # still `active` in the registry: its heartbeats just stop
            second = await submit_and_start(http)
            route = second["route"]
            assert route["preferred_worker"] == ids["good"]  # the snapshot still shows it best, one job routed to it
            assert route["claimed_by"] in {ids["mid"], ids["bad"]}
            assert route["why"] == f"grace ended; claimed by {route['claimed_by']} (preferred worker was {ids['good']})"
            assert route["claimed_at"] >= route["grace_ends_at"]
    finally:
        if gateway is not None:
            gateway.stop()
        for w in workers.values():
            w.stop()
        await b.close()


async def submit_and_start(http: httpx.AsyncClient) -> dict[str, Any]:
    r = await http.post("/v1/jobs", json={"agent": "echo", "input": {"n": 1}})
    assert r.status_code in (200, 201, 202), r.text
    job_id = r.json()["id"]

    async def started() -> dict[str, Any] | None:
        view: dict[str, Any] = (await http.get(f"/v1/jobs/{job_id}")).json()
        return view if view["route"] is not None and view["route"]["claimed_by"] is not None else None

    return await eventually(started, 30, f"job {job_id} to start")


async def finished(http: httpx.AsyncClient, job_id: str) -> bool:
    return bool((await http.get(f"/v1/jobs/{job_id}")).json()["state"] == "succeeded")


def recompute(route: dict[str, Any], profiles: dict[str, dict[str, Any]]) -> str:
    """The formula, from the profiles of `GET /v1/workers` (not from the route's own numbers), checked against
    every candidate's score in the route; returns the worker it picks (ties: the smaller id)."""
    weights, limit_ms = route["weights"], route["limit_ms"]
    scores = {}
    for c in route["candidates"]:
        p = profiles[c["worker_id"]]
        load = p["in_flight"] / p["concurrency"]
        assert c["load"] == pytest.approx(load)
        assert (c["recorded_success_rate"], c["latency_ms"]) == (p["success_rate"], p["latency_ms"])
        scores[c["worker_id"]] = score(load, p["success_rate"], p["latency_ms"], 0, weights, limit_ms)
        assert c["score"] == pytest.approx(scores[c["worker_id"]], abs=1e-6)
    assert len(scores) == len(RECORDS)
    return min(scores, key=lambda w: (-scores[w], w))


async def test_the_job_starts_on_the_worker_the_formula_picks_and_elsewhere_when_it_is_stopped(
    database_url: str, tmp_path: Path
) -> None:
    await routed_start(database_url, tmp_path, {})


@pytest.fixture
async def redis_backed(pg_database_url: str, private_redis: RedisProc) -> AsyncIterator[tuple[str, dict[str, str]]]:
    yield pg_database_url, {"TENURE_REDIS_URL": private_redis.url, "TENURE_REDIS_PREFIX": "route-test"}


async def test_with_the_redis_ready_index_a_hint_taken_by_another_worker_loses_no_job(
    redis_backed: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    database_url, env = redis_backed
    await routed_start(database_url, tmp_path, env)
