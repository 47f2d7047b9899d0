"""One admission door: `tenure.connect(...).submit` (the Python API beside the gateway) is held to the same
queue caps and circuit breakers as `POST /v1/jobs` — `429` semantics (`QueueFull`) at `TENURE_MAX_QUEUED`,
`503` semantics (`CircuitOpen`) while an agent's circuit is open — and a refused submit writes nothing. Real
stores, SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from tenure.control.admission import JobRequest
from tenure.control.gate import CircuitOpen, QueueFull
from tenure.local import connect
from tenure.settings import Settings

IMPOSSIBLE = ["no-worker-has-this"]  # no worker runs here anyway: the jobs stay queued


async def test_a_local_submit_at_the_queue_cap_is_refused_and_writes_nothing(database_url: str) -> None:
    settings = Settings.of(database_url=database_url, max_queued=3)
    async with connect("tenure.demos.examples:app", settings=settings) as client:
        for n in range(3):
            await client.submit("echo", {"n": n}, requires=IMPOSSIBLE)
        with pytest.raises(QueueFull, match="limit is 3") as info:
            await client.submit("echo", {"n": 3})
        assert info.value.retry_after_s >= 1
        assert len(await client.jobs(limit=100)) == 3
        with pytest.raises(QueueFull):  # a batch is admitted whole or not at all
            await client.submit_many([JobRequest("echo", {"n": n}) for n in range(2)])
        assert len(await client.jobs(limit=100)) == 3


async def test_a_local_batch_that_would_pass_the_cap_is_refused_whole(database_url: str) -> None:
    settings = Settings.of(database_url=database_url, max_queued=10, max_queued_per_tenant=4)
    async with connect("tenure.demos.examples:app", settings=settings) as client:
        with pytest.raises(QueueFull, match="tenant 'default'"):
            await client.submit_many([JobRequest("echo", {"n": n}) for n in range(5)])
        assert await client.jobs(limit=100) == []
        assert len(await client.submit_many([JobRequest("echo", {"n": n}) for n in range(4)])) == 4


async def test_a_local_replay_is_answered_over_the_cap_like_the_gateways(database_url: str) -> None:
    settings = Settings.of(database_url=database_url, max_queued=1)
    async with connect("tenure.demos.examples:app", settings=settings) as client:
        first = await client.submit("echo", {"a": 1}, idempotency_key="kept")
        again = await client.submit("echo", {"a": 1}, idempotency_key="kept")
        assert _id(again) == _id(first)
        with pytest.raises(QueueFull):
            await client.submit("echo", {"a": 2})


async def test_a_local_submit_while_the_circuit_is_open_is_refused_and_writes_nothing(database_url: str) -> None:
    settings = Settings.of(database_url=database_url, breaker_threshold=2)
    async with connect("tenure.demos.examples:app", settings=settings) as client:
        for _ in range(2):
            await client.store.record_circuit_failure("agent:hang")  # what two timed-out executions write
        with pytest.raises(CircuitOpen, match="timed out 2 times") as info:
            await client.submit("hang", {})
        assert info.value.retry_after_s > 1
        assert await client.jobs(limit=100) == []
        await client.submit("echo", {})  # other agents flow
        assert len(await client.jobs(limit=100)) == 1


def _id(submitted: object) -> str:
    """The job id of a submit's answer (an id string before the one admission door, then the admitted job)."""
    return submitted if isinstance(submitted, str) else submitted.id  # type: ignore[attr-defined]
