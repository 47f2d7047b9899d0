"""A worker with the Redis ready index (TENURE_REDIS_URL) runs the same claim loop as one that polls the store:
it reports queue wait and dispatch, and a degraded worker stops claiming at its next claim round, not at its
next heartbeat."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tenure.contracts.states import JobState
from tenure.local import LocalClient, connect
from tenure.settings import Settings
from tests.integration.procs import WorkerProc, eventually
from tests.integration.redisproc import RedisProc
from tests.integration.test_observability import APP, all_terminal, metrics_url, scrape, terminal, value

pytestmark = pytest.mark.slow


@pytest.fixture
def workers() -> Iterator[list[WorkerProc]]:
    started: list[WorkerProc] = []
    yield started
    for w in started:
        w.stop()


def _settings(database_url: str, redis: RedisProc, prefix: str) -> Settings:
    return Settings.of(database_url=database_url, redis_url=redis.url, redis_prefix=prefix)


async def test_with_a_ready_index_queue_wait_and_dispatch_are_observed(
    database_url: str, private_redis: RedisProc, workers: list[WorkerProc], tmp_path: Path
) -> None:
    prefix = f"tenure-test:{uuid.uuid4().hex}:"
    env = {"TENURE_REDIS_URL": private_redis.url, "TENURE_REDIS_PREFIX": prefix}
    w = WorkerProc(database_url, tmp_path, "w", app=APP, concurrency=4, env=env, args=("--metrics-port", "0"))
    workers.append(w)
    url = await metrics_url(w)
    async with connect(APP, settings=_settings(database_url, private_redis, prefix)) as client:
        ids = [(await client.submit("model_call", {"n": n})).job.id for n in range(10)]
        jobs = await eventually(lambda: all_terminal(client, ids), 30, f"the jobs to finish\n{w.log()}")
    assert all(j.state is JobState.SUCCEEDED for j in jobs), w.log()
    s = await scrape(url)
    assert value(s, "tenure_queue_wait_seconds_count", agent="model_call") == 10, w.log()
    assert value(s, "tenure_dispatch_seconds_count", agent="model_call") == 10, w.log()


async def test_with_a_ready_index_a_degraded_worker_stops_claiming_before_its_next_heartbeat(
    sqlite_database_url: str, private_redis: RedisProc, workers: list[WorkerProc], tmp_path: Path
) -> None:
    prefix = f"tenure-test:{uuid.uuid4().hex}:"
    # Heartbeats 10 s apart: the worker must notice its own lag at the claim loop, between them.
    env = {
        "TENURE_REDIS_URL": private_redis.url,
        "TENURE_REDIS_PREFIX": prefix,
        "TENURE_DEGRADED_LAG_S": "0.3",
        "TENURE_DEGRADED_FOR_S": "1.0",
        "TENURE_HEARTBEAT_S": "10",
        "TENURE_CLAIM_TTL_S": "30",
    }
    w = WorkerProc(sqlite_database_url, tmp_path, "w", app=APP, concurrency=4, env=env)
    workers.append(w)
    async with connect(APP, settings=_settings(sqlite_database_url, private_redis, prefix)) as client:
        await eventually(lambda: _registered(client), 20, "the worker to register")
        laggy_id = (await client.submit("laggy", {"blocks": 8, "block_s": 0.4, "gap_s": 0.1})).job.id
        await eventually(lambda: _started(client, laggy_id), 15, "the laggy job to start")
        await eventually(lambda: _logged(w, "worker degraded"), 10, f"the worker to see its lag\n{w.log()}")
        fresh_id = (await client.submit("model_call", {})).job.id
        laggy = await eventually(lambda: terminal(client, laggy_id), 30, "the laggy job to finish")
        assert (await client.job(fresh_id)).owner is None, "a degraded worker claimed a new job"
        fresh = await eventually(lambda: terminal(client, fresh_id), 20, "the new job, once the worker recovered")
    assert laggy.state is JobState.SUCCEEDED and fresh.state is JobState.SUCCEEDED, w.log()
    assert fresh.execution_started_at is not None and laggy.finished_at is not None
    assert fresh.execution_started_at > laggy.finished_at  # claimed only after the lag went away


async def _registered(client: LocalClient) -> bool:
    return len(await client.workers()) >= 1


async def _started(client: LocalClient, job_id: str) -> bool:
    return (await client.job(job_id)).state is JobState.RUNNING


async def _logged(w: WorkerProc, text: str) -> bool:
    return text in w.log()
