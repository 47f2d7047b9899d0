"""The Store contract: one suite, run against SQLite and PostgreSQL (real databases, no mocks).

Every conditional update is checked from both sides: the write that should match does, and the write that
carries a stale fence (epoch, token, execution) matches no row and changes nothing."""

from __future__ import annotations

import asyncio
import json

import pytest

from tenure.contracts.errors import IdempotencyConflict, IllegalTransition, NotFound
from tenure.contracts.states import JobState, WorkerState
from tenure.contracts.store import Backends, LeaseRef, Store
from tenure.contracts.types import (
    AgentSpec,
    Claim,
    ControlOutcome,
    Fence,
    Finish,
    JobFilter,
    NewEvent,
    Start,
    WorkerInfo,
    new_id,
)
from tenure.control.admission import Admission, JobRequest
from tenure.control.gate import CircuitOpen, GateConfig, QueueFull

AGENTS = {
    "echo": AgentSpec("echo"),
    "gpu": AgentSpec("gpu", requires=frozenset({"gpu"})),
    "safe": AgentSpec("safe", retry_safe=True, max_attempts=2),
}
W1, W2 = "worker-1", "worker-2"
TTL = 30.0


def admission(store: Store) -> Admission:
    return Admission(store, AGENTS)


async def submit(store: Store, agent: str = "echo", input: object = None, **kw: object) -> str:
    return (await admission(store).admit(JobRequest(agent, input, **kw))).job.id  # type: ignore[arg-type]


async def claim_one(
    store: Store, worker: str = W1, ttl: float = TTL, agents: tuple[str, ...] = ("echo", "safe"), caps: tuple[str, ...] = ()
) -> Claim:
    claims = await store.claim(worker, agents, caps, 1, ttl)
    assert len(claims) == 1
    return claims[0]


async def start_one(store: Store, claim: Claim, worker: str = W1) -> str:
    execution_id = new_id()
    started = await store.start(worker, [Start(claim.fence, execution_id)])
    assert [s.fence for s in started] == [claim.fence]
    return execution_id


def finish(
    fence: Fence,
    execution_id: str,
    state: JobState = JobState.SUCCEEDED,
    seq: int = 2,
    result: object = None,
    delay: float = 0.0,
) -> Finish:
    return Finish(fence, execution_id, 0.0, state, seq, json.dumps(result), None, None, delay)


async def test_migrate_is_idempotent_and_reports_the_version(store: Store) -> None:
    # Each dialect numbers its own migrations (PostgreSQL has three SQLite does not need: 0003_signals, and
    # 0004_lease_lines and 0005_hand_over_expiry, whose functions SQLite runs as Python in one transaction).
    # audit 0004 / 0007, broker 0005 / 0008, scheduling 0006 / 0009, state index 0007 / 0010,
    # tenant retention 0008 / 0011, coordinators 0009 / 0012, state pages 0010 (SQLite only), routing 0011 / 0013,
    # ready per agent 0012 / 0018, the enqueue planned once per session 0014, the gate's bounded counts
    # 0015, the gate's read that never scans the table 0016 and the poll that serves the line 0017 (PostgreSQL
    # only: SQLite's statements live in queries.sql and leases.py)
    latest = {"sqlite": 12, "postgres": 18}[store.dialect]
    assert await store.schema_version() == latest
    assert await store.migrate() == latest
    assert await store.schema_version() == latest


async def test_server_time_is_the_database_clock(store: Store) -> None:
    import time

    assert abs(await store.server_time() - time.time()) < 5


async def test_enqueued_job_reads_back_queued_and_unowned(store: Store) -> None:
    job_id = await submit(store, input={"x": [1, "é"]}, priority=7)
    job = await store.get_job(job_id)
    assert job is not None
    assert (job.state, job.owner, job.epoch, job.attempts, job.priority) == (JobState.QUEUED, None, 0, 0, 7)
    assert job.input == {"x": [1, "é"]}
    assert job.deadline is not None and job.deadline > job.created_at
    assert await store.get_job(new_id()) is None
    assert await store.get_job(job_id, tenant="someone-else") is None


async def test_list_jobs_filters_and_pages_newest_first(store: Store) -> None:
    ids = [await submit(store, input=i) for i in range(5)]
    jobs = await store.list_jobs(JobFilter(limit=3))
    assert [j.id for j in jobs] == ids[::-1][:3]
    page2 = await store.list_jobs(JobFilter(limit=3, before=jobs[-1].id))
    assert [j.id for j in page2] == ids[::-1][3:]
    assert await store.list_jobs(JobFilter(state=JobState.DEAD)) == []
    assert len(await store.list_jobs(JobFilter(agent="echo", state=JobState.QUEUED))) == 5


async def test_same_idempotency_key_and_request_returns_the_original_job(store: Store) -> None:
    a = await admission(store).admit(JobRequest("echo", {"a": 1}, idempotency_key="k"))
    b = await admission(store).admit(JobRequest("echo", {"a": 1}, idempotency_key="k"))
    assert a.created and not b.created and a.job.id == b.job.id
    assert len(await store.list_jobs(JobFilter())) == 1


async def test_enqueue_answers_the_job_as_inserted_and_a_replay_with_the_existing_job(store: Store) -> None:
    new = admission(store).build(JobRequest("echo", {"a": [1, "é"]}, priority=3, idempotency_key="k"))
    (first,) = await store.enqueue([new])
    assert first.created and first.job_id == new.id
    assert first.job == await store.get_job(new.id)  # the row as the store holds it: no read needed
    assert (first.job.state, first.job.input, first.job.priority, first.job.epoch) == (
        JobState.QUEUED,
        {"a": [1, "é"]},
        3,
        0,
    )
    again = admission(store).build(JobRequest("echo", {"a": [1, "é"]}, priority=3, idempotency_key="k"))
    plain = admission(store).build(JobRequest("echo", None))
    replay, other = await store.enqueue([again, plain])
    assert not replay.created and replay.job == first.job
    assert other.created and other.job == await store.get_job(plain.id)


async def test_same_idempotency_key_with_another_request_is_a_conflict(store: Store) -> None:
    first = await submit(store, input={"a": 1}, idempotency_key="k")
    with pytest.raises(IdempotencyConflict) as info:
        await submit(store, input={"a": 2}, idempotency_key="k")
    assert info.value.existing_job_id == first
    assert len(await store.list_jobs(JobFilter())) == 1


async def test_idempotency_keys_never_cross_tenants(store: Store) -> None:
    a = await submit(store, input=1, idempotency_key="k", tenant="a")
    b = await submit(store, input=2, idempotency_key="k", tenant="b")
    assert a != b


async def test_claim_takes_each_job_once_with_epoch_one(store: Store) -> None:
    ids = [await submit(store) for _ in range(3)]
    claims = await store.claim(W1, ["echo"], [], 10, TTL)
    assert sorted(c.fence.job_id for c in claims) == sorted(ids)
    assert {c.fence.epoch for c in claims} == {1}
    assert await store.claim(W2, ["echo"], [], 10, TTL) == []
    job = await store.get_job(ids[0])
    assert job is not None and job.owner == W1 and job.state is JobState.QUEUED and job.claimed_at is not None


async def test_claim_respects_limit_priority_agents_and_capabilities(store: Store) -> None:
    low = await submit(store, priority=0)
    high = await submit(store, priority=9)
    gpu = await submit(store, "gpu")
    (first,) = await store.claim(W1, ["echo", "gpu"], [], 1, TTL)
    assert first.fence.job_id == high
    assert [c.fence.job_id for c in await store.claim(W1, ["gpu"], [], 5, TTL)] == []  # lacks the tag
    assert [c.fence.job_id for c in await store.claim(W1, ["gpu"], ["gpu", "x"], 5, TTL)] == [gpu]
    assert [c.fence.job_id for c in await store.claim(W1, ["echo"], [], 5, TTL)] == [low]


@pytest.mark.parametrize("together", [False, True], ids=["claim", "claim_and_start"])
async def test_a_category_wildcard_offers_its_subcategories_and_nothing_else(store: Store, together: bool) -> None:
    # `text/*` offers text/summarize and text/translate; not image/ocr, not the flat tag `text`, and a flat tag
    # only as written. Both claim statements apply the rule (docs/routing.md, contracts/profile.offers).
    async def claim(caps: list[str]) -> list[str]:
        if together:
            return [c.fence.job_id for c, _ in await store.claim_and_start(W1, ["echo"], caps, 10, TTL)]
        return [c.fence.job_id for c in await store.claim(W1, ["echo"], caps, 10, TTL)]

    summarize = await submit(store, requires=["text/summarize"])
    both = await submit(store, requires=["text/translate", "gpu"])
    ocr = await submit(store, requires=["image/ocr"])
    flat = await submit(store, requires=["text"])
    assert await claim(["image/*x", "text/summarise", "gpu"]) == []
    assert await claim(["text/*"]) == [summarize]
    assert await claim(["text/*", "gpu"]) == [both]
    assert await claim(["image/ocr", "text/*"]) == [ocr]
    assert await claim(["text/*", "image/*"]) == []  # the flat tag `text` is not the category
    assert await claim(["text"]) == [flat]


@pytest.mark.parametrize("together", [False, True], ids=["claim", "claim_and_start"])
async def test_a_worker_of_several_agents_claims_in_one_order_across_them(store: Store, together: bool) -> None:
    # SQLite reads the head of each agent's ready index and merges them (backends/sqlite/_claims.py): the merged
    # order must be the one order of the queue (priority, tenant turn, age), and a worker of more agents than
    # it reads one by one (PER_AGENT_MAX) reads the whole queue's head instead, with the same answer.
    async def claim(agents: list[str], limit: int) -> list[str]:
        if together:
            return [c.fence.job_id for c, _ in await store.claim_and_start(W1, agents, ["gpu"], limit, TTL)]
        return [c.fence.job_id for c in await store.claim(W1, agents, ["gpu"], limit, TTL)]

    a0 = await submit(store, "echo")
    b5 = await submit(store, "gpu", priority=5)
    a5 = await submit(store, "echo", priority=5)
    b0 = await submit(store, "gpu")
    s0 = await submit(store, "safe")
    # One at a time: a claim's rows come back in no particular order, its choice is the order.
    assert [await claim(["gpu", "echo"], 1) for _ in range(3)] == [[b5], [a5], [a0]]
    many = [f"agent-{i}" for i in range(20)] + ["gpu", "safe"]
    assert [await claim(many, 1) for _ in range(3)] == [[b0], [s0], []]


async def test_claim_and_start_runs_each_claimable_job_once_in_one_step(store: Store) -> None:
    low = await submit(store, priority=0)
    high = await submit(store, priority=9)
    taken = await submit(store)
    (other,) = await store.claim(W2, ["echo"], [], 1, TTL)  # owned by W2: not claimable
    assert other.fence.job_id == high
    await submit(store, "gpu")  # lacks the capability
    pairs = await store.claim_and_start(W1, ["echo", "gpu"], [], 1, TTL)
    assert [c.fence.job_id for c, _ in pairs] == [low]
    pairs += await store.claim_and_start(W1, ["echo", "gpu"], [], 5, TTL)
    assert sorted(c.fence.job_id for c, _ in pairs) == sorted([low, taken])
    assert await store.claim_and_start(W1, ["echo", "gpu"], [], 5, TTL) == []
    for claim, started in pairs:
        assert claim.fence == started.fence and claim.fence.epoch == 1
        assert claim.attempts == 0 and started.attempt == 1 and claim.agent == "echo"
        job = await store.get_job(claim.fence.job_id)
        assert job is not None and job.state is JobState.RUNNING and job.owner == W1
        assert job.execution_id == started.execution_id and job.execution_started_at is not None
        events = await store.read_events(claim.fence.job_id, None, 10)
        assert [(e.type, e.epoch, e.seq, e.execution_id) for e in events] == [
            ("execution.started", 1, 1, started.execution_id)
        ]
        # The fence it returns is the one every later write must carry.
        assert await store.finish(W1, [finish(started.fence, started.execution_id)]) == [claim.fence.job_id]
    # W2's claim is untouched: still claimed, unstarted, and its own start CAS still matches.
    assert [s.fence for s in await store.start(W2, [Start(other.fence, new_id())])] == [other.fence]


async def test_finish_and_claim_is_the_finish_cas_then_claim_and_start(store: Store) -> None:
    """Each half keeps its own conditions: a stale finish matches nothing and the claim still happens; a finish
    that matches is written with its event and record whatever the claim finds (here: nothing at first)."""
    await submit(store)
    [(claim, started)] = await store.claim_and_start(W1, ["echo"], [], 1, TTL)
    f = claim.fence
    stale = finish(Fence(f.job_id, f.epoch, f.token + 1), started.execution_id)
    assert await store.finish_and_claim(W1, [stale], ["echo"], [], 5, TTL) == ([], [])
    nxt = await submit(store)
    done, pairs = await store.finish_and_claim(W1, [finish(f, started.execution_id, result={"n": 1})], ["echo"], [], 5, TTL)
    assert done == [f.job_id] and [c.fence.job_id for c, _ in pairs] == [nxt]
    job = await store.get_job(f.job_id)
    assert job is not None and job.state is JobState.SUCCEEDED and job.result == {"n": 1}
    assert [e.type for e in await store.read_events(f.job_id, None, 10)] == ["execution.started", "job.succeeded"]
    (record,) = await store.list_executions(f.job_id)
    assert record.outcome == "succeeded"
    (c2, s2) = pairs[0]
    running = await store.get_job(nxt)
    assert running is not None and running.state is JobState.RUNNING and running.execution_id == s2.execution_id
    assert [e.type for e in await store.read_events(nxt, None, 10)] == ["execution.started"]
    # No finishes: the plain claim; no free slot: the plain finish.
    assert await store.finish_and_claim(W1, [], ["echo"], [], 5, TTL) == ([], [])
    assert await store.finish_and_claim(W1, [finish(c2.fence, s2.execution_id)], ["echo"], [], 0, TTL) == ([nxt], [])


async def test_claim_skips_jobs_past_their_deadline(store: Store) -> None:
    await submit(store, deadline_s=0.05)
    await asyncio.sleep(0.15)
    assert await store.claim(W1, ["echo"], [], 5, TTL) == []


async def test_start_cas_needs_owner_epoch_and_token(store: Store) -> None:
    await submit(store)
    claim = await claim_one(store)
    f = claim.fence
    stale = [Fence(f.job_id, f.epoch, f.token + 1), Fence(f.job_id, f.epoch + 1, f.token)]
    assert await store.start(W1, [Start(s, new_id()) for s in stale[:1]]) == []
    assert await store.start(W1, [Start(stale[1], new_id())]) == []
    assert await store.start(W2, [Start(f, new_id())]) == []  # not the owner
    execution_id = new_id()
    (started,) = await store.start(W1, [Start(f, execution_id)])
    assert started.attempt == 1 and started.execution_id == execution_id
    assert await store.start(W1, [Start(f, new_id())]) == []  # only once
    job = await store.get_job(f.job_id)
    assert job is not None and job.state is JobState.RUNNING and job.execution_id == execution_id
    events = await store.read_events(f.job_id, None, 10)
    assert [(e.epoch, e.seq, e.type) for e in events] == [(1, 1, "execution.started")]


async def test_finish_cas_needs_its_execution_and_appends_the_terminal_event(store: Store) -> None:
    await submit(store)
    claim = await claim_one(store)
    execution_id = await start_one(store, claim)
    f = claim.fence
    assert await store.finish(W1, [finish(Fence(f.job_id, f.epoch, f.token + 1), execution_id)]) == []
    assert await store.finish(W1, [finish(f, new_id())]) == []
    assert await store.finish(W1, [finish(f, execution_id, result={"ok": True})]) == [f.job_id]
    assert await store.finish(W1, [finish(f, execution_id)]) == []  # a second finish matches nothing
    job = await store.get_job(f.job_id)
    assert job is not None and job.state is JobState.SUCCEEDED and job.result == {"ok": True}
    assert job.owner is None and job.finished_at is not None
    events = await store.read_events(f.job_id, None, 10)
    assert [e.type for e in events] == ["execution.started", "job.succeeded"]
    (record,) = await store.list_executions(f.job_id)
    assert (record.id, record.epoch, record.worker_id, record.outcome) == (execution_id, 1, W1, "succeeded")


async def test_fenced_append_writes_only_while_the_fence_owns_a_running_job(store: Store) -> None:
    await submit(store)
    claim = await claim_one(store)
    f = claim.fence
    early = NewEvent(f, new_id(), 2, "early", "{}")
    assert await store.append_events([early]) == {f.job_id}  # claimed, not started: nothing is written
    execution_id = await start_one(store, claim)
    good = [NewEvent(f, execution_id, seq, "message.delta", json.dumps({"i": seq})) for seq in (2, 3, 4)]
    assert await store.append_events(good) == set()
    assert await store.append_events(good[:1]) == set()  # a retried append is idempotent
    stale = NewEvent(Fence(f.job_id, f.epoch, f.token + 1), execution_id, 5, "stale", "{}")
    assert await store.append_events([stale]) == {f.job_id}
    await store.finish(W1, [finish(f, execution_id, seq=5)])
    assert await store.append_events([NewEvent(f, execution_id, 6, "late", "{}")]) == {f.job_id}
    events = await store.read_events(f.job_id, None, 100)
    assert [e.type for e in events] == ["execution.started"] + ["message.delta"] * 3 + ["job.succeeded"]
    assert [e.seq for e in events] == [1, 2, 3, 4, 5]
    assert [e.cursor for e in await store.read_events(f.job_id, (1, 3), 100)] == ["1-4", "1-5"]


async def test_released_claim_is_claimable_again_with_a_higher_epoch(store: Store) -> None:
    job_id = await submit(store)
    claim = await claim_one(store)
    assert await store.release_claims(W2, [claim.fence]) == []  # only the owner releases
    assert await store.release_claims(W1, [claim.fence]) == [job_id]
    again = await claim_one(store, W2)
    assert again.fence.job_id == job_id and again.fence.epoch == 2 and again.fence.token != claim.fence.token
    assert await store.start(W1, [Start(claim.fence, new_id())]) == []  # the old claim is dead


async def test_retryable_failure_goes_scheduled_then_back_to_the_queue(store: Store) -> None:
    job_id = await submit(store)
    claim = await claim_one(store)
    execution_id = await start_one(store, claim)
    retry = Finish(claim.fence, execution_id, 0.0, JobState.SCHEDULED, 2, None, "error", "boom", 0.05)
    assert await store.finish(W1, [retry]) == [job_id]
    job = await store.get_job(job_id)
    assert job is not None and job.state is JobState.SCHEDULED and job.next_attempt_at is not None
    assert job.owner is None and job.execution_id is None and job.error_message == "boom"
    assert await store.claim(W1, ["echo"], [], 5, TTL) == []
    await asyncio.sleep(0.1)
    report = await store.sweep(60)
    assert report.due == [job_id]
    second = await claim_one(store)
    assert second.fence.epoch == 2 and second.attempts == 1
    execution_2 = await start_one(store, second)
    assert await store.finish(W1, [finish(second.fence, execution_2)]) == [job_id]
    types = [(e.epoch, e.type) for e in await store.read_events(job_id, None, 10)]
    assert types == [(1, "execution.started"), (1, "execution.retrying"), (2, "execution.started"), (2, "job.succeeded")]
    assert [e.outcome for e in await store.list_executions(job_id)] == ["failed", "succeeded"]


async def test_heartbeat_renews_held_claims_and_reports_the_lost(store: Store) -> None:
    await store.register_worker(WorkerInfo(W1, "h", 1, 2, ("echo",)))
    a, b = await submit(store), await submit(store)
    claims = await store.claim(W1, ["echo"], [], 2, 0.3)
    fences = [c.fence for c in claims]
    stale = Fence(fences[1].job_id, fences[1].epoch, fences[1].token + 1)
    reply = await store.heartbeat(W1, WorkerState.ACTIVE, 0, [fences[0], stale], TTL)
    assert reply.renewed == {fences[0].job_id} and reply.lost([fences[0], stale]) == [stale]
    await asyncio.sleep(0.4)
    report = await store.sweep(60)
    assert report.released == [fences[1].job_id]  # expired and not renewed
    assert {a, b} == {f.job_id for f in fences}


async def test_sweeper_releases_expired_unstarted_claims_and_loses_expired_running_ones(store: Store) -> None:
    waiting, running = await submit(store), await submit(store)
    c1 = await claim_one(store, ttl=0.2)
    c2 = await claim_one(store, ttl=0.2)
    by_job = {c1.fence.job_id: c1, c2.fence.job_id: c2}
    execution_id = await start_one(store, by_job[running])
    await asyncio.sleep(0.35)
    report = await store.sweep(60)
    assert report.released == [waiting] and report.lost == [running]
    lost = await store.get_job(running)
    assert lost is not None and lost.state is JobState.LOST and lost.error_code == "owner_lost"
    assert [e.type for e in await store.read_events(running, None, 10)] == ["execution.started", "job.lost"]
    (record,) = await store.list_executions(running)
    assert (record.id, record.outcome) == (execution_id, "lost")
    # the zombie's writes all match nothing
    f = by_job[running].fence
    assert await store.append_events([NewEvent(f, execution_id, 2, "late", "{}")]) == {running}
    assert await store.finish(W1, [finish(f, execution_id)]) == []
    assert (await claim_one(store, W2)).fence.epoch == 2  # the released one, epoch + 1


async def test_a_lost_retry_safe_job_is_queued_again_until_attempts_run_out(store: Store) -> None:
    job_id = await submit(store, "safe")
    for attempt in (1, 2):
        claim = await claim_one(store, ttl=0.2)
        assert claim.fence.epoch == attempt
        await start_one(store, claim)
        await asyncio.sleep(0.3)
        report = await store.sweep(60)
        assert (report.requeued if attempt == 1 else report.dead) == [job_id]
    job = await store.get_job(job_id)
    assert job is not None and job.state is JobState.DEAD and job.attempts == 2
    assert [e.type for e in await store.read_events(job_id, None, 10)] == [
        "execution.started",
        "execution.lost",
        "execution.started",
        "job.dead",
    ]


async def test_queued_jobs_past_their_deadline_expire(store: Store) -> None:
    job_id = await submit(store, deadline_s=0.05)
    await asyncio.sleep(0.15)
    assert (await store.sweep(60)).expired == [job_id]
    job = await store.get_job(job_id)
    assert job is not None and job.state is JobState.EXPIRED
    assert [e.type for e in await store.read_events(job_id, None, 10)] == ["job.expired"]


async def test_silent_workers_are_marked_gone(store: Store) -> None:
    await store.register_worker(WorkerInfo(W1, "h", 1, 2, ("echo",)))
    await store.register_worker(WorkerInfo(W2, "h", 2, 2, ("echo",)))
    await asyncio.sleep(0.3)
    await store.heartbeat(W2, WorkerState.ACTIVE, 0, [], TTL)
    assert (await store.sweep(0.2)).workers_gone == [W1]
    assert [w.id for w in await store.list_workers()] == [W2]
    assert {w.id: w.state for w in await store.list_workers(include_gone=True)} == {
        W1: WorkerState.GONE,
        W2: WorkerState.ACTIVE,
    }


async def test_list_workers_shows_the_jobs_each_holds(store: Store) -> None:
    await store.register_worker(WorkerInfo(W1, "host-a", 42, 3, ("echo",), ("gpu",)))
    job_id = await submit(store)
    await claim_one(store)
    (w,) = await store.list_workers()
    assert (w.id, w.host, w.pid, w.concurrency, w.capabilities, w.jobs_held) == (W1, "host-a", 42, 3, ("gpu",), (job_id,))


async def test_requeue_puts_a_dead_job_back_and_refuses_the_others(store: Store) -> None:
    job_id = await submit(store, max_attempts=1)
    claim = await claim_one(store)
    execution_id = await start_one(store, claim)
    await store.finish(W1, [Finish(claim.fence, execution_id, 0.0, JobState.DEAD, 2, None, "error", "x")])
    job = await store.requeue(job_id)
    assert (job.state, job.attempts, job.owner, job.error_code) == (JobState.QUEUED, 0, None, None)
    again = await claim_one(store)
    assert again.fence.epoch == 2
    with pytest.raises(IllegalTransition):
        await store.requeue(job_id)  # queued (owned), not finished
    with pytest.raises(NotFound):
        await store.requeue(new_id())


async def test_leases_admit_up_to_the_limit_idempotently(backends: Backends) -> None:
    from tenure.contracts.store import Leases

    leases = backends.leases  # the store's own leases table
    assert isinstance(leases, Leases)
    assert await leases.acquire("k", "a", 2, TTL)
    assert await leases.acquire("k", "a", 2, TTL)  # the same holder again: still one slot
    assert await leases.acquire("k", "b", 2, TTL)
    assert not await leases.acquire("k", "c", 2, TTL)
    assert await leases.holders("k") == ["a", "b"]
    await leases.release("k", "a")
    await leases.release("k", "a")
    assert await leases.acquire("k", "c", 2, TTL)
    assert await leases.renew([LeaseRef("k", "b"), LeaseRef("k", "zz")], TTL) == [LeaseRef("k", "zz")]


async def test_an_expired_lease_is_lost_and_its_slot_reused(backends: Backends) -> None:
    leases = backends.leases
    assert await leases.acquire("k", "a", 1, 0.2)
    await asyncio.sleep(0.3)
    assert await leases.renew([LeaseRef("k", "a")], TTL) == [LeaseRef("k", "a")]
    assert await leases.acquire("k", "b", 1, TTL)
    assert await leases.holders("k") == ["b"]


async def test_wait_for_jobs_wakes_on_a_new_job(store: Store, backends: Backends) -> None:
    signals = backends.signals
    await signals.wait_for_jobs(0.01)  # arm the listener / poller
    waiter = asyncio.create_task(signals.wait_for_jobs(5.0))
    await asyncio.sleep(0.1)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await submit(store)
    await asyncio.wait_for(waiter, 5.0)
    assert loop.time() - t0 < 2.0


async def test_heartbeat_reports_a_cancel_request_only_when_there_is_one(store: Store) -> None:
    await store.register_worker(WorkerInfo(W1, "h", 1, 1, ("echo",)))
    await submit(store)
    claim = await claim_one(store)
    reply = await store.heartbeat(W1, WorkerState.ACTIVE, 0, [claim.fence], TTL)
    assert reply.renewed == {claim.fence.job_id} and reply.cancel_requested == frozenset()
    await start_one(store, claim)
    reply = await store.heartbeat(W1, WorkerState.ACTIVE, 1, [claim.fence], TTL)
    assert reply.renewed == {claim.fence.job_id} and reply.cancel_requested == frozenset()


# -- the gateway's side ------------------------------------------------------------------------------------------------
async def test_queue_depth_counts_queued_and_scheduled_jobs_per_tenant(store: Store) -> None:
    assert await store.queue_depth("a") == (0, 0)
    await submit(store, tenant="a")
    await submit(store, tenant="a")
    await submit(store, tenant="b")
    assert await store.queue_depth("a") == (3, 2)
    claim = await claim_one(store)
    execution_id = await start_one(store, claim)  # running: no longer waiting to start
    assert (await store.queue_depth("a"))[0] == 2
    await store.finish(W1, [finish(claim.fence, execution_id, JobState.SCHEDULED, delay=60)])
    assert (await store.queue_depth("a"))[0] == 3  # scheduled for a retry: waiting again


async def test_circuit_opens_after_threshold_failures_and_counts_timeouts_on_finish(store: Store) -> None:
    closed = await store.circuit_state("agent:echo", 3, 600, 60)
    assert (closed.failures, closed.open_for_s) == (0, 0.0)
    await store.record_circuit_failure("agent:echo")
    await store.record_circuit_failure("agent:echo")
    assert (await store.circuit_state("agent:echo", 3, 600, 60)).open_for_s == 0.0
    await submit(store)
    claim = await claim_one(store)
    execution_id = await start_one(store, claim)
    timeout = Finish(claim.fence, execution_id, 0.0, JobState.SCHEDULED, 2, None, "timeout", "slow", 0.0)
    assert await store.finish(W1, [timeout]) == [claim.fence.job_id]
    state = await store.circuit_state("agent:echo", 3, 600, 60)
    assert state.failures == 3 and 55 < state.open_for_s <= 60
    assert (await store.circuit_state("agent:echo", 3, 600, 0.05)).failures == 3
    await asyncio.sleep(0.1)
    assert (await store.circuit_state("agent:echo", 3, 600, 0.05)).open_for_s == 0.0  # open time elapsed
    assert (await store.circuit_state("agent:other", 3, 600, 60)).failures == 0


async def test_admission_state_reads_the_queue_depth_and_the_circuit_together(store: Store) -> None:
    empty = await store.admission_state("a", "agent:echo", 2, 600, 60)
    assert (empty.queued, empty.queued_tenant, empty.circuit) == (0, 0, await store.circuit_state("agent:echo", 2, 600, 60))
    await submit(store, tenant="a")
    await submit(store, tenant="b")
    await store.record_circuit_failure("agent:echo")
    state = await store.admission_state("a", "agent:echo", 2, 600, 60)
    assert (state.queued, state.queued_tenant) == await store.queue_depth("a") == (2, 1)
    assert state.circuit.failures == 1 and state.circuit.open_for_s == 0.0
    await store.record_circuit_failure("agent:echo")
    state = await store.admission_state("b", "agent:echo", 2, 600, 60)
    assert (state.queued, state.queued_tenant) == (2, 1)
    assert state.circuit.failures == 2 and 55 < state.circuit.open_for_s <= 60
    assert (await store.admission_state("c", "agent:other", 2, 600, 60)).circuit.failures == 0
    assert (await store.admission_state("c", "agent:echo", 2, 600, 60)).queued_tenant == 0


async def test_the_gates_counts_stop_one_past_the_cap(store: Store) -> None:
    # A submit behind a backlog must not count the whole backlog (42 ms per read behind 100,000 queued on PostgreSQL
    # before the bound, bench/backlog.py --gate): the counts stop at the bound asked for, and the gate's is its larger
    # cap + 1; a refusal behind a backlog bigger than the cap says "more than" the cap. Unbounded, the counts are whole.
    for i in range(5):
        await submit(store, tenant="a", input={"i": i})
    await submit(store, tenant="b")
    bounded = await store.admission_state("a", "agent:echo", 2, 600, 60, upto=4)
    assert (bounded.queued, bounded.queued_tenant) == (4, 4)
    assert (await store.admission_state("b", "agent:echo", 2, 600, 60, upto=4)).queued_tenant == 1
    whole = await store.admission_state("a", "agent:echo", 2, 600, 60)
    assert (whole.queued, whole.queued_tenant) == (6, 5)
    gated = Admission(store, AGENTS, gate=GateConfig(max_queued=3, max_queued_per_tenant=100))
    ask = gated.gate.ask({("c", "echo"): 2})  # the bound the enqueue is given: the larger cap + 1, whatever is asked
    assert ask is not None and ask.count_upto == 101
    with pytest.raises(QueueFull, match=r"^more than 3 jobs are waiting to start; the limit is 3$"):
        await gated.admit(JobRequest("echo", 1, tenant="c"))
    with pytest.raises(QueueFull, match=r"^more than 3 jobs are waiting to start; the limit is 3 \(a batch of 2"):
        await gated.admit_many([JobRequest("echo", 2, tenant="c"), JobRequest("safe", 3, tenant="c")])
    per_tenant = Admission(store, AGENTS, gate=GateConfig(max_queued=100, max_queued_per_tenant=4))
    with pytest.raises(QueueFull, match=r"^tenant 'a' has more than 4 jobs waiting to start; the limit is 4$"):
        await per_tenant.admit(JobRequest("echo", 4, tenant="a", concurrency_key="k"))  # keyed: its own path
    assert (await store.queue_depth("c"))[1] == 0


async def test_the_enqueue_makes_the_gates_read_and_refuses_past_a_cap_writing_nothing(store: Store) -> None:
    # Gate.ask hands the read to the enqueue (PostgreSQL: tenure_enqueue's own guard, then the gate's rule on the
    # state it read; SQLite: the rule inside the write transaction). At the cap exactly a job is admitted, one more
    # is refused; a guard that refused one early (>= for >) makes the rule disagree and fails this.
    gated = Admission(store, AGENTS, gate=GateConfig(max_queued=3, max_queued_per_tenant=2))

    async def waiting() -> int:
        return (await store.queue_depth("a"))[0]

    await gated.admit(JobRequest("echo", 1, tenant="a"))
    await gated.admit(JobRequest("echo", 2, tenant="a"))  # the tenant's cap, exactly
    with pytest.raises(QueueFull, match="tenant 'a' has 2 jobs waiting to start; the limit is 2"):
        await gated.admit(JobRequest("echo", 3, tenant="a"))
    with pytest.raises(QueueFull, match="tenant 'a' has 2"):  # keyed: the enqueue's other path, the same rule
        await gated.admit(JobRequest("echo", 4, tenant="a", concurrency_key="thread-1"))
    await gated.admit(JobRequest("echo", 5, tenant="b"))  # the global cap, exactly
    with pytest.raises(QueueFull, match="3 jobs are waiting to start; the limit is 3"):
        await gated.admit(JobRequest("echo", 6, tenant="c"))
    assert await waiting() == 3
    claim = await claim_one(store)
    await start_one(store, claim)
    await gated.admit(JobRequest("echo", 7, tenant="c"))  # room again: a job started
    assert await waiting() == 3

    await store.record_circuit_failure("agent:safe")
    breaker = Admission(store, AGENTS, gate=GateConfig(max_queued=100, max_queued_per_tenant=100, breaker_threshold=2))
    await breaker.admit(JobRequest("safe", 1, tenant="d"))  # one failure of two: closed
    await store.record_circuit_failure("agent:safe")
    with pytest.raises(CircuitOpen, match="agent 'safe' timed out 2 times"):
        await breaker.admit(JobRequest("safe", 2, tenant="d"))
    with pytest.raises(CircuitOpen):
        await breaker.admit(JobRequest("safe", 3, tenant="d", concurrency_key="k"))
    await breaker.admit(JobRequest("echo", 4, tenant="d"))  # another agent's circuit
    assert (await store.queue_depth("d"))[1] == 2


async def test_the_gates_observer_is_told_of_every_admission_whichever_side_decided(store: Store) -> None:
    # The gateway's circuit and capacity metrics come from the observer: told on an admission the store's SQL let
    # through (PostgreSQL never calls the rule then) as on a refusal.
    seen: list[tuple[str, str, bool]] = []
    gated = Admission(store, AGENTS, gate=GateConfig(breaker_threshold=1), on_gate=lambda *a: seen.append(a))
    await gated.admit(JobRequest("echo", 1, tenant="a"))
    assert seen == [("a", "agent:echo", False)]
    await store.record_circuit_failure("agent:echo")
    with pytest.raises(CircuitOpen):
        await gated.admit(JobRequest("echo", 2, tenant="a"))
    assert seen[-1] == ("a", "agent:echo", True)


async def test_cancel_answers_by_the_jobs_state(store: Store) -> None:
    queued = await submit(store, tenant="a")
    assert await store.cancel(queued, tenant="b") is ControlOutcome.UNKNOWN  # another tenant's job
    assert await store.cancel(new_id()) is ControlOutcome.UNKNOWN
    assert await store.cancel(queued, tenant="a") is ControlOutcome.ACCEPTED  # unowned: cancelled at once
    job = await store.get_job(queued)
    assert job is not None and job.state is JobState.CANCELLED and job.cancel_requested_at is not None
    assert [(e.epoch, e.seq, e.type) for e in await store.read_events(queued, None, 10)] == [(0, 1, "job.cancelled")]
    assert await store.cancel(queued) is ControlOutcome.ALREADY_FINISHED
    assert await store.claim(W1, ["echo"], [], 5, TTL) == []

    await store.register_worker(WorkerInfo(W1, "h", 1, 1, ("echo",)))
    running = await submit(store)
    claim = await claim_one(store)
    execution_id = await start_one(store, claim)
    assert await store.cancel(running) is ControlOutcome.REQUESTED
    assert await store.cancel(running) is ControlOutcome.REQUESTED  # harmless twice
    job = await store.get_job(running)
    assert job is not None and job.state is JobState.RUNNING  # the owner decides when it stops
    reply = await store.heartbeat(W1, WorkerState.ACTIVE, 1, [claim.fence], TTL)
    assert reply.cancel_requested == {running}
    await store.finish(W1, [finish(claim.fence, execution_id, JobState.CANCELLED)])
    assert await store.cancel(running) is ControlOutcome.ALREADY_FINISHED


async def test_commands_are_persisted_in_order_only_for_unfinished_jobs(store: Store) -> None:
    job_id = await submit(store, tenant="a")
    assert await store.send_command(job_id, "b", "input", "1") is ControlOutcome.UNKNOWN
    assert await store.send_command(job_id, "a", "input", json.dumps({"text": "hi"})) is ControlOutcome.REQUESTED
    assert await store.send_command(job_id, None, "approve", json.dumps({"approved": True})) is (ControlOutcome.REQUESTED)
    commands = await store.read_commands(job_id, 0)
    assert [(c.seq, c.kind, c.payload) for c in commands] == [
        (1, "input", {"text": "hi"}),
        (2, "approve", {"approved": True}),
    ]
    assert [c.seq for c in await store.read_commands(job_id, 1)] == [2]
    await store.cancel(job_id)
    assert await store.send_command(job_id, None, "input", "2") is ControlOutcome.ALREADY_FINISHED
    assert len(await store.read_commands(job_id, 0)) == 2


async def test_set_waiting_is_fenced_and_appends_its_event(store: Store) -> None:
    job_id = await submit(store)
    claim = await claim_one(store)
    execution_id = await start_one(store, claim)
    f = claim.fence
    stale = Fence(f.job_id, f.epoch, f.token + 1)
    assert not await store.set_waiting(NewEvent(stale, execution_id, 2, "job.waiting", "{}"), True)
    assert await store.set_waiting(NewEvent(f, execution_id, 2, "job.waiting", '{"for": "input"}'), True)
    job = await store.get_job(job_id)
    assert job is not None and job.state is JobState.WAITING
    assert not await store.set_waiting(NewEvent(f, execution_id, 3, "job.waiting", "{}"), True)  # already
    assert await store.append_events([NewEvent(f, execution_id, 3, "note", "{}")]) == set()  # still owned
    assert await store.set_waiting(NewEvent(f, execution_id, 4, "job.resumed", "{}"), False)
    job = await store.get_job(job_id)
    assert job is not None and job.state is JobState.RUNNING
    assert [e.type for e in await store.read_events(job_id, None, 10)] == [
        "execution.started",
        "job.waiting",
        "note",
        "job.resumed",
    ]


async def test_wait_for_events_tells_of_appended_events(store: Store, backends: Backends, database_url: str) -> None:
    from tenure.app import open_backends
    from tenure.settings import Settings

    signals = backends.signals
    await signals.wait_for_events(0.01)  # arm the listener / poller
    await signals.wait_for_events(0.01)
    other = await open_backends(Settings.of(database_url=database_url))
    writer = other.jobs
    try:
        job_id = await submit(writer)
        claim = await claim_one(writer)
        execution_id = await start_one(writer, claim)
        await writer.append_events([NewEvent(claim.fence, execution_id, 2, "message.delta", '{"t": "x"}')])
        # Postgres carries the append's events in its own NOTIFY (after the start's): wait for that one.
        wanted = "message.delta" if store.dialect == "postgres" else "notice"
        seen: list[object] = []
        for _ in range(50):
            for notice in await signals.wait_for_events(0.2):
                seen.extend(e.type for e in notice.events)
                if notice.job_ids is None or job_id in notice.job_ids:
                    seen.append("notice")
            if wanted in seen:
                break
        assert "notice" in seen
        if store.dialect == "postgres":  # small batches travel inside the NOTIFY
            assert "message.delta" in seen
            big = "x" * 9000
            await writer.append_events([NewEvent(claim.fence, execution_id, 3, "big", json.dumps(big))])
            notices = await signals.wait_for_events(5.0)
            assert notices and all(not n.events for n in notices)  # over the limit: a reference only
            assert any(n.job_ids is None or job_id in n.job_ids for n in notices)
    finally:
        await other.close()


async def test_read_events_many_reads_several_histories_after_their_own_cursors(store: Store) -> None:
    jobs = []
    for _ in range(2):
        await submit(store)
        claim = await claim_one(store)
        execution_id = await start_one(store, claim)
        await store.append_events([NewEvent(claim.fence, execution_id, s, "e", "{}") for s in (2, 3, 4)])
        jobs.append(claim.fence.job_id)
    a, b = jobs
    got = await store.read_events_many([(a, (1, 2)), (b, None), (new_id(), None)], 2)
    assert sorted((e.job_id, e.seq) for e in got) == sorted([(a, 3), (a, 4), (b, 1), (b, 2)])
    assert [e.seq for e in got if e.job_id == a] == [3, 4]
    assert await store.read_events_many([], 10) == []


async def test_find_idempotent_answers_only_the_tenants_own_key(store: Store) -> None:
    from tenure.control.admission import idem_digest

    a = await admission(store).admit(JobRequest("echo", 1, idempotency_key="k", tenant="a"))
    found = await store.find_idempotent("a", idem_digest("a", "k"))
    assert found is not None and found[0] == a.job.id and len(found[1]) == 32
    assert await store.find_idempotent("b", idem_digest("a", "k")) is None
    assert await store.find_idempotent("a", idem_digest("a", "other")) is None


async def test_control_hints_and_state_tell_an_owner_of_cancels_and_commands(
    store: Store, backends: Backends, database_url: str
) -> None:
    from tenure.app import open_backends
    from tenure.settings import Settings

    running = await submit(store)
    claim = await claim_one(store)
    await start_one(store, claim)
    assert await store.control_state([running]) == (frozenset(), {})
    await backends.signals.wait_for_control(0.01)  # arm the listener / poller
    gateway = await open_backends(Settings.of(database_url=database_url))  # another process's connection
    try:
        assert await gateway.jobs.send_command(running, None, "input", '"hi"') is ControlOutcome.REQUESTED
        assert await gateway.jobs.cancel(running) is ControlOutcome.REQUESTED
    finally:
        await gateway.close()
    hint: frozenset[str] | None = frozenset()
    for _ in range(50):
        hint = await backends.signals.wait_for_control(0.2)
        if hint is None or running in hint:
            break
    assert hint is None or running in hint
    assert await store.control_state([running, new_id()]) == (frozenset({running}), {running: 1})
