"""The audit chain through a real worker (in this process, on SQLite and PostgreSQL): a job retried twice has
three executions in order, the evidence of all three, and usage totals equal to their sum, priced from
TENURE_PRICES; tool calls record their result or their error."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tenure.app import open_backends
from tenure.contracts.audit import Price
from tenure.contracts.errors import ConfigError, InvalidRequest
from tenure.contracts.states import JobState
from tenure.contracts.types import Job
from tenure.control.audit import job_audit
from tenure.control.tenant_budgets import TenantBudget, TenantBudgetExhausted, parse_tenant_budgets
from tenure.local import LocalClient, connect
from tenure.settings import Settings
from tenure.worker import Worker, WorkerConfig
from tests.apps.audit_app import app
from tests.integration.procs import eventually

FAST = WorkerConfig(
    concurrency=4, heartbeat_s=0.1, claim_ttl_s=0.6, sweep_interval_s=0.1, poll_s=0.1, retry_base_s=0.05,
    retry_cap_s=0.1, prices={"gpt-test": Price(input=0.5, output=2.0)},
)  # fmt: skip


@pytest.fixture
async def client(database_url: str) -> AsyncIterator[LocalClient]:
    backends = await open_backends(Settings.of(database_url=database_url))
    worker = Worker(backends, app, FAST)
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    try:
        async with connect(app, database_url) as c:
            yield c
    finally:
        stop.set()
        await asyncio.wait_for(run, 20)
        await backends.close()


async def test_a_job_retried_twice_shows_three_executions_their_evidence_and_summed_usage(client: LocalClient) -> None:
    job_id = (await client.submit("researcher", {"succeed_on": 3})).job.id

    async def done() -> bool:
        return (await client.job(job_id)).state.terminal

    await eventually(done, 30, "the job to end")
    assert (await client.job(job_id)).state is JobState.SUCCEEDED
    audit = await job_audit(client.service, job_id, None)
    assert [(e["attempt"], e["epoch"], e["outcome"]) for e in audit["executions"]] == [
        (1, 1, "failed"),
        (2, 2, "failed"),
        (3, 3, "succeeded"),
    ]
    assert [(r["epoch"], r["content"]["attempt"]) for r in audit["evidence"]] == [(1, 1), (2, 2), (3, 3)]
    calls = audit["tool_calls"]
    assert [(c["epoch"], c["name"]) for c in calls] == [(n, t) for n in (1, 2, 3) for t in ("search", "fetch")]
    assert calls[0]["arguments"] == {"q": "tenure", "attempt": 1} and calls[0]["result"] == {"hits": 3}
    assert calls[1]["error"] == "ConnectionError: refused" and "result" not in calls[1]
    assert all(c["ended_at"] >= c["started_at"] and c["duration_s"] >= 0 for c in calls)
    # usage: 100, 200, 300 input tokens and 10 output each; cost from the price table (USD per 1,000 tokens)
    cost = sum((100 * n * 0.5 + 10 * 2.0) / 1000 for n in (1, 2, 3))
    totals = audit["usage_totals"]
    assert totals["input_tokens"] == 600 and totals["output_tokens"] == 30
    assert totals["cost_usd"] == pytest.approx(cost)
    assert [u["model"] for u in audit["usage"]] == ["gpt-test"] * 3
    # the execution records keep the usage blob too, now with its cost
    assert audit["executions"][0]["usage"]["cost_usd"] == pytest.approx((100 * 0.5 + 10 * 2.0) / 1000)
    # paged: one record at a time gives the same records in the same order
    seen, cursor = [], None
    while True:
        page = await job_audit(client.service, job_id, None, cursor, 1)
        seen += [(r["epoch"], r["seq"]) for k in ("tool_calls", "evidence", "usage") for r in page[k]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(seen) and len(seen) == 12


async def test_a_runaway_agent_ends_budget_exhausted_at_its_tool_call_limit(client: LocalClient) -> None:
    job_id = (await client.submit("runaway", None, budget={"tool_calls": 5})).job.id
    job = await eventually(lambda: _terminal(client, job_id), 30, "the runaway to be stopped")
    assert (job.state, job.error_code) == (JobState.FAILED, "budget_exhausted")
    assert job.error_message is not None and "tool_calls budget is exhausted: 5 used of 5" in job.error_message
    audit = await job_audit(client.service, job_id, None)
    assert [c["arguments"]["n"] for c in audit["tool_calls"]] == [1, 2, 3, 4, 5]  # the sixth never started


async def test_a_token_budget_stops_the_job_after_the_step_that_crossed_it(client: LocalClient) -> None:
    job_id = (await client.submit("runaway", None, budget={"tokens": 450})).job.id
    job = await eventually(lambda: _terminal(client, job_id), 30, "the runaway to be stopped")
    assert (job.state, job.error_code) == (JobState.FAILED, "budget_exhausted")
    assert job.error_message is not None and "tokens budget is exhausted: 500 used of 450" in job.error_message
    assert (await job_audit(client.service, job_id, None))["usage_totals"]["input_tokens"] == 450


async def test_a_budget_counts_every_attempt_of_the_job(client: LocalClient) -> None:
    # Two tool calls per attempt: the first attempt uses two of three, the second is stopped at its second call.
    job_id = (await client.submit("researcher", {"succeed_on": 3}, budget={"tool_calls": 3})).job.id
    job = await eventually(lambda: _terminal(client, job_id), 30, "the job to end")
    assert (job.state, job.error_code, job.attempts) == (JobState.FAILED, "budget_exhausted", 2)
    assert len((await job_audit(client.service, job_id, None))["tool_calls"]) == 3


async def test_a_job_without_a_budget_runs_under_its_agents_default_budget(client: LocalClient) -> None:
    job_id = (await client.submit("frugal", None)).job.id  # the agent's default: tokens 300
    job = await eventually(lambda: _terminal(client, job_id), 30, "the job to be stopped")
    assert (job.state, job.error_code) == (JobState.FAILED, "budget_exhausted")
    assert job.error_message is not None and "tokens budget is exhausted: 300 used of 300" in job.error_message
    assert len((await job_audit(client.service, job_id, None))["tool_calls"]) == 3
    assert (await client.store.read_budget(job_id)).limits == {"tokens": 300, "wall_s": 600}  # type: ignore[union-attr]


async def test_a_jobs_own_budget_overrides_its_agents_default_limit_by_limit(client: LocalClient) -> None:
    roomy = (await client.submit("frugal", None, budget={"tokens": 5000})).job.id
    job = await eventually(lambda: _terminal(client, roomy), 30, "the job to end")
    assert (job.state, job.result) == (JobState.SUCCEEDED, 10)  # 1000 tokens: over the agent's 300, under its own
    assert (await client.store.read_budget(roomy)).limits == {"tokens": 5000, "wall_s": 600}  # type: ignore[union-attr]
    # A job naming another limit keeps the agent's tokens as well: the first limit reached stops it.
    tight = (await client.submit("frugal", None, budget={"tool_calls": 2})).job.id
    job = await eventually(lambda: _terminal(client, tight), 30, "the job to be stopped")
    assert (job.state, job.error_code) == (JobState.FAILED, "budget_exhausted")
    assert job.error_message is not None and "tool_calls budget is exhausted: 2 used of 2" in job.error_message
    assert (await client.store.read_budget(tight)).limits == {"tokens": 300, "tool_calls": 2, "wall_s": 600}  # type: ignore[union-attr]


def test_an_agents_default_budget_is_validated_when_it_is_declared() -> None:
    from tenure import Tenure

    for bad, said in (
        ({"toks": 5}, "agent 'x': budget has no limit 'toks'"),
        ({"tokens": 0}, "agent 'x': budget tokens must be from 1"),
        ({"tool_calls": 1.5}, "agent 'x': budget tool_calls must be a whole number"),
        ({"cost": -1}, "agent 'x': budget cost must be above 0"),
        ({"wall_s": True}, "agent 'x': budget wall_s must be a number"),
        ({"tokens": 10**13}, "agent 'x': budget tokens must be from 1 up to 1e.12"),
        ([("tokens", 5)], "agent 'x': budget must be a dict"),
    ):
        with pytest.raises(ConfigError, match=said):
            Tenure().agent("x", budget=bad)(lambda ctx, input: None)  # type: ignore[arg-type]
    spec = Tenure().agent("x", budget={"tokens": 10.0, "cost": 2})(lambda ctx, input: None)
    assert spec is not None


async def test_a_malformed_budget_is_refused_at_admission(client: LocalClient) -> None:
    for bad in ({"tool_calls": 0}, {"tokens": "many"}, {"cost": -1}, {"wall": 5}, {"tool_calls": 1.5}):
        with pytest.raises(InvalidRequest):
            await client.submit("runaway", None, budget=bad)  # type: ignore[arg-type]


async def _terminal(client: LocalClient, job_id: str) -> Job | None:
    job = await client.job(job_id)
    return job if job.state.terminal else None


async def test_concurrent_steps_of_one_execution_run_each_key_once(client: LocalClient, tmp_path: Path) -> None:
    path = tmp_path / "effects"
    job_id = (await client.submit("concurrent_steps", {"path": str(path)})).job.id
    job = await eventually(lambda: _terminal(client, job_id), 30, "the job to end")
    assert job.state is JobState.SUCCEEDED, job
    assert job.result["first"] == ["a", "b"] and job.result["again"] == ["a", "b"]
    assert job.result["twice"][0] == "c" and "already running" in job.result["twice"][1]
    assert sorted((await asyncio.to_thread(path.read_text)).split()) == ["a", "b", "c"]  # each effect once


async def test_tool_functions_decorated_with_tenure_tool_record_their_calls(client: LocalClient) -> None:
    job_id = (await client.submit("tooled", None)).job.id
    job = await eventually(lambda: _terminal(client, job_id), 30, "the job to end")
    assert job.state is JobState.SUCCEEDED and job.result == {"hits": ["tenure-0", "tenure-1"], "words": 3}
    calls = (await job_audit(client.service, job_id, None))["tool_calls"]
    assert [(c["name"], c["arguments"], c["result"]) for c in calls] == [
        ("lookup", {"q": "tenure", "limit": 2}, ["tenure-0", "tenure-1"]),
        ("word_count", {"text": "one two three"}, 3),
    ]


async def test_the_sweeper_duty_deletes_jobs_finished_longer_ago_than_the_retention(database_url: str) -> None:
    config = dataclasses.replace(FAST, retention_days=0.5 / 86400)  # half a second
    backends = await open_backends(Settings.of(database_url=database_url))
    worker = Worker(backends, app, config)
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    try:
        async with connect(app, database_url) as client:
            job_id = (await client.submit("researcher", {})).job.id
            await eventually(lambda: _terminal(client, job_id), 30, "the job to end")

            async def gone() -> bool:
                return await client.store.get_job(job_id) is None

            await eventually(gone, 30, "retention to delete the finished job")
            assert await client.store.read_audit(job_id, None, 10) == []
    finally:
        stop.set()
        await asyncio.wait_for(run, 20)
        await backends.close()


async def test_a_tenant_over_its_token_budget_is_refused_at_admission_with_the_reason(
    client: LocalClient, database_url: str
) -> None:
    budgets = parse_tenant_budgets('{"frugal": {"tokens": 100, "window_s": 3600}}')
    settings = Settings.of(database_url=database_url, tenant_budgets=budgets)
    async with connect(app, settings=settings) as c:
        first = (await c.submit("researcher", {}, tenant="frugal")).job.id  # nothing used yet
        job = await eventually(lambda: _terminal(client, first), 30, "the first job to end")
        assert job.state is JobState.SUCCEEDED  # it reported 100 + 10 tokens
        with pytest.raises(TenantBudgetExhausted) as refused:
            await c.submit("researcher", {}, tenant="frugal")
        assert "tenant 'frugal' is over its tokens budget: 110 used of 100 in the last 3600 s" in str(refused.value)
        assert (await c.submit("researcher", {}, tenant="other")).created  # another tenant is not held back


def test_tenant_budgets_are_validated_at_start_up() -> None:
    assert parse_tenant_budgets('{"a": {"cost": 5}}')["a"] == TenantBudget(None, 5, 86400.0)
    for bad in ("[]", '{"a": {}}', '{"a": {"window_s": 5}}', '{"a": {"tokens": -1}}', '{"a": {"toks": 1}}', "x"):
        with pytest.raises(ConfigError):
            parse_tenant_budgets(bad)
    with pytest.raises(ConfigError):
        Settings.from_env({"TENURE_TENANT_BUDGETS": '{"a": {"tokens": true}}'})
