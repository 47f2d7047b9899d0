"""Concurrency keys in the store (docs/scheduling.md), on both backends: a job waiting for its key's turn is not
claimable, the turn passes at the finish (whatever the outcome), on a cancel, a sweep or a requeue, and the four
multitask strategies do what they say."""

from __future__ import annotations

import asyncio

import pytest

from tenure.contracts.errors import KeyBusy
from tenure.contracts.states import JobState, WorkerState
from tenure.contracts.store import Store
from tenure.contracts.types import AgentSpec, ControlOutcome, Finish, JobFilter
from tenure.control.admission import Admission, JobRequest
from tests.contract.test_store import W1, W2, finish, start_one

AGENTS = {
    "chat": AgentSpec("chat"),
    "pair": AgentSpec("pair", key_limit=2),
    "strict": AgentSpec("strict", multitask="reject"),
    "capped": AgentSpec("capped", max_queued=5),
}
AGENT_NAMES = tuple(AGENTS)
TTL = 30.0


async def submit(store: Store, key: str | None = "thread-1", agent: str = "chat", **kw: object) -> str:
    req = JobRequest(agent, None, concurrency_key=key, **kw)  # type: ignore[arg-type]
    return (await Admission(store, AGENTS).admit(req)).job.id


async def claim_all(store: Store, worker: str = W1, limit: int = 10) -> list[str]:
    return [c.fence.job_id for c in await store.claim(worker, AGENT_NAMES, (), limit, TTL)]


async def run_one(store: Store, worker: str = W1) -> tuple[str, Finish]:
    """Claim and start the one claimable job; the finish that would end it."""
    (claim,) = await store.claim(worker, AGENT_NAMES, (), 10, TTL)
    execution_id = await start_one(store, claim, worker)
    return claim.fence.job_id, finish(claim.fence, execution_id)


async def test_a_job_behind_its_key_is_not_claimable_until_the_holder_finishes(store: Store) -> None:
    first = await submit(store)
    second = await submit(store)
    other = await submit(store, key="thread-2")
    plain = await submit(store, key=None)
    assert (await store.get_job(second)).key_wait  # type: ignore[union-attr]
    claims = await store.claim(W1, AGENT_NAMES, (), 10, TTL)
    # Never `second`, however many are asked for.
    assert sorted(c.fence.job_id for c in claims) == sorted([first, other, plain])
    assert await claim_all(store, W2) == []
    (held,) = [c for c in claims if c.fence.job_id == first]
    execution_id = await start_one(store, held)
    assert await store.finish(W1, [finish(held.fence, execution_id)]) == [first]
    job = await store.get_job(second)
    assert job is not None and not job.key_wait
    assert await claim_all(store, W2) == [second]


@pytest.mark.parametrize("outcome", [JobState.FAILED, JobState.CANCELLED, JobState.SUCCEEDED])
async def test_the_turn_passes_whatever_the_outcome(store: Store, outcome: JobState) -> None:
    await submit(store)
    second = await submit(store)
    _, fin = await run_one(store)
    fin = Finish(fin.fence, fin.execution_id, 0.0, outcome, 2, "null", None, None, 0.0)
    await store.finish(W1, [fin])
    assert await claim_all(store, W2) == [second]


async def test_a_retry_keeps_the_turn(store: Store) -> None:
    first = await submit(store)
    second = await submit(store)
    _, fin = await run_one(store)
    retry = Finish(fin.fence, fin.execution_id, 0.0, JobState.SCHEDULED, 2, None, "boom", "x", 0.0)
    await store.finish(W1, [retry])
    await store.sweep(60.0)  # due again at once (no backoff)
    assert await claim_all(store, W2) == [first]
    assert (await store.get_job(second)).key_wait  # type: ignore[union-attr]


async def test_key_limit_lets_that_many_run(store: Store) -> None:
    ids = [await submit(store, agent="pair") for _ in range(3)]
    assert sorted(await claim_all(store)) == sorted(ids[:2])


async def test_cancelling_a_waiting_or_unstarted_holder_passes_the_turn(store: Store) -> None:
    first = await submit(store)
    second = await submit(store)
    third = await submit(store)
    assert await store.cancel(second) is ControlOutcome.ACCEPTED  # a waiter leaves the line
    assert await store.cancel(first) is ControlOutcome.ACCEPTED  # the holder, never started
    assert await claim_all(store) == [third]


async def test_a_swept_holder_frees_its_key(store: Store) -> None:
    await submit(store)
    second = await submit(store)
    (claim,) = await store.claim(W1, AGENT_NAMES, (), 10, 0.2)  # a claim that expires at once
    await start_one(store, claim)
    await asyncio.sleep(0.5)
    report = await store.sweep(60.0)
    assert report.lost == [claim.fence.job_id]
    assert second in report.due
    assert await claim_all(store, W2) == [second]


async def test_requeue_of_a_keyed_job_waits_for_its_turn(store: Store) -> None:
    first = await submit(store)
    _, fin = await run_one(store)
    await store.finish(W1, [Finish(fin.fence, fin.execution_id, 0.0, JobState.FAILED, 2, None, "x", "y", 0.0)])
    second = await submit(store)
    _, fin2 = await run_one(store, W2)  # `second` holds the key now
    job = await store.requeue(first)
    assert job.state is JobState.QUEUED and job.key_wait
    assert await claim_all(store) == []
    await store.finish(W2, [fin2])
    assert await claim_all(store) == [first]
    assert second != first


async def test_a_keyed_or_capped_job_is_written_with_its_budget(store: Store) -> None:
    # Keyed and capped jobs are enqueued under their locks, not by the plain batch insert: their budget rides too.
    holder = await submit(store, budget={"tool_calls": 3})
    waiting = await submit(store, budget={"cost": 1.5})
    capped = await submit(store, key=None, agent="capped", budget={"tokens": 100})
    plain = await submit(store)
    assert (await store.get_job(waiting)).key_wait  # type: ignore[union-attr]
    budgets = {j: await store.read_budget(j) for j in (holder, waiting, capped, plain)}
    assert {j: None if b is None else b.limits for j, b in budgets.items()} == {
        holder: {"tool_calls": 3},
        waiting: {"cost": 1.5},
        capped: {"tokens": 100},
        plain: None,
    }


async def test_requeue_of_a_keyed_job_with_an_edited_input_waits_for_its_turn(store: Store) -> None:
    first = await submit(store)
    _, fin = await run_one(store)
    await store.finish(W1, [Finish(fin.fence, fin.execution_id, 0.0, JobState.FAILED, 2, None, "x", "y", 0.0)])
    job = await store.requeue(first, input_json='{"n": 2}')  # the key is free: the turn passes to it at once
    assert job.state is JobState.QUEUED and not job.key_wait and job.input == {"n": 2}
    assert await claim_all(store) == [first]
    assert [r.kind for r in await store.read_audit(first, None, 10)] == ["requeue"]


async def test_reject_answers_the_running_job_and_writes_nothing(store: Store) -> None:
    first = await submit(store)
    await run_one(store)
    with pytest.raises(KeyBusy) as err:
        await submit(store, multitask="reject")
    assert err.value.running_job_id == first
    with pytest.raises(KeyBusy):
        await submit(store, agent="strict", key="thread-1")  # the agent's default strategy
    assert len(await store.list_jobs(JobFilter())) == 1
    free = await submit(store, key="thread-9", multitask="reject")  # a free key admits
    assert (await store.get_job(free)).key_wait is False  # type: ignore[union-attr]


async def test_interrupt_flags_the_running_job_and_takes_the_next_turn(store: Store) -> None:
    first = await submit(store)
    _, fin = await run_one(store)
    second = await submit(store, multitask="interrupt")
    reply = await store.heartbeat(W1, WorkerState.ACTIVE, 1, [fin.fence], TTL)
    assert first in reply.cancel_requested  # the cancellation protocol: the owner's heartbeat reads the flag
    assert await claim_all(store, W2) == []  # not before the interrupted one has ended
    await store.finish(W1, [Finish(fin.fence, fin.execution_id, 0.0, JobState.CANCELLED, 2, None, "cancelled", "c", 0.0)])
    assert await claim_all(store, W2) == [second]


async def test_drop_queued_replaces_the_unstarted_jobs_of_the_key(store: Store) -> None:
    first = await submit(store)
    _, fin = await run_one(store)
    queued = await submit(store)
    third = await submit(store, multitask="drop_queued")
    dropped = await store.get_job(queued)
    assert dropped is not None and dropped.state is JobState.CANCELLED and dropped.error_code == "replaced"
    assert third in (dropped.error_message or "")
    job = await store.get_job(third)
    assert job is not None and job.key_wait  # behind the running one
    await store.finish(W1, [fin])
    assert await claim_all(store, W2) == [third]
    assert first != third


async def test_drop_queued_on_an_idle_key_runs_at_once(store: Store) -> None:
    queued = await submit(store)
    new = await submit(store, multitask="drop_queued")
    assert (await store.get_job(queued)).state is JobState.CANCELLED  # type: ignore[union-attr]
    assert await claim_all(store) == [new]
