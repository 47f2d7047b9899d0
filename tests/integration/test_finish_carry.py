"""On SQLite a worker's finishes ride with its next claim (`finish_and_claim`: one write transaction and one
fsync instead of two): the completer leaves pending finishes to a claim loop that is about to claim."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tenure
from tenure.app import open_backends
from tenure.contracts.states import JobState
from tenure.local import connect
from tenure.settings import Settings
from tenure.worker import Worker, WorkerConfig
from tests.integration.procs import eventually

app = tenure.Tenure()


@app.agent("noop")
async def noop(ctx: tenure.Context, input: dict) -> None:
    return None


def _counting(calls: Counter[str], name: str, fn: Callable[..., Any], jobs_arg: int) -> Callable[..., Any]:
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls[name] += len(args[jobs_arg])  # how many finishes went this way
        return await fn(*args, **kwargs)

    return wrapper


async def test_a_draining_worker_writes_its_finishes_with_its_next_claim(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    backends = await open_backends(Settings.of(database_url=url, max_queued=10_000))
    store = backends.jobs
    assert store.claim_carries_finishes
    finishes: Counter[str] = Counter()
    # The real store does every write; the test only counts which door each finish took.
    store.finish = _counting(finishes, "alone", store.finish, 1)  # type: ignore[method-assign]
    store.finish_and_claim = _counting(finishes, "carried", store.finish_and_claim, 1)  # type: ignore[method-assign]
    n = 300
    async with connect(app, url, settings=Settings.of(database_url=url, max_queued=10_000)) as client:
        ids = list(await client.submit_many([tenure.JobRequest("noop", {}) for _ in range(n)]))
        worker = Worker(backends, app, WorkerConfig(concurrency=10, poll_s=0.1))
        stop = asyncio.Event()
        run = asyncio.create_task(worker.run(stop))
        try:

            async def done() -> bool:
                jobs = [await client.job(i) for i in ids]
                return all(j.state is JobState.SUCCEEDED for j in jobs)

            await eventually(done, 60, "the drain to end")
        finally:
            stop.set()
            await asyncio.wait_for(run, 20)
    # Most finishes shared their claim's commit (without the hand-over: none; the completer always won).
    assert finishes["carried"] + finishes["alone"] == n, finishes
    assert finishes["carried"] >= n * 0.6, finishes
