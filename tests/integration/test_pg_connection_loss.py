"""PostgreSQL connections lost under a running worker: a failover, a restart, `idle_session_timeout` or a proxy
all look like `pg_terminate_backend` to the client. Every connection a store holds is re-established with
backoff, no background loop of a worker dies of it, and a worker that cannot claim does not look healthy.

Each test runs on a database of its own, so that terminating "every Tenure connection" (found by the
`application_name` each kind of connection carries) touches no other test's connections.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from tenure.app import open_backends
from tenure.contracts.states import WorkerState
from tenure.settings import Settings
from tests.acceptance.up import Up, descendants
from tests.conftest import PG_BASE
from tests.integration.procs import TTL, WorkerProc, eventually

pytestmark = pytest.mark.slow

# The application_name of each kind of connection a Tenure store holds (docs/observability.md).
KINDS = ("tenure-claim", "tenure-heartbeat", "tenure-listen", "tenure-pool")


def _admin_url(database: str) -> str:
    return PG_BASE.rsplit("/", 1)[0] + "/" + database


@pytest.fixture
async def private_database() -> AsyncIterator[str]:
    """A database of this test's own on the real server, dropped (with every connection to it) afterwards."""
    name = "t_" + uuid.uuid4().hex[:12]
    conn = await asyncpg.connect(PG_BASE)
    try:
        await conn.execute(f"CREATE DATABASE {name}")
    finally:
        await conn.close()
    try:
        yield name
    finally:
        conn = await asyncpg.connect(PG_BASE)
        try:
            await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        finally:
            await conn.close()


async def _terminate(database: str, kinds: tuple[str, ...]) -> int:
    """Terminate every backend of `database` whose application_name is one of `kinds`; how many there were."""
    conn = await asyncpg.connect(PG_BASE)
    try:
        rows = await conn.fetch(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = $1 AND application_name = ANY($2::text[]) AND pid <> pg_backend_pid()",
            database,
            list(kinds),
        )
    finally:
        await conn.close()
    return len(rows)


async def _allow_connections(database: str, allow: bool) -> None:
    conn = await asyncpg.connect(PG_BASE)
    try:
        await conn.execute(f"ALTER DATABASE {database} ALLOW_CONNECTIONS {'true' if allow else 'false'}")
    finally:
        await conn.close()


async def test_a_worker_claims_again_after_its_claim_connection_was_terminated(
    private_database: str, tmp_path: Path
) -> None:
    url = _admin_url(private_database)
    backends = await open_backends(Settings.of(database_url=url))
    store = backends.jobs
    worker = WorkerProc(url, tmp_path, "w1", concurrency=2)
    try:
        from tenure.control.admission import Admission, JobRequest
        from tenure.demos.examples import app

        admission = Admission(store, app.specs())

        async def run_one(n: int) -> None:
            job_id = (await admission.admit(JobRequest("echo", {"n": n}))).job.id

            async def done() -> bool:
                job = await store.get_job(job_id)
                return job is not None and job.state.value == "succeeded"

            await eventually(done, 15, f"job {n} to succeed\n{worker.log()}")

        await run_one(0)
        for n in range(1, 4):
            assert await _terminate(private_database, ("tenure-claim",)) >= 1, "no claim connection to terminate"
            await run_one(n)
        assert worker.proc.poll() is None, worker.log()
    finally:
        worker.stop()
        await backends.close()


async def test_a_worker_that_cannot_claim_is_degraded_until_it_can_claim_again(
    private_database: str, tmp_path: Path
) -> None:
    url = _admin_url(private_database)
    backends = await open_backends(Settings.of(database_url=url))
    store = backends.jobs
    worker = WorkerProc(url, tmp_path, "w1", concurrency=2)
    try:

        async def registered() -> str | None:
            ws = await store.list_workers()
            return ws[0].id if ws and ws[0].state is WorkerState.ACTIVE else None

        worker_id = await eventually(registered, 15, "the worker to register")
        # The claim connection dies and cannot come back; the pool's open connections still carry heartbeats.
        await _allow_connections(private_database, False)
        try:
            assert await _terminate(private_database, ("tenure-claim",)) >= 1

            async def degraded() -> bool:
                (w,) = [w for w in await store.list_workers() if w.id == worker_id]
                return w.state is WorkerState.DEGRADED

            await eventually(degraded, 10, f"the worker to report degraded\n{worker.log()}")
        finally:
            await _allow_connections(private_database, True)

        async def active() -> bool:
            (w,) = [w for w in await store.list_workers() if w.id == worker_id]
            return w.state is WorkerState.ACTIVE

        await eventually(active, 15, f"the worker to be active again\n{worker.log()}")
        assert worker.proc.poll() is None, worker.log()
    finally:
        worker.stop()
        await backends.close()


async def test_jobs_flow_through_repeated_backend_terminations_and_no_worker_dies(
    private_database: str, tmp_path: Path
) -> None:
    """Terminate each kind of Tenure connection (claim, LISTEN, pooled) every 0.3-1.2 s for 20 s while 60 jobs
    flow through the gateway: every job ends terminal within the claim bound after the terminations stop, and
    no worker process dies (the supervisor would restart it under a new id)."""
    url = _admin_url(private_database)
    up = Up(url, tmp_path, workers=2)
    rng = random.Random(17)
    hits = dict.fromkeys(KINDS, 0)
    try:
        workers_before = set(descendants(up.proc.pid))
        stop = asyncio.Event()

        async def terminator() -> None:
            while not stop.is_set():
                await asyncio.sleep(rng.uniform(0.3, 1.2))
                kind = rng.choice(KINDS)
                hits[kind] += await _terminate(private_database, (kind,))

        async def submit(client: httpx.AsyncClient, n: int) -> str:
            # A client that retries a refused admission with the same idempotency key (the documented way).
            key = f"job-{n}"
            for _ in range(200):
                try:
                    r = await client.post(
                        "/v1/jobs",
                        json={"agent": "sleep", "input": {"seconds": 0.2}},
                        headers=up.headers() | {"Idempotency-Key": key},
                    )
                except httpx.HTTPError:
                    r = None
                if r is not None and r.status_code in (200, 201):
                    return str(r.json()["id"])
                await asyncio.sleep(0.1)
            raise AssertionError(f"job {n} was never admitted")

        async with httpx.AsyncClient(base_url=up.url, timeout=10) as client:
            task = asyncio.create_task(terminator())
            began = time.monotonic()
            ids = []
            for n in range(60):
                ids.append(await submit(client, n))
                await asyncio.sleep(max(0.0, began + (n + 1) / 3 - time.monotonic()))  # ~20 s of submits
            stop.set()
            await task

            async def all_terminal() -> bool:
                for job_id in ids:
                    try:
                        r = await client.get(f"/v1/jobs/{job_id}", headers=up.headers())
                    except httpx.HTTPError:
                        return False
                    if r.status_code != 200 or r.json()["state"] not in ("succeeded", "failed", "lost", "dead"):
                        return False
                return True

            # The claim bound: a job claimed by a connection that died is released after its TTL, then claimed.
            await eventually(all_terminal, TTL * 4 + 15, f"every job to end\n{up.log()}")
        assert all(hits[k] >= 3 for k in KINDS), f"each kind of connection must be terminated: {hits}"
        assert up.proc.poll() is None, up.log()
        alive = {p for p in workers_before if _alive(p)}
        assert alive == workers_before, f"a worker process died during the terminations\n{up.log()}"
        assert "restarting" not in up.log(), up.log()
    finally:
        up.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_statement_queued_behind_a_lock_is_bounded_and_the_store_works_once_it_is_released(
    private_database: str,
) -> None:
    """A reply that never comes (a silent network, a statement queued behind another session's lock) ends after
    `TENURE_PG_COMMAND_TIMEOUT_S` as `StoreUnavailable`, on the pool and on the claim connection alike, instead of
    holding the worker's loops until TCP gives up; the connections it timed out on are replaced, so the same store
    answers again once the lock is gone."""
    from tenure.backends.postgres import PostgresStore
    from tenure.contracts.errors import StoreUnavailable
    from tenure.contracts.types import JobFilter

    url = _admin_url(private_database)
    store = await PostgresStore.connect(url, command_timeout_s=0.5)
    locker = await asyncpg.connect(url)
    try:
        await store.migrate()
        tx = locker.transaction()
        await tx.start()
        await locker.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
        async with asyncio.timeout(30):  # unbounded statements would wait here until the lock is released
            with pytest.raises(StoreUnavailable, match="TimeoutError"):
                await store.list_jobs(JobFilter(limit=1))  # a pool connection
            with pytest.raises(StoreUnavailable, match="TimeoutError"):
                await store.claim("w1", ["echo"], [], 1, 5.0)  # the claim connection
        await tx.rollback()
        assert await store.list_jobs(JobFilter(limit=1)) == []
        assert await store.claim("w1", ["echo"], [], 1, 5.0) == []
    finally:
        await locker.close()
        await store.close()
