"""End to end, without the gateway: `chat` jobs submitted through `tenure.connect`, run by `tenure worker`
processes that share the global quota `llm:mock=8` (Redis leases) in front of a mock model that answers 429
beyond 8 requests in flight. Workers are SIGKILLed at random and restarted during the run."""

from __future__ import annotations

import asyncio
import random
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tenure.contracts.states import JobState
from tenure.control.admission import JobRequest
from tenure.local import connect
from tests.integration.mockmodel import start_mock_model, stop_process
from tests.integration.procs import WorkerProc
from tests.integration.redisproc import RedisProc

pytestmark = pytest.mark.slow

MODEL_LIMIT = 8


@pytest.fixture
def mock_model() -> Iterator[str]:
    process, url = start_mock_model(MODEL_LIMIT, latency_ms=100)
    try:
        yield url
    finally:
        stop_process(process)


async def test_two_hundred_chat_jobs_never_exceed_the_models_limit_while_workers_are_killed(
    pg_database_url: str, mock_model: str, private_redis: RedisProc, tmp_path: Path
) -> None:
    env = {
        "TENURE_QUOTAS": f"llm:mock={MODEL_LIMIT}",
        "TENURE_REDIS_URL": private_redis.url,
        "TENURE_REDIS_PREFIX": f"tenure-test:{uuid.uuid4().hex}:",
        "TENURE_MODEL_URL": mock_model,
    }
    workers: list[WorkerProc] = []
    kills = 0
    rng = random.Random(7)

    def spawn() -> WorkerProc:
        w = WorkerProc(pg_database_url, tmp_path, f"w{len(workers)}", concurrency=6, env=env)
        workers.append(w)
        return w

    async with connect("tenure.demos.examples:app", pg_database_url) as client, httpx.AsyncClient() as http:
        stats_url = mock_model.removesuffix("/v1") + "/stats"
        live = [spawn() for _ in range(3)]
        try:
            ids = await client.submit_many(
                [JobRequest("chat", {"prompt": f"job {i} says hello", "max_tokens": 8}) for i in range(200)]
            )

            async def unfinished() -> int:
                jobs = await client.jobs(limit=500)
                return sum(1 for j in jobs if not j.state.terminal)

            async with asyncio.timeout(150):
                while await unfinished():
                    await asyncio.sleep(rng.uniform(0.6, 1.2))
                    if kills < 5:
                        victim = live.pop(rng.randrange(len(live)))
                        victim.signal(signal.SIGKILL)
                        kills += 1
                        live.append(spawn())
            stats = (await http.get(stats_url)).json()
            jobs = {j.id: j for j in await client.jobs(limit=500)}
        finally:
            warnings = [line for w in workers for line in w.log().splitlines() if "WARNING" in line]
            for w in workers:
                w.stop()

    assert kills == 5
    if stats["rejected_429"]:
        pytest.fail(f"the model answered 429: {stats}\n" + "\n".join(w[:200] for w in warnings[-40:]))
    assert stats["max_in_flight"] <= MODEL_LIMIT, stats
    assert set(jobs) == set(ids)
    assert all(j.state.terminal for j in jobs.values())
    outcomes = {s: sum(1 for j in jobs.values() if j.state is s) for s in JobState}
    # chat is retry-safe: an attempt lost with its worker is run again, so every job succeeds.
    assert outcomes[JobState.SUCCEEDED] == 200, {s.value: n for s, n in outcomes.items() if n}
    assert all(j.result["tokens"] == 8 for j in jobs.values())
