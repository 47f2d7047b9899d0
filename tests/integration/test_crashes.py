"""Crashes are SIGKILL and freezes are SIGSTOP, on real `tenure worker` processes and real databases.

- killed before start → the claim is released and re-claimed with epoch + 1 within TTL + a sweep;
- killed after start  → the job is `lost`, never run twice by the runtime;
- frozen before start, reclaimed, resumed → its start CAS and every later write match nothing;
- frozen after start, declared lost, resumed → its appends and finish match nothing;
- SIGTERM drains: unstarted claims released at once, running jobs finish.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tenure.contracts.states import JobState
from tenure.contracts.types import Job
from tenure.local import LocalClient, connect
from tests.integration.procs import SWEEP, TTL, WorkerProc, eventually

pytestmark = pytest.mark.slow


@pytest.fixture
async def client(database_url: str) -> AsyncIterator[LocalClient]:
    async with connect("tenure.demos.examples:app", database_url) as c:
        yield c


@pytest.fixture
def workers(database_url: str, tmp_path: Path) -> Iterator[list[WorkerProc]]:
    started: list[WorkerProc] = []
    yield started
    for w in started:
        w.stop()


def spawn(workers: list[WorkerProc], database_url: str, tmp_path: Path, name: str, **kw: object) -> WorkerProc:
    w = WorkerProc(database_url, tmp_path, name, **kw)  # type: ignore[arg-type]
    workers.append(w)
    return w


async def owner_of(client: LocalClient, job_id: str, pid: int) -> Job | None:
    job = await client.job(job_id)
    return job if job.owner is not None and f":{pid}:" in job.owner else None


async def test_worker_killed_before_start_loses_its_claim_to_another_with_epoch_plus_one(
    client: LocalClient, workers: list[WorkerProc], database_url: str, tmp_path: Path
) -> None:
    a = spawn(
        workers, database_url, tmp_path, "a", env={"TENURE_FAULTS": "after_claim=sleep:60", "TENURE_CLAIM_MODE": "two_step"}
    )
    job_id = (await client.submit("echo", {"hello": 1})).job.id
    claimed = await eventually(lambda: owner_of(client, job_id, a.pid), 20, "worker a to claim the job")
    assert claimed.state is JobState.QUEUED and claimed.epoch == 1 and claimed.execution_started_at is None
    spawn(workers, database_url, tmp_path, "b")
    await asyncio.sleep(0.5)
    assert (await client.job(job_id)).epoch == 1  # b must not take a job that is still claimed
    a.signal(signal.SIGKILL)
    killed_at = time.time()
    job = await eventually(lambda: _terminal(client, job_id), TTL + SWEEP + 15, "the job to be re-claimed and finished")
    assert job.state is JobState.SUCCEEDED and job.epoch == 2, a.log()
    assert job.execution_started_at is not None
    # Released when the claim expired (a's last renewal + TTL) plus one sweep; b's pickup adds a poll at most.
    assert job.execution_started_at - killed_at <= TTL + SWEEP + 3.0
    executions = await client.store.list_executions(job_id)
    assert [(e.epoch, e.outcome) for e in executions] == [(2, "succeeded")]
    events = await client.events(job_id)
    assert [(e.epoch, e.type) for e in events] == [(2, "execution.started"), (2, "job.succeeded")]


async def _terminal(client: LocalClient, job_id: str) -> Job | None:
    job = await client.job(job_id)
    return job if job.state.terminal else None


async def test_worker_killed_after_start_leaves_the_job_lost_and_never_runs_it_again(
    client: LocalClient, workers: list[WorkerProc], database_url: str, tmp_path: Path
) -> None:
    counter = tmp_path / "counter"
    a = spawn(workers, database_url, tmp_path, "a")
    job_id = (await client.submit("crash_after_effect", {"counter": str(counter), "seconds": 60})).job.id

    async def effect_recorded() -> bool:
        # the effect happened (counter file) and its event is durable in the history
        return counter.exists() and "effect" in [e.type for e in await client.events(job_id)]

    await eventually(effect_recorded, 20, "the side effect and its event")
    spawn(workers, database_url, tmp_path, "b")
    a.signal(signal.SIGKILL)
    job = await eventually(lambda: _terminal(client, job_id), TTL + SWEEP + 15, "the job to be declared lost")
    assert job.state is JobState.LOST and job.error_code == "owner_lost"
    await asyncio.sleep(TTL + 2 * SWEEP)
    assert counter.read_text() == "1"  # the runtime never ran it a second time
    assert (await client.job(job_id)).state is JobState.LOST
    assert [e.outcome for e in await client.store.list_executions(job_id)] == ["lost"]
    assert [e.type for e in await client.events(job_id)] == ["execution.started", "effect", "job.lost"]


async def test_a_worker_frozen_before_start_and_resumed_after_a_reclaim_writes_nothing(
    client: LocalClient, workers: list[WorkerProc], database_url: str, tmp_path: Path
) -> None:
    a = spawn(
        workers, database_url, tmp_path, "a", env={"TENURE_FAULTS": "after_claim=stop", "TENURE_CLAIM_MODE": "two_step"}
    )
    job_id = (await client.submit("sleep", {"seconds": 0.3, "every": 0.05})).job.id
    await eventually(lambda: owner_of(client, job_id, a.pid), 20, "worker a to claim (and freeze)")
    b = spawn(workers, database_url, tmp_path, "b")
    job = await eventually(lambda: _terminal(client, job_id), TTL + SWEEP + 15, "b to run the job")
    assert job.state is JobState.SUCCEEDED and job.epoch == 2, b.log()
    before = [e.to_dict() for e in await client.events(job_id)]
    a.signal(signal.SIGCONT)  # the zombie wakes with its epoch-1 claim and tries its start CAS
    await eventually(lambda: _logged(a, "matched no row"), 10, "a to notice its start matched nothing")
    await asyncio.sleep(1.0)  # give it heartbeats and every chance to write
    assert [e.to_dict() for e in await client.events(job_id)] == before
    assert {e.epoch for e in await client.events(job_id)} == {2}
    assert [(e.epoch, e.outcome) for e in await client.store.list_executions(job_id)] == [(2, "succeeded")]
    assert (await client.job(job_id)).state is JobState.SUCCEEDED


async def _logged(w: WorkerProc, text: str) -> bool:
    return text in w.log()


async def test_a_worker_frozen_after_start_and_resumed_after_being_declared_lost_writes_nothing(
    client: LocalClient, workers: list[WorkerProc], database_url: str, tmp_path: Path
) -> None:
    a = spawn(workers, database_url, tmp_path, "a", env={"TENURE_FAULTS": "after_start=stop"})
    job_id = (await client.submit("sleep", {"seconds": 2, "every": 0.05})).job.id
    await eventually(lambda: owner_of(client, job_id, a.pid), 20, "worker a to start (and freeze)")
    spawn(workers, database_url, tmp_path, "b")  # its sweeper declares the frozen owner's job lost
    job = await eventually(lambda: _terminal(client, job_id), TTL + SWEEP + 15, "the job to be lost")
    assert job.state is JobState.LOST
    a.signal(signal.SIGCONT)  # the zombie resumes mid-handler: emits, then tries to finish
    await eventually(lambda: _logged(a, "ownership lost"), 10, "a to learn it lost the job")
    await asyncio.sleep(1.0)
    events = await client.events(job_id)
    assert [(e.cursor, e.type) for e in events] == [("1-1", "execution.started"), ("1-2", "job.lost")]
    assert (await client.job(job_id)).state is JobState.LOST
    assert [e.outcome for e in await client.store.list_executions(job_id)] == ["lost"]


async def test_sigterm_releases_unstarted_claims_at_once_and_lets_running_jobs_finish(
    client: LocalClient, workers: list[WorkerProc], database_url: str, tmp_path: Path
) -> None:
    a = spawn(
        workers,
        database_url,
        tmp_path,
        "a",
        concurrency=2,
        env={"TENURE_FAULTS": "after_claim@echo=sleep:60", "TENURE_CLAIM_MODE": "two_step"},
    )
    long_id = (await client.submit("sleep", {"seconds": 2.5, "every": 0.5})).job.id
    await eventually(lambda: _running(client, long_id), 20, "the long job to start")
    short_id = (await client.submit("echo", {"x": 1})).job.id
    await eventually(lambda: owner_of(client, short_id, a.pid), 20, "a to claim (and park) the short job")
    a.signal(signal.SIGTERM)
    released = await eventually(lambda: _unowned(client, short_id), 3, "the unstarted claim to be released")
    assert released.state is JobState.QUEUED and released.execution_started_at is None
    assert not (await client.job(long_id)).state.terminal  # released while the long job still runs
    assert await asyncio.to_thread(a.wait, 20) == 0, a.log()
    assert (await client.job(long_id)).state is JobState.SUCCEEDED
    spawn(workers, database_url, tmp_path, "b")
    job = await eventually(lambda: _terminal(client, short_id), 20, "b to run the released job")
    assert job.state is JobState.SUCCEEDED and job.epoch == 2
    gone = {w.pid: w.state.value for w in await client.workers(include_gone=True)}
    assert gone[a.pid] == "gone"


async def test_a_cancel_in_the_pre_start_window_stops_the_start_and_the_job_ends_cancelled(
    client: LocalClient, workers: list[WorkerProc], database_url: str, tmp_path: Path
) -> None:
    """A cancel that arrives while a job is claimed but not yet started: the start CAS refuses it, the job
    ends cancelled with no execution.started, and the worker goes on to run the next job."""
    a = spawn(
        workers, database_url, tmp_path, "a", env={"TENURE_FAULTS": "after_claim=sleep:3", "TENURE_CLAIM_MODE": "two_step"}
    )
    job_id = (await client.submit("echo", {"x": 1})).job.id
    claimed = await eventually(lambda: owner_of(client, job_id, a.pid), 20, "worker a to claim the job")
    assert claimed.state is JobState.QUEUED and claimed.execution_started_at is None
    outcome = await client.store.cancel(job_id)
    assert outcome.value in ("accepted", "requested")
    job = await eventually(lambda: _terminal(client, job_id), 20, "the job to end")
    await asyncio.sleep(3.5)  # past the parked start: it must not have run meanwhile
    job = await client.job(job_id)
    assert job.state is JobState.CANCELLED, job
    assert job.execution_started_at is None and job.owner is None
    types = [e.type for e in await client.events(job_id)]
    assert "execution.started" not in types and types[-1] == "job.cancelled", types
    assert await client.store.list_executions(job_id) == []
    nxt = (await client.submit("echo", {"x": 2})).job.id
    assert (await eventually(lambda: _terminal(client, nxt), 20, "the next job")).state is JobState.SUCCEEDED
    assert a.proc.poll() is None, a.log()


async def _running(client: LocalClient, job_id: str) -> bool:
    return (await client.job(job_id)).state is JobState.RUNNING


async def _unowned(client: LocalClient, job_id: str) -> Job | None:
    job = await client.job(job_id)
    return job if job.owner is None else None


async def test_a_worker_frozen_past_its_claim_ttl_mid_job_takes_no_further_step_of_it_when_resumed(
    workers: list[WorkerProc], database_url: str, tmp_path: Path
) -> None:
    """Found by the chaos run (bench/chaos.py, seed 1616, PostgreSQL + Redis: 11 `effect` jobs whose side effect
    ran up to 1.5 s after the sweeper had declared them lost): a worker frozen past its claim TTL while a handler
    sleeps, resumed after its job was declared lost, ran the handler's next step — its side effect — before its
    heartbeat learnt that it had lost the job. No heartbeat got through for a whole TTL: it must stop first."""
    counter = tmp_path / "counter"
    app = "tests.apps.late_effect_app:app"
    async with connect(app, database_url) as client:
        a = spawn(workers, database_url, tmp_path, "a", app=app)
        job_id = await client.submit("late_effect", {"seconds": TTL, "counter": str(counter)})

        async def waiting() -> bool:
            return "waiting" in [e.type for e in await client.events(job_id)]

        await eventually(waiting, 20, "the handler to start waiting")
        a.signal(signal.SIGSTOP)
        spawn(workers, database_url, tmp_path, "b", app=app)  # its sweeper declares the frozen owner's job lost
        job = await eventually(lambda: _terminal(client, job_id), TTL + SWEEP + 15, "the job to be lost")
        assert job.state is JobState.LOST
        a.signal(signal.SIGCONT)  # the handler's sleep is over: its next line is the side effect
        await eventually(lambda: _logged(a, "ownership"), 10, "a to learn that it lost the job")
        await asyncio.sleep(1.0)
    assert not counter.exists(), f"the resumed zombie performed the side effect of a lost job\n{a.log()}"
    assert a.proc.poll() is None, a.log()
