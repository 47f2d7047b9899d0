"""Issue 4, end to end as a user runs it: 200 `chat` jobs submitted over HTTP to `tenure up` (gateway + three
supervised workers, PostgreSQL store, Redis leases) in front of a mock model that answers 429 beyond 8
requests in flight, under the global quota `llm:mock=8`. Worker processes are SIGKILLed at random during the
run and the supervisor starts them again. The model must count zero 429s and every job must succeed: chat is
retry-safe, so an attempt lost with its worker is run again once its claim expires."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.acceptance.up import Up, descendants
from tests.integration.mockmodel import start_mock_model, stop_process
from tests.integration.redisproc import RedisProc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

MODEL_LIMIT = 8  # the mock model's --max-concurrency
QUOTA = 8  # TENURE_QUOTAS llm:mock=QUOTA; anything above MODEL_LIMIT must make this test fail
JOBS = 200
TOKENS = 8
KILLS = 5
WORKERS = 3
FOLLOWED = 12  # jobs followed over SSE to their terminal event
TERMINAL_STATES = {"succeeded", "failed", "cancelled", "lost", "expired", "dead"}
TERMINAL_EVENTS = {"job.succeeded", "job.failed", "job.cancelled", "job.lost", "job.expired", "job.dead"}


@pytest.fixture
def mock_model() -> Iterator[str]:
    process, url = start_mock_model(MODEL_LIMIT, latency_ms=100, tokens=TOKENS)
    try:
        yield url
    finally:
        stop_process(process)


def worker_pids(up: Up) -> list[int]:
    """The `tenure worker` processes below the supervisor (the gateway is left alone)."""
    out = []
    for pid in descendants(up.proc.pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"worker" in argv and b"tenure.cli" in argv:
            out.append(pid)
    return sorted(out)


async def submit(client: httpx.AsyncClient, i: int) -> str:
    """POST one chat job; the idempotency key makes a retry after a transport error safe."""
    body = {"agent": "chat", "input": {"prompt": f"job {i} says hello", "max_tokens": TOKENS}}
    for attempt in range(3):
        try:
            r = await client.post("/v1/jobs", json=body, headers={"Idempotency-Key": f"chat-{i}"})
        except httpx.TransportError:
            if attempt == 2:
                raise
            await asyncio.sleep(0.2)
            continue
        assert r.status_code in (200, 201), r.text
        return str(r.json()["id"])
    raise AssertionError("unreachable")


async def follow(client: httpx.AsyncClient, job_id: str) -> list[dict[str, Any]]:
    """Every event of one job over SSE until its terminal event, resuming from the last id if cut off."""
    events: list[dict[str, Any]] = []
    while not events or events[-1]["type"] not in TERMINAL_EVENTS:
        headers = {"Last-Event-ID": events[-1]["id"]} if events else {}
        try:
            async with client.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if line.startswith("data:"):
                        events.append(json.loads(line[5:]))
                        if events[-1]["type"] in TERMINAL_EVENTS:
                            break
        except httpx.TransportError:
            await asyncio.sleep(0.2)
    return events


async def all_jobs(client: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    jobs: dict[str, dict[str, Any]] = {}
    params: dict[str, Any] = {"agent": "chat", "limit": 500}
    while True:
        page = (await client.get("/v1/jobs", params=params)).json()
        jobs.update((j["id"], j) for j in page["jobs"])
        if not page["next_cursor"]:
            return jobs
        params["cursor"] = page["next_cursor"]


async def test_two_hundred_chat_jobs_through_the_gateway_never_draw_a_429_while_workers_are_killed(
    pg_database_url: str, mock_model: str, private_redis: RedisProc, tmp_path: Path
) -> None:
    env = {
        "TENURE_QUOTAS": f"llm:mock={QUOTA}",
        "TENURE_REDIS_URL": private_redis.url,
        "TENURE_REDIS_PREFIX": f"tenure-test:{uuid.uuid4().hex}:",
        "TENURE_MODEL_URL": mock_model,
        "TENURE_CONCURRENCY": "6",  # 18 worker slots for 8 quota slots: the quota, not the workers, limits
    }
    rng = random.Random(4)
    kills: list[int] = []
    up = Up(pg_database_url, tmp_path, workers=WORKERS, env=env)
    try:
        limits = httpx.Limits(max_connections=FOLLOWED + 16)
        async with (
            httpx.AsyncClient(base_url=up.url, headers=up.headers(), timeout=60, limits=limits) as client,
            httpx.AsyncClient() as model,
        ):
            gate = asyncio.Semaphore(16)

            async def submit_one(i: int) -> str:
                async with gate:
                    return await submit(client, i)

            ids = await asyncio.gather(*(submit_one(i) for i in range(JOBS)))
            assert len(set(ids)) == JOBS
            followers = [asyncio.create_task(follow(client, j)) for j in rng.sample(ids, FOLLOWED)]

            async with asyncio.timeout(180):
                while True:
                    jobs = await all_jobs(client)
                    unfinished = sum(1 for j in jobs.values() if j["state"] not in TERMINAL_STATES)
                    if not unfinished:
                        break
                    if len(kills) < KILLS and unfinished > JOBS // 10:
                        live = worker_pids(up)
                        if live:
                            victim = rng.choice(live)
                            os.kill(victim, signal.SIGKILL)
                            kills.append(victim)
                    await asyncio.sleep(rng.uniform(0.5, 1.0))
                followed = await asyncio.gather(*followers)
            stats = (await model.get(mock_model.removesuffix("/v1") + "/stats")).json()
            async with asyncio.timeout(30):  # the supervisor brought every killed worker back
                while len(worker_pids(up)) < WORKERS:
                    await asyncio.sleep(0.2)
    finally:
        code = up.stop()
    log = up.log()
    assert code == 0, log

    assert len(kills) == KILLS, f"only {len(kills)} kills before the run ended"
    assert log.count("restarting in") >= KILLS, log[-4000:]
    if stats["rejected_429"]:
        retried = [line for line in log.splitlines() if "429" in line]
        pytest.fail(f"the model answered 429: {stats}\n" + "\n".join(r[:200] for r in retried[-20:]))
    assert stats["max_in_flight"] <= MODEL_LIMIT, stats
    assert stats["max_in_flight"] == QUOTA, f"the quota was never full, so the run did not test it: {stats}"
    assert set(jobs) == set(ids)
    outcomes: dict[str, int] = {}
    for j in jobs.values():
        outcomes[j["state"]] = outcomes.get(j["state"], 0) + 1
    # chat is retry-safe: an attempt lost with its worker is run again, so every job succeeds.
    assert outcomes == {"succeeded": JOBS}, outcomes
    assert all(j["result"]["tokens"] == TOKENS for j in jobs.values())
    assert stats["requests"] >= JOBS
    # The kills landed on running work: some jobs needed more than one attempt.
    assert any(j["attempts"] > 1 for j in jobs.values()), "no kill interrupted a job"
    for events in followed:
        end = events[-1]
        assert end["type"] == "job.succeeded", end
        job = jobs[end["job_id"]]
        # The deltas of the attempt that succeeded spell its result (a lost attempt's deltas stay in the
        # history under an older epoch).
        text = "".join(e["payload"]["text"] for e in events if e["type"] == "message.delta" and e["epoch"] == end["epoch"])
        assert text == job["result"]["text"]
