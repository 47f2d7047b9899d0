"""The `Signals` contract, run against every transport: SQLite (`data_version` + doorbells), PostgreSQL
(LISTEN / NOTIFY), and each of them with `TENURE_REDIS_URL` set (events and control over Redis pub/sub).

Two `Backends` on one database, as two processes would have them: a write through one wakes the matching
wait of the other. A hint is never a promise, so each check waits for a notice that names the job (or says
"anything may have changed") within a bound far below the wait's own timeout."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from tenure.app import open_backends
from tenure.contracts.store import Backends
from tenure.contracts.types import ControlOutcome, NewEvent
from tenure.settings import Settings
from tests.conftest import REDIS_URL
from tests.contract.conftest import StateLog
from tests.contract.test_store import claim_one, start_one, submit

WITHIN_S = 5.0


@pytest.fixture(params=["database", "redis"])
async def pair(
    request: pytest.FixtureRequest, database_url: str, state_log: StateLog
) -> AsyncIterator[tuple[Backends, Backends]]:
    """A writer and a reader on the backend under test, their hints over the database or over Redis."""
    settings = Settings.of(database_url=database_url)
    if request.param == "redis":
        settings = settings.replace(redis_url=REDIS_URL, redis_prefix=f"tenure-test:{uuid.uuid4().hex}:")
    writer = await open_backends(settings)
    reader = await open_backends(settings, migrate=False)
    try:
        yield writer, reader
    finally:
        await reader.close()
        await writer.close()


async def test_a_job_made_claimable_elsewhere_wakes_a_waiting_worker(pair: tuple[Backends, Backends]) -> None:
    writer, reader = pair
    await reader.signals.wait_for_jobs(0.01)  # arm the listener / poller, take note of the current version
    await reader.signals.wait_for_jobs(0.01)
    waiter = asyncio.create_task(reader.signals.wait_for_jobs(60.0))
    await asyncio.sleep(0.1)
    started = asyncio.get_running_loop().time()
    await submit(writer.jobs)
    await asyncio.wait_for(waiter, WITHIN_S)
    assert asyncio.get_running_loop().time() - started < WITHIN_S


async def test_a_history_that_grew_elsewhere_is_told_to_the_event_waiter(pair: tuple[Backends, Backends]) -> None:
    writer, reader = pair
    async with asyncio.timeout(10):  # subscribed (or listening): a quiet wait answers nothing
        while await reader.signals.wait_for_events(0.2) != []:
            pass
    job_id = await submit(writer.jobs)
    claim = await claim_one(writer.jobs)
    execution_id = await start_one(writer.jobs, claim)
    await writer.jobs.append_events([NewEvent(claim.fence, execution_id, 2, "note", "{}")])
    async with asyncio.timeout(WITHIN_S):
        while True:
            notices = await reader.signals.wait_for_events(WITHIN_S)
            if any(n.job_ids is None or job_id in n.job_ids for n in notices):
                break


async def test_a_cancel_request_sent_elsewhere_is_told_to_the_owner(pair: tuple[Backends, Backends]) -> None:
    writer, reader = pair
    job_id = await submit(reader.jobs)
    claim = await claim_one(reader.jobs)
    await start_one(reader.jobs, claim)
    async with asyncio.timeout(10):  # listening (or subscribed): a quiet wait answers an empty set
        while await reader.signals.wait_for_control(0.2) != frozenset():
            pass
    assert await writer.jobs.cancel(job_id) is ControlOutcome.REQUESTED
    async with asyncio.timeout(WITHIN_S):
        while (hint := await reader.signals.wait_for_control(WITHIN_S)) == frozenset():
            pass  # None: any job may have a command, check them all
    assert hint is None or job_id in hint
    assert await reader.jobs.control_state([job_id]) == (frozenset({job_id}), {})
