"""Streams that survive reconnects, and the seed-000 scenario, on `tenure up` over SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from tests.acceptance.up import KEYS, Up
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.slow


@pytest.fixture(params=["database", "redis"])
def up3(request: pytest.FixtureRequest, database_url: str, tmp_path: Path) -> Iterator[Up]:
    """One gateway with an inline worker, plus two worker processes; one slot each. Live hints travel through
    the database (NOTIFY, polling) or, with TENURE_REDIS_URL, over Redis pub/sub."""
    env = {"TENURE_CONCURRENCY": "1"}
    if request.param == "redis":
        env |= {"TENURE_REDIS_URL": REDIS_URL, "TENURE_REDIS_PREFIX": f"tenure-test:{uuid.uuid4().hex}:"}
    server = Up(database_url, tmp_path, workers=2, inline=True, env=env)
    yield server
    assert server.stop() == 0, server.log()


async def history(c: httpx.AsyncClient, job_id: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    after = None
    while True:
        params: dict[str, Any] = {"format": "json", "limit": 10000}
        if after:
            params["after"] = after
        page = (await c.get(f"/v1/jobs/{job_id}/events", params=params)).json()
        if not page["events"]:
            return out
        out += page["events"]
        after = page["next"]


async def test_a_stream_resumed_at_random_points_equals_the_history_exactly(up3: Up) -> None:
    rng = random.Random(7)
    async with httpx.AsyncClient(base_url=up3.url, headers=up3.headers(), timeout=60) as c:
        job = (await c.post("/v1/jobs", json={"agent": "stream", "input": {"count": 10000}})).json()
        got: list[dict[str, Any]] = []
        last_id: str | None = None
        connections = 0
        while not got or got[-1]["type"] != "job.succeeded":
            connections += 1
            take = rng.randint(1, 1500)  # disconnect after this many events
            headers = {"Last-Event-ID": last_id} if last_id else {}
            async with c.stream("GET", f"/v1/jobs/{job['id']}/events", headers=headers) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if line.startswith("data:"):
                        event = json.loads(line[5:])
                        got.append(event)
                        last_id = event["id"]
                        take -= 1
                        if take == 0:
                            break  # leaving the block drops the connection mid-stream
        full = await history(c, job["id"])
    assert connections > 3
    assert got == full
    assert len(got) == 10000 + 2  # execution.started, 10,000 counts, job.succeeded
    cursors = [(e["epoch"], e["seq"]) for e in got]
    assert cursors == sorted(set(cursors)) and [s for _, s in cursors] == list(range(1, len(got) + 1))
    assert [e["payload"]["i"] for e in got if e["type"] == "count"] == list(range(10000))


async def test_seed_000_a_short_job_on_a_busy_connection_starts_on_an_idle_worker(up3: Up) -> None:
    """The connection is on the gateway; one worker runs a long job; a short job submitted on the same
    connection starts on an idle worker within 100 ms (server clock: created_at → execution_started_at) and
    its events reach the original connection."""
    url = up3.url.replace("http", "ws") + "/v1/ws"
    async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {KEYS['tenant-a']}"}) as ws:

        async def until(pred: Any) -> dict[str, Any]:
            while True:
                frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
                if pred(frame):
                    return frame  # type: ignore[no-any-return]

        await ws.send(
            json.dumps({"op": "submit", "ref": "long", "agent": "sleep", "input": {"seconds": 30}, "subscribe": True})
        )
        long_job = (await until(lambda f: f.get("op") == "submitted"))["job"]
        started = await until(lambda f: f.get("op") == "event" and f["event"]["type"] == "execution.started")
        long_worker = started["event"]["payload"]["worker_id"]

        # Three short jobs, one after the other, on the same connection. Each must start on another worker
        # than the long job's within 100 ms, and its events must come back here (a job queued behind the long
        # one would wait 30 s). Measured at load average 5: 2-33 ms.
        shorts = []
        for n in range(3):
            ref = f"short-{n}"
            await ws.send(json.dumps({"op": "submit", "ref": ref, "agent": "echo", "input": {"q": n}, "subscribe": True}))
            short_job = (await until(lambda f, ref=ref: f.get("op") == "submitted" and f["ref"] == ref))["job"]
            seen: list[dict[str, Any]] = []
            while not seen or seen[-1]["type"] != "job.succeeded":
                frame = await until(lambda f, jid=short_job["id"]: f.get("op") == "event" and f["job_id"] == jid)
                seen.append(frame["event"])
            assert [e["type"] for e in seen] == ["execution.started", "job.succeeded"]
            assert seen[0]["payload"]["worker_id"] != long_worker  # not queued behind the long job
            shorts.append(short_job["id"])
    async with httpx.AsyncClient(base_url=up3.url, headers=up3.headers()) as c:
        waits = []
        for jid in shorts:
            short = (await c.get(f"/v1/jobs/{jid}")).json()
            waits.append(short["execution_started_at"] - short["created_at"])
        await c.post(f"/v1/jobs/{long_job['id']}/cancel")
    assert max(waits) < 0.100, f"the short jobs waited {[round(w * 1000, 1) for w in waits]} ms to start"
