"""A stream resumed at or past its end ends, over SSE and WebSocket, on SQLite and PostgreSQL. An SSE
reconnect after the terminal event of a finished job is answered 204 (the HTML standard's "stop
reconnecting"), so a browser's EventSource does not hold a connection of keep-alives per finished job."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from tests.acceptance.up import KEYS, Up, store_url

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def up(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    d: Path = tmp_path_factory.mktemp(f"stream-end-{request.param}")
    with store_url(request.param, d) as url:
        server = Up(url, d, workers=1)
        yield server
        assert server.stop() == 0, server.log()


@pytest.fixture
async def c(up: Up) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=up.url, headers=up.headers(), timeout=30) as client:
        yield client


async def finished_job(c: httpx.AsyncClient) -> tuple[str, list[dict[str, Any]]]:
    """A succeeded job and its whole history."""
    job = (await c.post("/v1/jobs", json={"agent": "echo", "input": {"n": 1}})).json()
    async with asyncio.timeout(20):
        while (await c.get(f"/v1/jobs/{job['id']}")).json()["state"] != "succeeded":
            await asyncio.sleep(0.05)
    events = (await c.get(f"/v1/jobs/{job['id']}/events", params={"format": "json"})).json()["events"]
    assert events[-1]["type"] == "job.succeeded"
    return job["id"], events


async def sse_events(c: httpx.AsyncClient, job_id: str, headers: dict[str, str]) -> tuple[int, list[dict[str, Any]]]:
    """One SSE request read to its end (bounded: a stream that does not end fails the test)."""
    async with asyncio.timeout(15), c.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers) as r:
        events = [json.loads(line[5:]) async for line in r.aiter_lines() if line.startswith("data:")]
        return r.status_code, events


async def test_an_sse_reconnect_at_or_past_the_terminal_event_is_answered_204(c: httpx.AsyncClient) -> None:
    job_id, history = await finished_job(c)
    status, events = await sse_events(c, job_id, {})
    assert status == 200 and events == history  # the first connection streams the history, then ends
    terminal = history[-1]["id"]
    epoch = history[-1]["epoch"]
    for last_id in [terminal, f"{epoch}-999", f"{epoch + 5}-1"]:  # at the terminal event, or past the last one
        async with asyncio.timeout(10):
            r = await c.get(f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": last_id})
        assert (r.status_code, r.content) == (204, b""), (last_id, r.status_code, r.text[:200])
    r = await c.get(f"/v1/jobs/{job_id}/events", params={"after": terminal})
    assert r.status_code == 204
    status, events = await sse_events(c, job_id, {"Last-Event-ID": history[-2]["id"]})
    assert status == 200 and events == history[-1:]  # one event still to come: streamed, then the end
    page = (await c.get(f"/v1/jobs/{job_id}/events", params={"format": "json", "after": terminal})).json()
    assert page["events"] == [] and page["state"] == "succeeded"  # the JSON history is unchanged


async def test_an_sse_stream_whose_cursor_is_past_the_end_ends_when_the_job_finishes(up: Up, c: httpx.AsyncClient) -> None:
    job = (await c.post("/v1/jobs", json={"agent": "converse"})).json()
    async with asyncio.timeout(20):
        while (await c.get(f"/v1/jobs/{job['id']}")).json()["state"] != "waiting":
            await asyncio.sleep(0.05)

    async def read_from_the_future() -> tuple[int, list[dict[str, Any]]]:
        return await sse_events(c, job["id"], {"Last-Event-ID": "1-999"})  # past every event this run will append

    reader = asyncio.create_task(read_from_the_future())
    await asyncio.sleep(0.5)
    assert not reader.done()  # the job runs: the stream waits for it
    assert (await c.post(f"/v1/jobs/{job['id']}/input", json={"input": "bye"})).status_code == 202
    status, events = await reader  # ends (within the keep-alive interval) instead of hanging forever
    assert status == 200 and events == []
    r = await c.get(f"/v1/jobs/{job['id']}/events", headers={"Last-Event-ID": "1-999"})
    assert r.status_code == 204
    async with httpx.AsyncClient(base_url=up.url, timeout=10) as anon:
        assert (await anon.get("/readyz")).json()["subscribers"] == 0  # no stream left behind


async def test_a_websocket_subscription_at_or_past_the_end_ends_at_once_with_its_final_state(
    up: Up, c: httpx.AsyncClient
) -> None:
    job_id, history = await finished_job(c)
    terminal = history[-1]["id"]
    url = up.url.replace("http", "ws") + "/v1/ws"
    async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {KEYS['tenant-a']}"}) as ws:

        async def frames_until_end() -> list[dict[str, Any]]:
            out = []
            async with asyncio.timeout(10):
                while not out or out[-1]["op"] != "end":
                    out.append(json.loads(await ws.recv()))
            return out

        for after in [terminal, f"{history[-1]['epoch']}-999"]:
            await ws.send(json.dumps({"op": "subscribe", "ref": 2, "job_id": job_id, "after": after}))
            frames = await frames_until_end()
            assert [f["op"] for f in frames] == ["subscribed", "end"], frames
            assert frames[-1] == {"op": "end", "job_id": job_id, "cursor": after, "state": "succeeded"}
        await ws.send(json.dumps({"op": "subscribe", "ref": 1, "job_id": job_id}))
        frames = await frames_until_end()  # a normal end says the same: the last cursor and the final state
        assert [f["event"] for f in frames if f["op"] == "event"] == history
        assert frames[-1] == {"op": "end", "job_id": job_id, "cursor": terminal, "state": "succeeded"}
        await ws.send(json.dumps({"op": "ping", "ref": "still here"}))
        assert json.loads(await asyncio.wait_for(ws.recv(), 10)) == {"op": "pong", "ref": "still here"}
