"""The pickup path (bench/pickup.py measures it): how a job gets from submit to a running handler, and what
that path may not give up on the way.

- PostgreSQL: an enqueue commits without waiting for its WAL flush (workers see the job one fsync sooner), but
  returns only once the flush covers it; claim_and_start returns only once its own commit is flushed.
- The worker picks up jobs submitted one at a time, while a claim or a handler is in flight, without waiting
  for the poll floor.
- The worker's writer lingers (for finishes to share a commit) only while other jobs are running; on SQLite
  the next claim takes pending finishes into its own transaction instead (one commit for both)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest

from tenure.app import open_backends
from tenure.contracts.states import JobState
from tenure.contracts.store import Store
from tenure.local import connect
from tenure.settings import Settings
from tenure.worker import Worker, WorkerConfig
from tests.conftest import PG_BASE
from tests.contract.test_store import submit
from tests.integration.procs import eventually

# Far longer than any wait below: a job that has to wait for the poll floor fails the test instead.
POLL_FLOOR_S = 60.0


async def wal_position(admin: asyncpg.Connection, which: str) -> int:
    return int(await admin.fetchval(f"SELECT pg_wal_lsn_diff(pg_current_wal_{which}_lsn(), '0/0')::int8"))


async def test_an_enqueue_returns_only_once_its_commit_is_flushed(pg_database_url: str) -> None:
    """The INSERT's own commit does not wait for the flush; the barrier after it does. Without the barrier the
    flush position lags the enqueue's WAL until the WAL writer's next round (200 ms by default), so twenty
    enqueues in a row would not all find it flushed."""
    backends = await open_backends(Settings.of(database_url=pg_database_url))
    store = backends.jobs
    admin = await asyncpg.connect(PG_BASE)
    try:
        for i in range(20):
            before = await wal_position(admin, "insert")
            await submit(store, "echo", {"i": i}, idempotency_key=f"k{i}" if i % 2 else None)
            flushed = await wal_position(admin, "flush")
            # The job's heap and index records and its commit record all lie after `before`.
            assert flushed > before + 100, (i, before, flushed)
    finally:
        await admin.close()
        await backends.close()


async def test_claim_and_start_returns_only_once_its_commit_is_flushed(pg_database_url: str) -> None:
    """The claim connection commits asynchronously (a lost claim is harmless); claim_and_start turns the flush
    on for its own transaction, because a started execution must survive a crash before its handler runs."""
    backends = await open_backends(Settings.of(database_url=pg_database_url))
    store = backends.jobs
    admin = await asyncpg.connect(PG_BASE)
    try:
        for i in range(20):
            await submit(store, "echo", {"i": i})
            before = await wal_position(admin, "insert")
            [(claim, started)] = await store.claim_and_start("w1", ["echo"], [], 5, 30)
            flushed = await wal_position(admin, "flush")
            assert started.fence == claim.fence
            assert flushed > before + 100, (i, before, flushed)
    finally:
        await admin.close()
        await backends.close()


@pytest.fixture
async def running_worker(database_url: str) -> AsyncIterator[tuple[Store, Worker]]:
    backends = await open_backends(Settings.of(database_url=database_url))
    store = backends.jobs
    config = WorkerConfig(concurrency=4, heartbeat_s=1, claim_ttl_s=5, poll_s=POLL_FLOOR_S, write_linger_s=0)
    from tenure.demos.examples import app

    worker = Worker(backends, app, config)
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    try:
        yield store, worker
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)
        await backends.close()


async def test_jobs_submitted_one_at_a_time_are_picked_up_without_the_poll_floor(
    database_url: str, running_worker: tuple[Store, Worker]
) -> None:
    """Every claim here finds fewer jobs than the worker's free slots; a job that arrives while a claim or a
    handler is in flight must still wake the worker (a lost wake-up would leave it to the 60 s poll floor)."""
    store, _ = running_worker
    async with connect("tenure.demos.examples:app", database_url) as client:
        long = (await client.submit("sleep", {"seconds": 30, "every": 30})).job.id

        async def running() -> bool:
            return (await client.job(long)).state is JobState.RUNNING

        await eventually(running, 20, "the long job to start")
        for round_ in range(15):
            ids = [(await client.submit("echo", {"r": round_, "i": i})).job.id for i in range(round_ % 3 + 1)]
            for job_id in ids:
                job = await client.wait(job_id, timeout_s=20)
                assert job.state is JobState.SUCCEEDED, job
        await store.cancel(long)
        await client.wait(long, timeout_s=20)


async def test_the_writer_lingers_only_while_other_jobs_run(database_url: str) -> None:
    """A finish waits `write_linger_s` for company only if another job is still running; alone, it is written
    at once. The linger here (4 s) is far longer than any round trip, so both sides are plain to see."""
    backends = await open_backends(Settings.of(database_url=database_url))
    store = backends.jobs
    linger = 4.0
    config = WorkerConfig(concurrency=4, heartbeat_s=1, claim_ttl_s=5, poll_s=0.2, write_linger_s=linger)
    from tenure.demos.examples import app

    worker = Worker(backends, app, config)
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    try:
        async with connect("tenure.demos.examples:app", database_url) as client:
            began = time.monotonic()
            alone = await client.wait((await client.submit("echo", {"alone": True})).job.id, timeout_s=30)
            assert alone.state is JobState.SUCCEEDED
            assert time.monotonic() - began < linger, "a finish with no other job running did not linger"

            long = (await client.submit("sleep", {"seconds": 30, "every": 30})).job.id

            async def running() -> bool:
                return (await client.job(long)).state is JobState.RUNNING

            await eventually(running, 20, "the long job to start")
            await asyncio.sleep(linger + 1)  # its first progress event lingered too; let that write go first
            began = time.monotonic()
            beside = await client.wait((await client.submit("echo", {"alone": False})).job.id, timeout_s=30)
            assert beside.state is JobState.SUCCEEDED
            if store.claim_carries_finishes:
                # SQLite: the slot it freed wakes the claim loop, which takes the finish into its own transaction
                # at once instead of leaving it to the lingering writer.
                assert time.monotonic() - began < linger, "the next claim carried the finish"
            else:
                assert time.monotonic() - began >= linger, "a finish beside a running job lingers for company"
            await store.cancel(long)
            await client.wait(long, timeout_s=20)
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)
        await backends.close()
