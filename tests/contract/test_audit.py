"""The audit chain and the effect journal, against SQLite and PostgreSQL: each fenced write matches while its
fence owns the job, and a stale epoch's write matches no row and changes nothing."""

from __future__ import annotations

import asyncio
import json

from tenure.contracts.audit import AuditRecord
from tenure.contracts.states import JobState
from tenure.contracts.store import Store
from tenure.contracts.types import Fence, NewEvent
from tests.contract.test_store import claim_one, finish, start_one, submit


def record(
    f: Fence, execution_id: str, seq: int, kind: str = "tool_call", name: str = "search", **data: object
) -> AuditRecord:
    return AuditRecord(f, execution_id, seq, kind, name, json.dumps(data), 10.0, 10.5)


async def test_records_and_events_are_written_together_in_order_and_a_duplicate_is_ignored(store: Store) -> None:
    job_id = await submit(store)
    claim = await claim_one(store)
    x = await start_one(store, claim)
    f = claim.fence
    events = [NewEvent(f, x, 2, "message.delta", '{"text": "a"}')]
    records = [
        record(f, x, 1, q="a"),
        record(f, x, 2, "evidence", "notes", text="n"),
        record(f, x, 3, "usage", "m", input_tokens=3),
    ]
    assert await store.append_audit(records, events) == set()
    assert await store.append_audit(records[:1], []) == set()  # a retried batch: the duplicate is ignored
    got = await store.read_audit(job_id, None, 10)
    assert [(r.epoch, r.seq, r.kind, r.name, r.data) for r in got] == [
        (1, 1, "tool_call", "search", {"q": "a"}),
        (1, 2, "evidence", "notes", {"text": "n"}),
        (1, 3, "usage", "m", {"input_tokens": 3}),
    ]
    assert got[0].to_dict()["duration_s"] == 0.5 and got[0].execution_id == x
    assert [r.seq for r in await store.read_audit(job_id, (1, 1), 1)] == [2]  # the cursor pages
    assert [e.type for e in await store.read_events(job_id, None, 10)] == ["execution.started", "message.delta"]
    assert await store.audit_usage(job_id) == {"input_tokens": 3}


async def test_a_stale_epochs_records_and_steps_match_no_row(store: Store) -> None:
    job_id = await submit(store, "safe")
    claim = await claim_one(store, ttl=0.2)
    old = await start_one(store, claim)
    stale = claim.fence
    assert (await store.begin_step(stale, old, "one")) is not None
    await asyncio.sleep(0.3)
    assert (await store.sweep(60)).requeued == [job_id]  # retry-safe: requeued, a new attempt
    again = await claim_one(store)
    new = await start_one(store, again)
    assert again.fence.epoch == stale.epoch + 1
    # every write of the old owner matches nothing
    assert await store.append_audit([record(stale, old, 1)], [NewEvent(stale, old, 2, "late", "{}")]) == {job_id}
    assert await store.begin_step(stale, old, "two") is None
    assert await store.end_step(stale, old, "one", "1") is False
    assert await store.resolve_step(stale, "one", "1") is False
    assert await store.clear_step(stale, old, "one") is False
    assert await store.read_audit(job_id, None, 10) == []
    steps = await store.read_steps(job_id)
    assert [(s.key, s.state, s.epoch) for s in steps] == [("one", "started", 1)]
    # the new owner's writes match; its begin of the same key answers the earlier attempt's row
    assert await store.append_audit([record(again.fence, new, 1)], []) == set()
    seen = await store.begin_step(again.fence, new, "one")
    assert seen is not None and (seen.state, seen.execution_id) == ("started", old)
    assert await store.resolve_step(again.fence, "one", '"checked"') is True
    assert await store.resolve_step(again.fence, "one", '"twice"') is False  # only a started step resolves
    (one,) = await store.read_steps(job_id)
    assert (one.state, one.result, one.ended_at is not None) == ("resolved", "checked", True)


async def test_a_step_begins_once_ends_with_its_result_and_a_cleared_step_begins_again(store: Store) -> None:
    job_id = await submit(store)
    claim = await claim_one(store)
    x = await start_one(store, claim)
    f = claim.fence
    began = await store.begin_step(f, x, "fetch")
    assert began is not None and (began.key, began.state, began.execution_id, began.result) == ("fetch", "started", x, None)
    assert await store.end_step(f, x, "fetch", json.dumps({"rows": [1, 2]})) is True
    assert await store.end_step(f, x, "fetch", "3") is False  # done once
    again = await store.begin_step(f, x, "fetch")
    assert again is not None and (again.state, again.result) == ("done", {"rows": [1, 2]})
    assert await store.begin_step(f, x, "flaky") is not None
    assert await store.clear_step(f, x, "flaky") is True
    assert [s.key for s in await store.read_steps(job_id)] == ["fetch"]
    assert (await store.begin_step(f, x, "flaky")) is not None
    # the journal and the audit outlive the finish: they are the job's, not the execution's
    assert await store.finish("worker-1", [finish(f, x)]) == [job_id]
    assert await store.end_step(f, x, "flaky", "1") is False  # a finished job takes no more writes
    job = await store.get_job(job_id)
    assert job is not None and job.state is JobState.SUCCEEDED
    assert [s.key for s in await store.read_steps(job_id)] == ["fetch", "flaky"]


async def test_reads_of_an_unknown_job_are_empty(store: Store) -> None:
    for job_id in ("0190d5a0-0000-7000-8000-000000000000", "not-a-uuid"):
        assert await store.read_audit(job_id, None, 10) == []
        assert await store.read_steps(job_id) == []
        assert await store.audit_usage(job_id) == {}


async def test_a_budget_is_written_with_its_job_and_read_with_what_was_used(store: Store) -> None:
    plain = await submit(store)
    assert await store.read_budget(plain) is None  # no budget, no row
    job_id = await submit(store, "safe", budget={"tool_calls": 7, "cost": 1.5})
    claim = await claim_one(store, agents=("safe",))
    x = await start_one(store, claim)
    f = claim.fence
    usage = [record(f, x, 2, "usage", "m", input_tokens=30, output_tokens=5, cost_usd=0.25)]
    assert await store.append_audit([record(f, x, 1), *usage, record(f, x, 3)], []) == set()
    use = await store.read_budget(job_id)
    assert use is not None and use.limits == {"tool_calls": 7, "cost": 1.5}
    assert {k: use.used[k] for k in ("tool_calls", "tokens", "cost")} == {"tool_calls": 2, "tokens": 35, "cost": 0.25}
    assert use.used["wall_s"] == 0  # no execution has ended yet
    assert await store.finish("worker-1", [finish(f, x)]) == [job_id]
    ended = await store.read_budget(job_id)
    assert ended is not None and ended.used["wall_s"] >= 0


async def test_a_requeue_with_an_edited_input_records_the_edit_and_keeps_the_earlier_audit(store: Store) -> None:
    job_id = await submit(store, input={"n": 1})
    claim = await claim_one(store)
    x = await start_one(store, claim)
    assert await store.append_audit([record(claim.fence, x, 1)], []) == set()
    assert await store.finish("worker-1", [finish(claim.fence, x, JobState.FAILED)]) == [job_id]
    job = await store.requeue(job_id, None, '{"n":2}')
    assert (job.state, job.input) == (JobState.QUEUED, {"n": 2})
    records = await store.read_audit(job_id, None, 10)
    assert [(r.epoch, r.seq, r.kind) for r in records] == [(1, 1, "tool_call"), (1, 2, "requeue")]
    assert records[1].to_dict()["previous_input"] == {"n": 1} and records[1].execution_id is None
    assert records[1].data == {"previous_input": {"n": 1}, "input": {"n": 2}}
    assert (await store.read_events(job_id, None, 10))[-1].payload == {"input_edited": True}
    again = await claim_one(store)
    assert (again.fence.epoch, json.loads(again.input_json)) == (2, {"n": 2})
    # a requeue without an edit changes neither the input nor the audit
    x2 = await start_one(store, again)
    assert await store.finish("worker-1", [finish(again.fence, x2, JobState.FAILED)]) == [job_id]
    assert (await store.requeue(job_id)).input == {"n": 2}
    assert len(await store.read_audit(job_id, None, 10)) == 2
    assert (await store.read_events(job_id, None, 10))[-1].payload == {}


async def test_retention_purges_old_finished_jobs_in_batches_and_never_a_live_one(store: Store) -> None:
    finished = []
    for _ in range(3):
        job_id = await submit(store, "echo")
        claim = await claim_one(store)
        x = await start_one(store, claim)
        assert await store.append_audit([record(claim.fence, x, 1)], [NewEvent(claim.fence, x, 2, "e", "{}")]) == set()
        assert await store.begin_step(claim.fence, x, "k") is not None
        assert await store.finish("worker-1", [finish(claim.fence, x, seq=3)]) == [job_id]
        finished.append(job_id)
    running_id = await submit(store, "safe", budget={"tool_calls": 3})
    running = await claim_one(store, agents=("safe",))
    rx = await start_one(store, running)
    assert await store.append_audit([record(running.fence, rx, 1)], []) == set()
    queued = await submit(store, "echo")
    assert await store.purge_finished(60, 10) == []  # nothing finished a minute ago
    await asyncio.sleep(0.3)
    first = await store.purge_finished(0.2, 2)
    assert len(first) == 2 and set(first) < set(finished)  # a batch at most, oldest first
    assert set(first) | set(await store.purge_finished(0.2, 10)) == set(finished)
    for job_id in finished:
        assert await store.get_job(job_id) is None
        assert await store.read_events(job_id, None, 10) == [] and await store.list_executions(job_id) == []
        assert await store.read_audit(job_id, None, 10) == [] and await store.read_steps(job_id) == []
    # the running and the queued job, and everything of theirs, are untouched
    assert await store.purge_finished(0.0, 100) == []
    for job_id in (running_id, queued):
        assert await store.get_job(job_id) is not None
    assert len(await store.read_audit(running_id, None, 10)) == 1 and await store.read_budget(running_id) is not None
    assert [e.type for e in await store.read_events(running_id, None, 10)] == ["execution.started"]


async def test_usage_is_reported_per_tenant_agent_and_model_within_a_window(store: Store) -> None:
    before = await store.server_time()
    for tenant, model, tokens in (("t1", "m1", 10), ("t1", "m2", 20), ("t2", "m1", 5)):
        await submit(store, "echo", tenant=tenant)
        claim = await claim_one(store)
        x = await start_one(store, claim)
        usage = record(claim.fence, x, 1, "usage", model, input_tokens=tokens, output_tokens=1, cost_usd=0.5)
        assert await store.append_audit([usage], []) == set()
    after = await store.server_time() + 1
    by_tenant = await store.usage_report(before - 1, after, "tenant", None)
    assert [(g["key"], g["reports"], g["input_tokens"], g["cost_usd"]) for g in by_tenant] == [
        ("t1", 2, 30, 1.0),
        ("t2", 1, 5, 0.5),
    ]
    by_model = await store.usage_report(before - 1, after, "model", "t1")
    assert [(g["key"], g["input_tokens"], g["output_tokens"]) for g in by_model] == [("m1", 10, 1), ("m2", 20, 1)]
    assert [g["key"] for g in await store.usage_report(before - 1, after, "agent", None)] == ["echo"]
    assert await store.usage_report(after, after + 10, "tenant", None) == []
