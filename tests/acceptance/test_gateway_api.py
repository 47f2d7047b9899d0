"""The HTTP API v1 as a client drives it: `tenure up` on SQLite, API keys for two tenants and an admin."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from tests.acceptance.up import Up

pytestmark = pytest.mark.slow

IMPOSSIBLE = ["no-worker-has-this"]  # a job that requires it stays queued and unowned


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    d = tmp_path_factory.mktemp("api")
    server = Up(f"sqlite:///{d}/tenure.db", d, workers=2)
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture
async def a(up: Up) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=up.url, headers=up.headers("tenant-a"), timeout=30) as c:
        yield c


@pytest.fixture
async def b(up: Up) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=up.url, headers=up.headers("tenant-b"), timeout=30) as c:
        yield c


@pytest.fixture
async def admin(up: Up) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=up.url, headers=up.headers(None), timeout=30) as c:
        yield c


def is_problem(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert {"type", "title", "detail"} <= set(body), body
    assert "Traceback" not in r.text
    return body  # type: ignore[no-any-return]


async def wait_state(c: httpx.AsyncClient, job_id: str, states: set[str], timeout_s: float = 20) -> dict[str, Any]:
    async with asyncio.timeout(timeout_s):
        while True:
            job = (await c.get(f"/v1/jobs/{job_id}")).json()
            if job["state"] in states:
                return job  # type: ignore[no-any-return]
            await asyncio.sleep(0.05)


async def sse(c: httpx.AsyncClient, job_id: str, last_id: str | None = None) -> list[dict[str, Any]]:
    headers = {"Last-Event-ID": last_id} if last_id else {}
    events = []
    async with c.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line[5:]))
    return events


async def test_submit_runs_the_job_and_streams_it_to_its_terminal_event(a: httpx.AsyncClient) -> None:
    r = await a.post("/v1/jobs", json={"agent": "sleep", "input": {"seconds": 0.3, "every": 0.1}})
    assert r.status_code == 201 and r.headers["location"] == f"/v1/jobs/{r.json()['id']}"
    job = r.json()
    events = await sse(a, job["id"])
    types = [e["type"] for e in events]
    assert types[0] == "execution.started" and types[-1] == "job.succeeded"
    assert types.count("job.succeeded") == 1 and "progress" in types
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    again = await sse(a, job["id"], events[2]["id"])  # resume after the third
    assert again == events[3:]
    page = (await a.get(f"/v1/jobs/{job['id']}/events", params={"format": "json", "after": events[0]["id"]})).json()
    assert page["events"] == events[1:] and page["next"] == events[-1]["id"]
    assert (await a.get(f"/v1/jobs/{job['id']}")).json()["result"] == {"slept_s": 0.3}


async def test_idempotency_replays_the_original_and_refuses_a_different_body(
    a: httpx.AsyncClient, b: httpx.AsyncClient
) -> None:
    body = {"agent": "echo", "input": {"n": 1}}
    first = await a.post("/v1/jobs", json=body, headers={"Idempotency-Key": "order-1"})
    replay = await a.post("/v1/jobs", json=body, headers={"Idempotency-Key": "order-1"})
    assert (first.status_code, replay.status_code) == (201, 200)
    assert first.json()["id"] == replay.json()["id"]
    conflict = is_problem(
        await a.post("/v1/jobs", json={"agent": "echo", "input": {"n": 2}}, headers={"Idempotency-Key": "order-1"}),
        409,
    )
    assert conflict["existing_job_id"] == first.json()["id"]
    other = await b.post("/v1/jobs", json=body, headers={"Idempotency-Key": "order-1"})  # another tenant
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]


async def test_a_hundred_concurrent_submits_with_one_key_make_one_job(a: httpx.AsyncClient) -> None:
    body = {"agent": "echo", "input": {"burst": True}}
    rs = await asyncio.gather(*(a.post("/v1/jobs", json=body, headers={"Idempotency-Key": "burst"}) for _ in range(100)))
    ids = {r.json()["id"] for r in rs}
    assert len(ids) == 1 and len(rs) == 100
    assert sorted(r.status_code for r in rs) == [200] * 99 + [201]
    listed = (await a.get("/v1/jobs", params={"limit": 500})).json()["jobs"]
    assert sum(1 for j in listed if j["input"] == {"burst": True}) == 1


async def test_tenants_never_see_each_others_jobs(
    a: httpx.AsyncClient, b: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    job = (await a.post("/v1/jobs", json={"agent": "echo", "input": "mine", "requires": IMPOSSIBLE})).json()
    jid = job["id"]
    is_problem(await b.get(f"/v1/jobs/{jid}"), 404)
    is_problem(await b.get(f"/v1/jobs/{jid}/events", params={"format": "json"}), 404)
    is_problem(await b.get(f"/v1/jobs/{jid}/events"), 404)
    assert is_problem(await b.post(f"/v1/jobs/{jid}/cancel"), 404)["outcome"] == "unknown"
    is_problem(await b.post(f"/v1/jobs/{jid}/approve", json={}), 404)
    is_problem(await b.post(f"/v1/jobs/{jid}/input", json={"input": 1}), 404)
    assert all(j["tenant"] == "tenant-b" for j in (await b.get("/v1/jobs")).json()["jobs"])
    assert jid not in {j["id"] for j in (await b.get("/v1/jobs", params={"limit": 500})).json()["jobs"]}
    assert (await admin.get(f"/v1/jobs/{jid}")).status_code == 200
    assert (await a.get(f"/v1/jobs/{jid}")).json()["state"] == "queued"  # b's attempts changed nothing
    workers = (await b.get("/v1/workers")).json()["workers"]
    assert workers and all(isinstance(w["jobs_held"], int) for w in workers)
    assert (await a.post(f"/v1/jobs/{jid}/cancel")).json()["outcome"] == "accepted"


async def test_requests_without_a_valid_key_are_refused(up: Up) -> None:
    async with httpx.AsyncClient(base_url=up.url) as anon:
        is_problem(await anon.get("/v1/jobs"), 401)
        is_problem(await anon.post("/v1/jobs", json={"agent": "echo"}), 401)
        is_problem(await anon.get("/v1/jobs", headers={"Authorization": "Bearer wrong-key-123"}), 401)
        is_problem(await anon.get("/v1/jobs", headers={"Authorization": "Basic abc"}), 401)
        assert (await anon.get("/healthz")).json() == {"status": "ok"}
        assert (await anon.get("/readyz")).status_code == 200
        assert (await anon.get("/openapi.json")).json()["openapi"].startswith("3.")


async def test_bad_requests_get_clear_problems_and_write_nothing(a: httpx.AsyncClient, admin: httpx.AsyncClient) -> None:
    before = len((await admin.get("/v1/jobs", params={"limit": 500})).json()["jobs"])
    post = a.post
    is_problem(await post("/v1/jobs", content=b"{not json", headers={"Content-Type": "application/json"}), 400)
    is_problem(await post("/v1/jobs", content=b""), 400)
    is_problem(await post("/v1/jobs", json=[1, 2]), 422)
    is_problem(await post("/v1/jobs", json={"input": 1}), 422)  # no agent
    is_problem(await post("/v1/jobs", json={"agent": 7}), 422)
    is_problem(await post("/v1/jobs", json={"agent": "echo", "priority": "high"}), 422)
    is_problem(await post("/v1/jobs", json={"agent": "echo", "priority": True}), 422)
    is_problem(await post("/v1/jobs", json={"agent": "echo", "priority": 1000}), 422)
    is_problem(await post("/v1/jobs", json={"agent": "echo", "requires": "gpu"}), 422)
    is_problem(await post("/v1/jobs", json={"agent": "echo", "deadline_s": -1}), 422)
    is_problem(await post("/v1/jobs", json={"agent": "echo", "max_attempts": 0}), 422)
    is_problem(await post("/v1/jobs", json={"agent": "echo", "surprise": 1}), 422)
    assert "known agents" in is_problem(await post("/v1/jobs", json={"agent": "nope"}), 422)["detail"]
    is_problem(await post("/v1/jobs", json={"agent": "echo"}, headers={"Idempotency-Key": "k" * 300}), 422)
    huge = b'{"agent": "echo", "input": "' + b"x" * (10 * 1024 * 1024) + b'"}'
    is_problem(await post("/v1/jobs", content=huge, headers={"Content-Type": "application/json"}), 413)
    big_input = {"agent": "echo", "input": "x" * (1024 * 1024 + 10)}
    is_problem(await post("/v1/jobs", json=big_input), 413)
    is_problem(await a.get("/v1/jobs", params={"state": "sideways"}), 400)
    is_problem(await a.get("/v1/jobs", params={"limit": "many"}), 400)
    is_problem(await a.get("/v1/jobs", params={"limit": 0}), 400)
    is_problem(await a.get("/v1/jobs", params={"cursor": "not-a-job"}), 400)
    is_problem(await a.get("/v1/jobs/not-a-uuid"), 404)
    is_problem(await a.get("/v1/no-such-route"), 404)
    is_problem(await a.delete("/v1/jobs"), 405)
    job = (await post("/v1/jobs", json={"agent": "echo", "input": 1})).json()
    before += 1
    is_problem(await a.get(f"/v1/jobs/{job['id']}/events", params={"format": "json", "after": "x-y"}), 400)
    is_problem(await a.get(f"/v1/jobs/{job['id']}/events", headers={"Last-Event-ID": "garbage"}), 400)
    is_problem(await a.post(f"/v1/jobs/{job['id']}/input", json={"wrong": 1}), 422)
    is_problem(await a.post(f"/v1/jobs/{job['id']}/approve", json={"approved": "yes"}), 422)
    is_problem(await a.post(f"/v1/jobs/{job['id']}/cancel", params={"wait": "soon"}), 400)
    assert len((await admin.get("/v1/jobs", params={"limit": 500})).json()["jobs"]) == before
    assert (await a.get("/healthz")).status_code == 200  # still serving


async def test_cancel_answers_accepted_requested_and_already_finished(a: httpx.AsyncClient) -> None:
    queued = (await a.post("/v1/jobs", json={"agent": "echo", "requires": IMPOSSIBLE})).json()
    r = await a.post(f"/v1/jobs/{queued['id']}/cancel")
    assert (r.status_code, r.json()["outcome"]) == (200, "accepted")
    assert [e["type"] for e in await sse(a, queued["id"])] == ["job.cancelled"]

    running = (await a.post("/v1/jobs", json={"agent": "sleep", "input": {"seconds": 60}})).json()
    await wait_state(a, running["id"], {"running"})
    r = await a.post(f"/v1/jobs/{running['id']}/cancel")
    assert (r.status_code, r.json()["outcome"]) == (202, "requested")  # persisted; the owner acts on it
    await wait_state(a, running["id"], {"cancelled"})
    events = await sse(a, running["id"])
    assert events[-1]["type"] == "job.cancelled" and sum(e["type"].startswith("job.c") for e in events) == 1
    r = await a.post(f"/v1/jobs/{running['id']}/cancel")
    assert (r.status_code, r.json()["outcome"]) == (200, "already_finished")

    waited = (await a.post("/v1/jobs", json={"agent": "sleep", "input": {"seconds": 60}})).json()
    await wait_state(a, waited["id"], {"running"})
    r = await a.post(f"/v1/jobs/{waited['id']}/cancel", params={"wait": 20})
    assert (r.status_code, r.json()["outcome"]) == (200, "accepted")  # the owner finished it cancelled
    is_problem(await a.post("/v1/jobs/00000000-0000-7000-8000-000000000000/cancel"), 404)


async def test_input_and_approval_pause_the_job_and_resume_it(a: httpx.AsyncClient) -> None:
    job = (await a.post("/v1/jobs", json={"agent": "converse"})).json()
    await wait_state(a, job["id"], {"waiting"})
    r = await a.post(f"/v1/jobs/{job['id']}/input", json={"input": "hello"})
    assert (r.status_code, r.json()["outcome"]) == (202, "requested")
    await a.post(f"/v1/jobs/{job['id']}/input", json={"input": "bye"})
    done = await wait_state(a, job["id"], {"succeeded", "failed", "dead"})
    assert done["state"] == "succeeded" and done["result"] == {"turns": 1}
    types = [e["type"] for e in await sse(a, job["id"])]
    assert types[:2] == ["execution.started", "job.waiting"] and "message" in types and types[-1] == "job.succeeded"
    is_problem(await a.post(f"/v1/jobs/{job['id']}/input", json={"input": "late"}), 409)

    pub = (await a.post("/v1/jobs", json={"agent": "publish", "input": {"title": "t"}})).json()
    waiting = await wait_state(a, pub["id"], {"waiting"})
    assert waiting["owner"] is not None  # still owned: the worker only gave its slot back
    r = await a.post(f"/v1/jobs/{pub['id']}/approve", json={"approved": True, "comment": "ok"})
    assert r.json()["outcome"] == "requested"
    done = await wait_state(a, pub["id"], {"succeeded", "failed", "dead"})
    assert done["result"] == {"published": "draft: t"}
    waiting_event = next(e for e in await sse(a, pub["id"]) if e["type"] == "job.waiting")
    assert waiting_event["payload"] == {"for": "approve", "prompt": "publish 'draft: t'?"}


async def test_a_retried_job_streams_its_epochs_in_order_with_one_terminal_event(a: httpx.AsyncClient) -> None:
    job = (await a.post("/v1/jobs", json={"agent": "flaky", "input": {"fail_times": 1}})).json()
    events = await sse(a, job["id"])
    assert [(e["epoch"], e["type"]) for e in events] == [
        (1, "execution.started"),
        (1, "execution.retrying"),
        (2, "execution.started"),
        (2, "job.succeeded"),
    ]
    cursors = [(e["epoch"], e["seq"]) for e in events]
    assert cursors == sorted(set(cursors))
    resumed = await sse(a, job["id"], events[1]["id"])  # from the end of epoch 1: epoch 2 only
    assert resumed == events[2:]
