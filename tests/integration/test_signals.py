"""Live hints over Redis pub/sub (backends/signals.py) with TENURE_REDIS_URL set: events and control commands
reach other processes' stores through Redis, PostgreSQL sends no NOTIFY for them, and a subscriber that lost
Redis polls until it has resubscribed — against a private redis-server that the tests kill and restart."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from tenure.app import open_backends
from tenure.backends.redis import RedisChannel
from tenure.contracts.errors import LeasesUnavailable
from tenure.contracts.states import JobState
from tenure.contracts.store import Backends, Signals, Store
from tenure.contracts.types import ControlOutcome, EventNotice, Start, new_id
from tenure.local import connect
from tenure.settings import Settings
from tests.conftest import PG_BASE
from tests.contract.test_store import submit
from tests.integration.procs import WorkerProc, eventually
from tests.integration.redisproc import RedisProc


@pytest.fixture
async def stores(database_url: str, private_redis: RedisProc) -> AsyncIterator[tuple[Backends, Backends]]:
    """Two stores on one database and one Redis, as two processes would have: a writer and a reader."""
    settings = Settings.of(
        database_url=database_url, redis_url=private_redis.url, redis_prefix=f"tenure-test:{uuid.uuid4().hex}:"
    )
    writer = await open_backends(settings)
    reader = await open_backends(settings, migrate=False)
    try:
        yield writer, reader
    finally:
        await reader.close()
        await writer.close()


async def subscribed_events(signals: Signals) -> None:
    """Until the reader's subscription is in place: only a subscribed feed answers a short wait with nothing
    (an unsubscribed one answers "anything may have changed")."""
    async with asyncio.timeout(10):
        while await signals.wait_for_events(0.2) != []:
            pass


async def subscribed_control(signals: Signals) -> None:
    async with asyncio.timeout(10):
        while await signals.wait_for_control(0.2) != frozenset():
            pass


async def started_job(store: Store) -> str:
    job_id = await submit(store, "echo", {"x": 1})
    [claim] = await store.claim("w1", ["echo"], [], 1, 30)
    [started] = await store.start("w1", [Start(claim.fence, new_id())])
    assert started.fence.job_id == job_id
    return job_id


async def hinted_events(signals: Signals, job_id: str, within_s: float = 5) -> list[EventNotice]:
    seen: list[EventNotice] = []
    async with asyncio.timeout(within_s):
        while True:
            notices = await signals.wait_for_events(within_s)
            seen += notices
            if any(n.job_ids is not None and job_id in n.job_ids for n in notices):
                return seen


async def test_event_hints_travel_over_redis_to_another_store(stores: tuple[Backends, Backends]) -> None:
    writer, reader = stores
    await subscribed_events(reader.signals)
    job_id = await started_job(writer.jobs)  # execution.started: a history that grew
    notices = await hinted_events(reader.signals, job_id)
    assert all(not n.events for n in notices), "hints carry job ids; readers go to the history"
    assert [e.type for e in await reader.jobs.read_events(job_id, None, 10)] == ["execution.started"]


async def test_control_hints_travel_over_redis_to_the_owners_store(stores: tuple[Backends, Backends]) -> None:
    writer, reader = stores
    job_id = await started_job(writer.jobs)
    await subscribed_control(reader.signals)
    assert await writer.jobs.cancel(job_id) is ControlOutcome.REQUESTED
    async with asyncio.timeout(5):
        while not (hint := await reader.signals.wait_for_control(5)):
            pass
    assert job_id in hint
    cancels, _ = await reader.jobs.control_state([job_id])
    assert cancels == {job_id}
    assert await writer.jobs.send_command(job_id, None, "input", '{"text": "hi"}') is ControlOutcome.REQUESTED
    async with asyncio.timeout(5):
        while not (hint := await reader.signals.wait_for_control(5)):
            pass
    assert hint == {job_id}


async def test_events_are_notified_only_without_redis_and_while_a_listener_holds_its_lease(
    pg_database_url: str, private_redis: RedisProc
) -> None:
    # NOTIFY is database-wide: other tests' stores notify too, so only bodies naming our jobs count.
    listener = await asyncpg.connect(PG_BASE)
    bodies: list[str] = []
    await listener.add_listener("tenure_events", lambda *args: bodies.append(args[-1]))
    try:
        with_redis = await open_backends(
            Settings.of(
                database_url=pg_database_url, redis_url=private_redis.url, redis_prefix=f"tenure-test:{uuid.uuid4().hex}:"
            )
        )
        try:
            await subscribed_events(with_redis.signals)
            quiet = await started_job(with_redis.jobs)
            await hinted_events(with_redis.signals, quiet)  # the hint went over Redis instead
            also_quiet = await submit(with_redis.jobs, "echo", {"x": 2})
            [(_, started)] = await with_redis.jobs.claim_and_start("w1", ["echo"], [], 1, 30)  # the claim connection
            assert started.fence.job_id == also_quiet
            await hinted_events(with_redis.signals, also_quiet)
            await asyncio.sleep(0.5)
        finally:
            await with_redis.close()
        without = await open_backends(Settings.of(database_url=pg_database_url), migrate=False)
        try:
            # Nobody streams events yet: no NOTIFY either (writers notify only while a listener holds a lease).
            unheard = await started_job(without.jobs)
            await asyncio.sleep(0.5)
            assert not any(unheard in b for b in bodies), "a NOTIFY with no event listener registered"
            await without.signals.wait_for_events(0.1)  # listens, and takes its lease in event_listeners
            loud = await started_job(without.jobs)

            async def notified() -> bool:
                return any(loud in b for b in bodies)

            await eventually(notified, 5, "the NOTIFY of a store without Redis")
        finally:
            await without.close()
    finally:
        await listener.close()
    assert not any(quiet in b or also_quiet in b for b in bodies), "a store with Redis configured sent a NOTIFY"


async def test_a_reader_polls_while_redis_is_down_and_resubscribes_after_it_restarts(
    stores: tuple[Backends, Backends], private_redis: RedisProc
) -> None:
    writer, reader = stores
    await subscribed_events(reader.signals)
    private_redis.kill()
    # Lost: the reader is told "anything may have changed", and again at least every second while down.
    async with asyncio.timeout(5):
        assert await reader.signals.wait_for_events(5) == [EventNotice(None)]
    for _ in range(3):
        async with asyncio.timeout(3):
            assert await reader.signals.wait_for_events(5) == [EventNotice(None)]
    private_redis.start()
    await subscribed_events(reader.signals)  # resubscribed on its own
    job_id = await started_job(writer.jobs)
    await hinted_events(reader.signals, job_id)


async def test_a_cancel_reaches_a_running_job_over_redis_long_before_a_heartbeat(
    pg_database_url: str, private_redis: RedisProc, tmp_path: Path
) -> None:
    # Heartbeats every 30 s: only the pub/sub hint can bring the cancel to the job within seconds.
    env = {
        "TENURE_REDIS_URL": private_redis.url,
        "TENURE_HEARTBEAT_S": "30",
        "TENURE_CLAIM_TTL_S": "90",
        "TENURE_POLL_S": "1",
    }
    worker = WorkerProc(pg_database_url, tmp_path, "w", env=env)
    settings = Settings.of(database_url=pg_database_url, redis_url=private_redis.url)
    try:
        async with connect("tenure.demos.examples:app", settings=settings) as client:
            job_id = (await client.submit("sleep", {"seconds": 120, "every": 10})).job.id

            async def running() -> bool:
                return (await client.job(job_id)).state is JobState.RUNNING

            await eventually(running, 30, "the job to start")
            await asyncio.sleep(1)  # the worker's control subscription is in place well before this
            assert await client.store.cancel(job_id) is ControlOutcome.REQUESTED
            job = await client.wait(job_id, timeout_s=10)
    finally:
        worker.stop()
    assert job.state is JobState.CANCELLED


async def test_an_owner_listens_for_jobs_and_commands_on_one_connection_and_recovers_from_its_loss(
    pg_database_url: str,
) -> None:
    """Without Redis a worker's store LISTENs on tenure_jobs and tenure_control over one connection (a NOTIFY
    wakes every listening backend of the database); when that backend is killed, the owner is told to check
    every job, and both wake-ups work again."""
    owner = await open_backends(Settings.of(database_url=pg_database_url))
    other_process = await open_backends(Settings.of(database_url=pg_database_url), migrate=False)
    other = other_process.jobs
    admin = await asyncpg.connect(PG_BASE)
    try:
        job_id = await started_job(other)
        await owner.signals.wait_for_jobs(0.01)
        assert await owner.signals.wait_for_control(0.01) is None  # listening from now: check what came before
        assert await owner.signals.wait_for_control(0.01) == frozenset()
        listen_pid = owner.signals._listen.connection.get_server_pid()  # type: ignore[attr-defined]
        backends = await admin.fetch(
            "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN%' AND pid = ANY($1::int[])",
            [listen_pid, owner.jobs.store._db.claim_connection.get_server_pid()],  # type: ignore[attr-defined]
        )
        assert [r["pid"] for r in backends] == [listen_pid]
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", listen_pid)
        async with asyncio.timeout(5):
            assert await owner.signals.wait_for_control(5) is None  # commands may have been missed: check them all
        # Sent around the reconnection: before the owner listens again (then the new LISTEN says "check them
        # all"), or after (then the cancel's own hint names the job) — which one depends on when the client
        # noticed the loss. Either way the owner learns of it.
        assert await other.cancel(job_id) is ControlOutcome.REQUESTED
        async with asyncio.timeout(5):
            hint = await owner.signals.wait_for_control(5)
        assert hint is None or job_id in hint, hint
        assert await other.send_command(job_id, None, "input", "{}") is ControlOutcome.REQUESTED
        async with asyncio.timeout(5):
            while not (hint := await owner.signals.wait_for_control(5)):
                pass
        assert hint == {job_id}
        await submit(other, "echo", {"wake": 1})
        started = asyncio.get_running_loop().time()
        await owner.signals.wait_for_jobs(10)
        assert asyncio.get_running_loop().time() - started < 5, "the enqueue's NOTIFY did not wake the owner"
    finally:
        await admin.close()
        await other_process.close()
        await owner.close()


@pytest.mark.timeout(30)  # the defect blocks the event loop for good: only pytest-timeout's signal ends it
async def test_a_subscription_whose_socket_timed_out_ends_instead_of_spinning_on_the_event_loop(
    private_redis: RedisProc,
) -> None:
    """A partition between a process and Redis that outlasts TCP keepalive (redis-py's defaults: 30 s idle, then
    3 probes 5 s apart) ends the subscriber's socket with ETIMEDOUT. Python makes that OSError a `TimeoutError`,
    which is `asyncio.TimeoutError`, and redis-py's pub/sub read takes it for "no message within the timeout":
    it returns None at once, every time, and `PubSub.listen()` loops without ever yielding. Seen in
    tests/integration/test_hosts.py: after a 41 s partition the worker sat at 100 % CPU with its loop blocked,
    no heartbeat, no claim. The subscription must end with `LeasesUnavailable`, so its reader resubscribes."""
    channel = RedisChannel(private_redis.url, prefix=f"tenure-test:{uuid.uuid4().hex}:")
    subscribed = asyncio.Event()
    received: list[tuple[str, str]] = []

    async def consume() -> None:
        async for message in channel.subscribe(["events"], on_subscribed=subscribed.set):
            received.append(message)

    task = asyncio.create_task(consume())
    try:
        await asyncio.wait_for(subscribed.wait(), 10)
        await channel.publish("events", "a")
        await eventually(lambda: _true(bool(received)), 5, "the first message")
        (conn,) = channel._sub_client.connection_pool._in_use_connections  # type: ignore[attr-defined]
        # What the kernel's ETIMEDOUT does to an asyncio stream: the transport's fatal error is handed to its reader.
        conn._reader.set_exception(TimeoutError(errno.ETIMEDOUT, os.strerror(errno.ETIMEDOUT)))
        # (Were the loop blocked, this wait would never return: pytest-timeout would end the test.)
        done, _ = await asyncio.wait({task}, timeout=5)
        assert task in done, "the subscription neither ended nor went on receiving"
        with pytest.raises(LeasesUnavailable, match="subscription lost"):
            task.result()
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        await channel.close()


async def _true(value: bool) -> bool:
    return value
