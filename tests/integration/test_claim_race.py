"""Claim race: many real processes, each with its own connection, claim the same jobs at the same moment,
round after round, until collisions have really been observed. Every job must have exactly one owner per
epoch and exactly one `execution.started` event, whatever the interleaving."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
from collections import Counter, defaultdict
from typing import Any

from tenure.app import open_backends
from tenure.contracts.store import Store
from tenure.contracts.types import AgentSpec, Fence, Start, new_id
from tenure.control.admission import Admission, JobRequest
from tenure.settings import Settings

PROCESSES = 6
MIN_COLLISIONS = 15  # rounds in which at least two claims on the same job overlapped in time
MAX_ROUNDS = 400


def _claimer(url: str, name: str, barrier: Any, commands: Any, results: Any) -> None:
    """One contender: per round, wait at the barrier, then claim(1) and try the start CAS — on its own
    fence if it won, on a forged stale fence if it lost (a loser must never start anything)."""

    async def run() -> None:
        backends = await open_backends(Settings.of(database_url=url), migrate=False)
        store = backends.jobs
        try:
            while (cmd := commands.get()) is not None:
                barrier.wait()
                t0 = time.monotonic()
                claims = await store.claim(name, ["echo"], [], 1, 30.0)
                t1 = time.monotonic()
                if claims:
                    c = claims[0]
                    started = await store.start(name, [Start(c.fence, new_id())])
                    results.put((cmd, name, c.fence.job_id, c.fence.epoch, c.fence.token, len(started), t0, t1))
                else:
                    forged = Fence(cmd, 1, 12345)
                    started = await store.start(name, [Start(forged, new_id())])
                    results.put((cmd, name, None, None, None, len(started), t0, t1))
        finally:
            await backends.close()

    asyncio.run(run())


async def _submit(store: Store) -> str:
    return (await Admission(store, {"echo": AgentSpec("echo")}).admit(JobRequest("echo", None))).job.id


async def test_concurrent_claims_give_each_job_one_owner_per_epoch_and_one_start(database_url: str) -> None:
    backends = await open_backends(Settings.of(database_url=database_url))
    store = backends.jobs
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    commands = [ctx.Queue() for _ in range(PROCESSES)]
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_claimer, args=(database_url, f"claimer-{i}", barrier, commands[i], results), daemon=True)
        for i in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    rows: list[tuple[Any, ...]] = []
    collisions = rounds = 0
    try:
        while collisions < MIN_COLLISIONS and rounds < MAX_ROUNDS:
            rounds += 1
            job_id = await _submit(store)
            for q in commands:
                q.put(job_id)
            batch = [await asyncio.to_thread(results.get, True, 30) for _ in range(PROCESSES)]
            rows += batch
            winners = [r for r in batch if r[2] is not None]
            assert len(winners) == 1, f"round {rounds}: {len(winners)} processes claimed job {job_id}"
            w = winners[0]
            # a collision: some loser's claim ran while the winner's was running
            if any(r[2] is None and r[6] < w[7] and w[6] < r[7] for r in batch):
                collisions += 1
    finally:
        for q in commands:
            q.put(None)
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    assert collisions >= MIN_COLLISIONS, f"only {collisions} overlapping claims in {rounds} rounds"
    owners: dict[tuple[str, int], set[str]] = defaultdict(set)
    for _, name, job_id, epoch, _, started, _, _ in rows:
        if job_id is not None:
            owners[(job_id, epoch)].add(name)
            assert started == 1  # the winner's own start CAS matches
        else:
            assert started == 0  # a forged fence never starts anything
    assert all(len(v) == 1 for v in owners.values())
    assert len(owners) == rounds
    starts: Counter[str] = Counter()
    for job_id, _ in owners:
        events = await store.read_events(job_id, None, 100)
        starts[job_id] = sum(1 for e in events if e.type == "execution.started")
        job = await store.get_job(job_id)
        assert job is not None and job.epoch == 1 and job.owner in owners[(job_id, 1)]
    assert set(starts.values()) == {1}
    await backends.close()
