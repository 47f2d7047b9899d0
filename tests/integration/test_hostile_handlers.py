"""Handlers that misbehave run beside ordinary jobs on one worker process: the worker lives, the ordinary jobs
succeed, and each hostile job ends failed or dead with a readable error."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tenure.contracts.states import JobState
from tenure.local import LocalClient, connect
from tests.apps import hostile_app
from tests.integration.procs import WorkerProc, eventually

pytestmark = pytest.mark.slow

APP = "tests.apps.hostile_app:app"
# Each hostile agent and a word its job's error must name.
HOSTILE = {
    "unprintable": "Unprintable",
    "sys_exit": "SystemExit",
    "keyboard_interrupt": "KeyboardInterrupt",
    "generator_exit": "GeneratorExit",
    "sync_sys_exit": "SystemExit",
    "swallows_cancellation": "longer than",
    "never_stops": "ignored its cancellation",
    "surrogate_result": "result",
    "nul_error": "ValueError",
    "surrogate_event": "surrogate",
    "nan_usage": "usage",
    "nul_result": "NUL",
}


@pytest.fixture
async def client(database_url: str) -> AsyncIterator[LocalClient]:
    async with connect(hostile_app.app, database_url) as c:
        yield c


async def test_hostile_handlers_end_their_own_jobs_and_nothing_else(
    client: LocalClient, database_url: str, tmp_path: Path
) -> None:
    assert set(HOSTILE) | {"ordinary"} == set(hostile_app.app.agents)
    worker = WorkerProc(database_url, tmp_path, "w", concurrency=20, app=APP)
    try:
        ordinary = [(await client.submit("ordinary", {"n": n, "seconds": 1.0})).job.id for n in range(4)]
        hostile = {agent: (await client.submit(agent, {})).job.id for agent in HOSTILE}
        later = [(await client.submit("ordinary", {"n": 10 + n, "seconds": 0.1})).job.id for n in range(4)]

        async def all_done() -> bool:
            jobs = [await client.job(j) for j in [*ordinary, *hostile.values(), *later]]
            return all(j.state.terminal for j in jobs)

        await eventually(all_done, 60, f"every job to end\n{worker.log()}")
        assert worker.proc.poll() is None, f"the worker died\n{worker.log()}"
        for job_id in [*ordinary, *later]:
            job = await client.job(job_id)
            assert job.state is JobState.SUCCEEDED, (job, worker.log())
        for agent, word in HOSTILE.items():
            job = await client.job(hostile[agent])
            assert job.state in (JobState.FAILED, JobState.DEAD), (agent, job)
            assert job.error_message and word in job.error_message, (agent, job.error_message)
            assert len(job.error_message) <= 10_000, (agent, len(job.error_message))
        # Still claiming after all of it.
        one_more = (await client.submit("ordinary", {"n": 99, "seconds": 0.05})).job.id
        job = await eventually(lambda: _terminal(client, one_more), 20, "a job after the hostile ones")
        assert job.state is JobState.SUCCEEDED
    finally:
        worker.stop()


async def _terminal(client: LocalClient, job_id: str) -> object:
    job = await client.job(job_id)
    return job if job.state.terminal else None
