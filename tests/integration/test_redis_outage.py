"""Redis is the accelerator, never the truth: restarting or flushing it (a private redis-server, never the
shared one) during a run loses no job and runs none twice, a cancel still reaches a running job through
the heartbeat while Redis is down, and a quota whose leases Redis lost admits nobody new until the old holders
have stopped."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tenure.backends.redis import RedisLeases
from tenure.contracts.states import JobState
from tenure.contracts.types import ControlOutcome
from tenure.control.admission import JobRequest
from tenure.local import connect
from tenure.settings import Settings
from tests.integration.mockmodel import start_mock_model, stop_process
from tests.integration.procs import FAST, WorkerProc, eventually
from tests.integration.redisproc import RedisProc

pytestmark = pytest.mark.slow
HEARTBEAT_S = float(FAST["TENURE_HEARTBEAT_S"])


async def test_five_hundred_jobs_survive_a_flushall_and_a_restart_of_redis_none_lost_none_run_twice(
    pg_database_url: str, private_redis: RedisProc, tmp_path: Path
) -> None:
    env = {"TENURE_REDIS_URL": private_redis.url}
    workers = [WorkerProc(pg_database_url, tmp_path, f"w{i}", concurrency=8, env=env) for i in range(2)]
    settings = Settings.of(database_url=pg_database_url, redis_url=private_redis.url)
    try:
        async with connect("tenure.demos.examples:app", settings=settings) as client:
            ids = await client.submit_many([JobRequest("sleep", {"seconds": 0.1, "every": 1}) for _ in range(500)])

            async def finished() -> int:
                return sum(1 for j in await client.jobs(limit=1000) if j.state.terminal)

            await eventually(lambda: _at_least(finished, 100), 60, "100 jobs to finish")
            private_redis.flushall()
            done_at_flush = await finished()
            await eventually(lambda: _at_least(finished, 250), 60, "250 jobs to finish after FLUSHALL")
            private_redis.restart()
            done_at_restart = await finished()
            await eventually(lambda: _at_least(finished, 500), 90, "every job to finish after the restart")
            jobs = {j.id: j for j in await client.jobs(limit=1000)}
            executions = await asyncio.gather(*(client.store.list_executions(i) for i in ids))
    finally:
        logs = [w.log() for w in workers]
        for w in workers:
            w.stop()
    assert done_at_flush < 250 and done_at_restart < 450, "Redis went away too late to matter"
    assert set(jobs) == set(ids)
    assert all(j.state is JobState.SUCCEEDED for j in jobs.values()), {j.state for j in jobs.values()}
    assert all(j.attempts == 1 for j in jobs.values())
    assert all(len(e) == 1 for e in executions), "a job was run twice"
    # Rebuilt at least at start, after the FLUSHALL and after the restart.
    rebuilds = sum(log.count("ready index rebuilt") for log in logs)
    assert rebuilds >= 3, f"the lost index was rebuilt {rebuilds} times"


async def _at_least(count: object, n: int) -> bool:
    return await count() >= n  # type: ignore[operator,no-any-return]


async def test_a_cancel_reaches_a_running_job_through_the_heartbeat_while_redis_is_down(
    pg_database_url: str, private_redis: RedisProc, tmp_path: Path
) -> None:
    worker = WorkerProc(pg_database_url, tmp_path, "w", env={"TENURE_REDIS_URL": private_redis.url})
    try:
        async with connect("tenure.demos.examples:app", pg_database_url) as client:
            job_id = (await client.submit("sleep", {"seconds": 60, "every": 5})).job.id

            async def running() -> bool:
                return (await client.job(job_id)).state is JobState.RUNNING

            await eventually(running, 30, "the job to start")
            private_redis.kill()  # pub/sub (and the whole of Redis) is down from here on
            assert await client.store.cancel(job_id) is ControlOutcome.REQUESTED
            job = await client.wait(job_id, timeout_s=10)
    finally:
        worker.stop()
    assert job.state is JobState.CANCELLED
    assert job.cancel_requested_at is not None and job.finished_at is not None
    # Both times are the database's clock: the cancel reached the job at the next heartbeat.
    assert job.finished_at - job.cancel_requested_at <= HEARTBEAT_S + 0.5


QUOTA = 3


@pytest.fixture
def mock_model() -> Iterator[str]:
    """The model counts what it sees; its own limit is far above the quota, so an overrun shows in max_in_flight
    rather than as 429s."""
    process, url = start_mock_model(4 * QUOTA, latency_ms=800)
    try:
        yield url
    finally:
        stop_process(process)


@pytest.mark.parametrize("loss", ["flushall", "restart"])
async def test_a_quota_admits_no_more_than_its_limit_when_redis_loses_its_leases(
    pg_database_url: str, private_redis: RedisProc, mock_model: str, tmp_path: Path, loss: str
) -> None:
    """Leases on a Redis without persistence: after a FLUSHALL or a restart, the old holders go on with their calls
    until their next renewal tells them the lease is gone (LeaseLost); nobody new may join them meanwhile."""
    env = {
        "TENURE_QUOTAS": f"llm:mock={QUOTA}",
        "TENURE_REDIS_URL": private_redis.url,
        "TENURE_MODEL_URL": mock_model,
        # Renewals a second apart: the old holders may call for up to a second after the loss. Two workers of 8
        # slots, so that 13 waiters poll for a slot meanwhile.
        "TENURE_HEARTBEAT_S": "1",
        "TENURE_CLAIM_TTL_S": "3",
    }
    workers = [WorkerProc(pg_database_url, tmp_path, f"w{i}", concurrency=8, env=env) for i in range(2)]
    stats_url = mock_model.removesuffix("/v1") + "/stats"
    newcomer = RedisLeases(private_redis.url, prefix="tenure:lease:")  # where the workers keep their leases
    try:
        async with connect("tenure.demos.examples:app", pg_database_url) as client, httpx.AsyncClient() as http:
            await client.submit_many([JobRequest("chat", {"prompt": f"job {i}", "max_tokens": 8}) for i in range(300)])

            async def quota_in_use() -> bool:
                return bool((await http.get(stats_url)).json()["in_flight"] == QUOTA)

            async def succeeded() -> int:
                return len(await client.jobs(state=JobState.SUCCEEDED, limit=500))

            await eventually(quota_in_use, 60, "every quota slot in use")
            await http.post(stats_url + "/reset")
            if loss == "flushall":
                private_redis.flushall()
            else:
                private_redis.restart()
            # Three calls are still in flight at the model, on leases Redis no longer has.
            joined = await newcomer.acquire("llm:mock", "newcomer", QUOTA, 3.0)
            done_at_loss = await succeeded()
            # The quota is taken up again once the quiet window is over, and jobs go on finishing.
            await eventually(lambda: _at_least(succeeded, done_at_loss + 2 * QUOTA), 60, "jobs to finish after the loss")
            stats = (await http.get(stats_url)).json()
    finally:
        await newcomer.close()
        for w in workers:
            w.stop()
    print(f"{loss}: newcomer granted a slot: {joined}; at most {stats['max_in_flight']} calls in flight (quota {QUOTA})")
    assert not joined, "a newcomer was granted a slot while the old holders were still calling"
    assert stats["max_in_flight"] <= QUOTA, stats


async def test_a_submit_does_not_wait_for_a_ready_index_that_stopped_answering(sqlite_database_url: str) -> None:
    """A Redis that accepts connections and never answers (a partition after the connect, a frozen server): the
    job is committed and the submit returns within the hint's bound, not the socket timeout (5 s and more)."""
    silent: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        silent.append(writer)  # read nothing, answer nothing

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    settings = Settings.of(database_url=sqlite_database_url, redis_url=f"redis://127.0.0.1:{port}/0")
    try:
        async with connect("tenure.demos.examples:app", settings=settings) as client:
            began = asyncio.get_running_loop().time()
            admitted = await client.submit("echo", {"x": 1})
            took = asyncio.get_running_loop().time() - began
            assert admitted.created and (await client.job(admitted.job.id)).state is JobState.QUEUED
            assert took < 3.0, f"the submit waited {took:.1f} s for the ready index"
    finally:
        for w in silent:
            w.close()
        server.close()
        await server.wait_closed()
