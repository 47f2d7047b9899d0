"""Duties on real worker processes: only the holder of `duty:sweeper` sweeps (and another takes the duty over
when it dies), and a job waiting for approval frees its slot so a concurrency-1 worker runs another meanwhile."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tenure.contracts.states import JobState
from tenure.local import LocalClient, connect
from tests.integration.procs import TTL, WorkerProc, eventually
from tests.integration.test_observability import metrics_url, scrape, value

pytestmark = pytest.mark.slow


@pytest.fixture
async def client(database_url: str) -> AsyncIterator[LocalClient]:
    async with connect("tenure.demos.examples:app", database_url) as c:
        yield c


@pytest.fixture
def workers() -> Iterator[list[WorkerProc]]:
    started: list[WorkerProc] = []
    yield started
    for w in started:
        w.stop()


async def _sweeps(url: str) -> float:
    return value(await scrape(url), "tenure_sweeps_total")


async def test_only_the_holder_of_the_sweeper_duty_sweeps_and_another_takes_it_when_it_dies(
    database_url: str, workers: list[WorkerProc], tmp_path: Path
) -> None:
    for name in ("a", "b", "c"):
        workers.append(WorkerProc(database_url, tmp_path, name, args=("--metrics-port", "0")))
    urls = [await metrics_url(w) for w in workers]
    await asyncio.sleep(2.0)  # ten sweep intervals
    counts = [await _sweeps(u) for u in urls]
    assert sorted(c > 0 for c in counts) == [False, False, True], counts
    holder = counts.index(max(counts))
    # The holder, and only it, exports the store's health (on SQLite, the file's size as table "(file)").
    sizes = [value(await scrape(u), "tenure_store_table_bytes") for u in urls]
    assert sizes[holder] > 0 and sum(sizes) == sizes[holder], sizes
    workers[holder].signal(signal.SIGKILL)
    others = [u for i, u in enumerate(urls) if i != holder]
    before = [await _sweeps(u) for u in others]

    async def taken_over() -> bool:
        now = [await _sweeps(u) for u in others]
        return sum(n > b for n, b in zip(now, before, strict=True)) == 1

    # The dead holder's lease runs out within one claim TTL; a survivor takes the duty at its next attempt.
    await eventually(taken_over, TTL + 5, "a surviving worker to take the sweeper duty over")
    await asyncio.sleep(1.0)
    now = [await _sweeps(u) for u in others]
    assert sum(n > b for n, b in zip(now, before, strict=True)) == 1, (before, now)


async def test_a_job_waiting_for_approval_frees_its_slot_for_another_job(
    client: LocalClient, database_url: str, workers: list[WorkerProc], tmp_path: Path
) -> None:
    workers.append(WorkerProc(database_url, tmp_path, "w", concurrency=1))
    waiting_id = (await client.submit("publish", {"title": "t"})).job.id
    await eventually(lambda: _in_state(client, waiting_id, JobState.WAITING), 20, "the job to wait for approval")
    other_id = (await client.submit("echo", {"x": 1})).job.id
    other = await eventually(lambda: _terminal(client, other_id), 20, "a second job to run on the only slot")
    assert other.state is JobState.SUCCEEDED
    assert (await client.job(waiting_id)).state is JobState.WAITING
    assert (await client.store.send_command(waiting_id, None, "approve", '{"approved": true}')).value == "requested"
    done = await eventually(lambda: _terminal(client, waiting_id), 20, "the approved job to finish")
    assert done.state is JobState.SUCCEEDED and done.result == {"published": "draft: t"}


async def _in_state(client: LocalClient, job_id: str, state: JobState) -> bool:
    return (await client.job(job_id)).state is state


async def _terminal(client: LocalClient, job_id: str) -> object:
    job = await client.job(job_id)
    return job if job.state.terminal else None
