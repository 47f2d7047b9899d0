"""Coordinator agents on real `tenure worker` processes and real databases (docs/coordinators.md):

- a coordinator spawning 20 children across 3 workers gathers all their results;
- a parent waiting on its children holds no worker slot: one worker with one slot runs parent and children;
- SIGKILL of the parent's worker mid-gather, then its retry (retry-safe), creates no second set of children;
- cancelling the parent cancels its children still queued or running, also by the cancel door alone;
- `GET /v1/jobs/{id}` lists a parent's children, and a child names its parent;
- the parent's SSE stream with `?include=children` carries its children's events.
"""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from tenure.app import load_app, open_backends
from tenure.contracts.children import ChildJob
from tenure.contracts.errors import OwnershipLost
from tenure.contracts.states import JobState
from tenure.contracts.types import ControlOutcome, Fence, Job
from tenure.control.coordinators import child_request
from tenure.gateway.app import Gateway
from tenure.gateway.auth import Auth
from tenure.local import LocalClient, connect
from tenure.serve import gateway_config
from tenure.settings import Settings
from tests.integration.procs import WorkerProc, eventually
from tests.integration.redisproc import RedisProc

pytestmark = pytest.mark.slow

APP = "tests.apps.coord_app:app"


@pytest.fixture
async def client(database_url: str) -> AsyncIterator[LocalClient]:
    async with connect(APP, database_url) as c:
        yield c


@pytest.fixture
def workers() -> Iterator[list[WorkerProc]]:
    started: list[WorkerProc] = []
    yield started
    for w in started:
        w.stop()


def start(
    workers: list[WorkerProc], database_url: str, tmp_path: Path, name: str, concurrency: int,
    env: dict[str, str] | None = None,
) -> WorkerProc:  # fmt: skip
    w = WorkerProc(database_url, tmp_path, name, app=APP, concurrency=concurrency, env=env)
    workers.append(w)
    return w


def logs(workers: list[WorkerProc]) -> str:
    return "\n".join(f"--- {w.name}\n{w.log()[-3000:]}" for w in workers)


async def terminal(client: LocalClient, job_id: str) -> Job | None:
    job = await client.job(job_id)
    return job if job.state.terminal else None


async def children(client: LocalClient, job_id: str) -> list[ChildJob]:
    return await client.store.children(job_id)


async def test_a_coordinator_gathers_twenty_children_run_across_three_workers(
    client: LocalClient, workers: list[WorkerProc], database_url: str, tmp_path: Path
) -> None:
    for name in ("a", "b", "c"):
        start(workers, database_url, tmp_path, name, concurrency=4)
    parent_id = (await client.submit("coordinator", {"n": 20, "sleep_s": 0.3})).job.id
    parent = await eventually(lambda: terminal(client, parent_id), 90, f"the coordinator to end\n{logs(workers)}")
    assert parent.state is JobState.SUCCEEDED, (parent.error_code, parent.error_message, logs(workers))
    assert parent.result["n"] == 20 and parent.result["sum"] == sum(range(20))
    assert parent.attempts == 1  # its claim was renewed while it waited: one attempt
    kids = await children(client, parent_id)
    assert len(kids) == 20 and all(k.state is JobState.SUCCEEDED for k in kids)
    ran_on = {(await client.job(k.id)).result["worker"] for k in kids}
    assert len(ran_on) >= 2, ran_on  # no worker holds more than 4 at once: the 20 are spread
    for k in kids:  # each child records its parent job and the execution that spawned it
        child = await client.job(k.id)
        assert (child.parent_job_id, child.parent_execution_id) == (parent_id, parent.execution_id)
    detail = await client.service.job_detail(parent_id)
    assert [c.id for c in detail.children or ()] == [k.id for k in kids]
    assert detail.to_dict()["children"][0] == {"id": kids[0].id, "agent": "leaf", "state": "succeeded"}


async def test_with_redis_a_coordinator_gathers_its_children_across_workers(
    database_url: str, private_redis: RedisProc, workers: list[WorkerProc], tmp_path: Path
) -> None:
    # The ready index and the live channel on Redis: children are hinted through the index like any admitted job.
    prefix = f"tenure-test:{uuid.uuid4().hex}:"
    env = {"TENURE_REDIS_URL": private_redis.url, "TENURE_REDIS_PREFIX": prefix}
    for name in ("a", "b", "c"):
        start(workers, database_url, tmp_path, name, concurrency=4, env=env)
    settings = Settings.of(database_url=database_url, redis_url=private_redis.url, redis_prefix=prefix)
    async with connect(APP, settings=settings) as client:
        parent_id = (await client.submit("coordinator", {"n": 20, "sleep_s": 0.2})).job.id
        parent = await eventually(lambda: terminal(client, parent_id), 90, f"the coordinator to end\n{logs(workers)}")
        kids = await children(client, parent_id)
    assert parent.state is JobState.SUCCEEDED, (parent.error_code, parent.error_message, logs(workers))
    assert parent.result["n"] == 20 and len(kids) == 20 and len(parent.result["workers"]) >= 2


async def test_a_waiting_parent_frees_its_slot_for_its_children(
    client: LocalClient, workers: list[WorkerProc], database_url: str, tmp_path: Path
) -> None:
    # One worker with one slot: the children can run only while the parent, gathering, holds no slot.
    w = start(workers, database_url, tmp_path, "solo", concurrency=1)
    parent_id = (await client.submit("coordinator", {"n": 3})).job.id
    parent = await eventually(lambda: terminal(client, parent_id), 60, f"the coordinator to end\n{w.log()}")
    assert parent.state is JobState.SUCCEEDED, (parent.error_code, parent.error_message, w.log())
    assert parent.result["n"] == 3
    types = [e.type for e in await client.events(parent_id)]
    assert "job.waiting" in types and "job.resumed" in types


async def test_a_failed_child_fails_its_parent_without_a_retry(
    client: LocalClient, workers: list[WorkerProc], database_url: str, tmp_path: Path
) -> None:
    w = start(workers, database_url, tmp_path, "w", concurrency=4)
    parent_id = (await client.submit("coordinator", {"n": 4, "fail": [2]})).job.id
    parent = await eventually(lambda: terminal(client, parent_id), 60, f"the coordinator to end\n{w.log()}")
    assert (parent.state, parent.error_code, parent.attempts) == (JobState.FAILED, "child_failed", 1), w.log()
    kids = await children(client, parent_id)
    assert kids[2].id in (parent.error_message or "")
    assert [k.state for k in kids] == [JobState.SUCCEEDED, JobState.SUCCEEDED, JobState.FAILED, JobState.SUCCEEDED]


async def _parent_waiting_on(client: LocalClient, parent_id: str, n: int) -> Job | None:
    job = await client.job(parent_id)
    if job.state is JobState.WAITING and len(await children(client, parent_id)) == n:
        return job
    return None


async def test_a_parent_killed_mid_gather_is_retried_and_spawns_no_second_set_of_children(
    client: LocalClient, workers: list[WorkerProc], database_url: str, tmp_path: Path
) -> None:
    a = start(workers, database_url, tmp_path, "a", concurrency=4)
    parent_id = (await client.submit("coordinator", {"n": 8, "sleep_s": 1.0})).job.id
    first = await eventually(
        lambda: _parent_waiting_on(client, parent_id, 8), 60, f"the parent to wait on its children\n{a.log()}"
    )
    assert first.owner is not None and f":{a.pid}:" in first.owner
    start(workers, database_url, tmp_path, "b", concurrency=4)
    start(workers, database_url, tmp_path, "c", concurrency=4)
    a.signal(signal.SIGKILL)
    parent = await eventually(lambda: terminal(client, parent_id), 90, f"the retried parent to end\n{logs(workers)}")
    assert parent.state is JobState.SUCCEEDED, (parent.error_code, parent.error_message, logs(workers))
    assert parent.result["attempt"] >= 2 and parent.attempts >= 2  # it was retried after the kill
    assert parent.result["n"] == 8 and parent.result["sum"] == sum(range(8))
    kids = await children(client, parent_id)
    assert len(kids) == 8, [k.id for k in kids]  # the retry got the same children back, no second set
    assert all(k.state is JobState.SUCCEEDED for k in kids)
    spawned = [e.payload for e in await client.events(parent_id) if e.type == "spawned"]
    assert spawned[0]["created"] == 8 and spawned[-1]["created"] == 0, spawned


async def test_cancelling_the_parent_cancels_its_queued_and_running_children(
    client: LocalClient, workers: list[WorkerProc], database_url: str, tmp_path: Path
) -> None:
    w = start(workers, database_url, tmp_path, "w", concurrency=2)
    parent_id = (await client.submit("coordinator", {"n": 5, "sleep_s": 60})).job.id

    async def some_running() -> list[ChildJob] | None:
        kids = await children(client, parent_id)
        return kids if any(k.state is JobState.RUNNING for k in kids) and len(kids) == 5 else None

    before = await eventually(some_running, 60, f"a child to run\n{w.log()}")
    assert any(k.state is JobState.QUEUED for k in before)  # two slots: the rest wait to start
    await client.cancel(parent_id)
    parent = await eventually(lambda: terminal(client, parent_id), 30, f"the parent to end\n{w.log()}")
    assert parent.state is JobState.CANCELLED

    async def all_cancelled() -> list[ChildJob] | None:
        kids = await children(client, parent_id)
        return kids if all(k.state.terminal for k in kids) else None

    kids = await eventually(all_cancelled, 30, f"every child to end\n{w.log()}")
    assert [k.state for k in kids] == [JobState.CANCELLED] * 5


async def _spawned_without_workers(client: LocalClient, n: int) -> tuple[str, list[str]]:
    """A parent job started by a stand-in worker (the store's claim and start CAS) and `n` children admitted as
    `ctx.spawn` admits them, with no worker running any of them."""
    parent = (await client.submit("coordinator", {"n": n})).job
    [(_, started)] = await client.store.claim_and_start("stand-in", ["coordinator"], [], 1, 60)
    kids = []
    for i in range(n):
        req = child_request(started.fence, started.execution_id, parent.tenant, "leaf", {"i": i}, f"part-{i}", {})
        kids.append((await client.admission.admit(req)).job.id)
    again = child_request(started.fence, started.execution_id, parent.tenant, "leaf", {"i": 0}, "part-0", {})
    replay = await client.admission.admit(again)  # the same (parent, key): the same child
    assert (replay.job.id, replay.created) == (kids[0], False)
    return parent.id, kids


async def test_the_cancel_door_cascades_to_children_without_the_parents_worker(client: LocalClient) -> None:
    # The parent's stand-in worker never acts: only the control path (JobsService.cancel) can cancel the children.
    parent_id, kids = await _spawned_without_workers(client, 3)
    assert await client.cancel(parent_id) is ControlOutcome.REQUESTED
    assert [(await client.job(k)).state for k in kids] == [JobState.CANCELLED] * 3


async def test_a_stale_parent_fence_spawns_nothing(client: LocalClient) -> None:
    parent = (await client.submit("coordinator", {"n": 1})).job
    [(_, started)] = await client.store.claim_and_start("stand-in", ["coordinator"], [], 1, 60)
    f = started.fence
    for stale in (Fence(f.job_id, f.epoch, f.token + 1), Fence(f.job_id, f.epoch + 1, f.token)):
        req = child_request(stale, started.execution_id, parent.tenant, "leaf", {"i": 0}, "part-0", {})
        with pytest.raises(OwnershipLost):
            await client.admission.admit(req)
    assert await children(client, parent.id) == []  # nothing was written
    ok = child_request(f, started.execution_id, parent.tenant, "leaf", {"i": 0}, "part-0", {})
    assert (await client.admission.admit(ok)).created


async def test_get_job_lists_the_children_with_their_states(database_url: str) -> None:
    settings = Settings.of(database_url=database_url)
    backends = await open_backends(settings)
    try:
        app = load_app(APP)
        async with connect(app, database_url) as client:
            parent_id, kids = await _spawned_without_workers(client, 2)
        gateway = Gateway(backends, app.specs(), Auth.open(), gateway_config(settings))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(gateway.asgi), base_url="http://gateway") as http:
            parent = (await http.get(f"/v1/jobs/{parent_id}")).json()
            child = (await http.get(f"/v1/jobs/{kids[1]}")).json()
            listed = (await http.get("/v1/jobs")).json()["jobs"]
    finally:
        await backends.close()
    assert parent["children"] == [{"id": k, "agent": "leaf", "state": "queued"} for k in kids]
    assert parent["state"] == "running"
    assert child["children"] == [] and child["parent_job_id"] == parent_id
    assert all(j["children"] is None for j in listed)  # lists do not read children


def sse_frames(text: str) -> list[dict[str, str]]:
    """The frames of an SSE body (comments dropped): each a dict of its fields."""
    frames = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if line and not line.startswith(":"))
        if fields:
            frames.append(fields)
    return frames


async def test_the_parents_stream_with_include_children_carries_the_childrens_events(
    database_url: str, workers: list[WorkerProc], tmp_path: Path
) -> None:
    w = start(workers, database_url, tmp_path, "w", concurrency=4)
    settings = Settings.of(database_url=database_url)
    backends = await open_backends(settings)
    try:
        app = load_app(APP)
        gateway = Gateway(backends, app.specs(), Auth.open(), gateway_config(settings))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(gateway.asgi), base_url="http://gateway") as http:
            submitted = await http.post("/v1/jobs", json={"agent": "coordinator", "input": {"n": 3, "sleep_s": 0.2}})
            parent_id = submitted.json()["id"]
            body = (await http.get(f"/v1/jobs/{parent_id}/events?include=children", timeout=60)).text
            refused = await http.get(f"/v1/jobs/{parent_id}/events?include=children&format=json")
            async with connect(app, database_url) as client:
                kids = {k.id for k in await children(client, parent_id)}
    finally:
        await backends.close()
    frames = sse_frames(body)
    own = [f for f in frames if f.get("event") != "child"]
    assert own and all("id" in f for f in own) and own[-1]["event"] == "job.succeeded", w.log()
    child = [json.loads(f["data"]) for f in frames if f.get("event") == "child"]
    assert all("id" not in f for f in frames if f.get("event") == "child")  # Last-Event-ID stays the parent's
    assert len(kids) == 3 and {e["job_id"] for e in child} == kids
    ends = [e["job_id"] for e in child if e["type"] == "job.succeeded"]
    assert sorted(ends) == sorted(kids)  # each child's history, to its terminal event, once
    assert len({(e["job_id"], e["execution_id"], e["seq"]) for e in child}) == len(child)  # no duplicate
    assert refused.status_code == 400
