"""Hostile input through every door of a real `tenure up`, on SQLite and PostgreSQL: lone surrogates, deep
nesting, NaN and Infinity, huge numbers, NUL characters, out-of-range cursors. Each gets a 4xx problem body (or a
WebSocket error frame on a socket that keeps serving), never a 5xx or a traceback, and nothing is written."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from tests.acceptance.up import KEYS, Up, store_url

pytestmark = pytest.mark.slow

IMPOSSIBLE = ["no-worker-has-this"]  # a job that requires it stays queued and unowned
DEEP = 50_000  # 100 KB of brackets: far under the body limit, far over Python's recursion limit


def deep(levels: int, inner: str = "") -> str:
    return "[" * levels + inner + "]" * levels


MANY = {f"field-{i}": 1 for i in range(50_000)}

# (what, the body as sent, status, problem type): the body goes out byte for byte, as a hostile client sends it.
HOSTILE_BODIES: list[tuple[str, bytes, int, str]] = [
    ("a lone surrogate in input", b'{"agent": "echo", "input": "\\ud800"}', 400, "bad-json"),
    ("a lone low surrogate in a nested input", b'{"agent": "echo", "input": {"a": ["x\\udfffy"]}}', 400, "bad-json"),
    ("a lone surrogate in an input key", b'{"agent": "echo", "input": {"\\udc00": 1}}', 400, "bad-json"),
    ("a lone surrogate as the agent", b'{"agent": "\\ud800"}', 400, "bad-json"),
    ("a lone surrogate as a field name", b'{"agent": "echo", "\\ud800": 1}', 400, "bad-json"),
    ("a lone surrogate as a tag", b'{"agent": "echo", "requires": ["\\ud800"]}', 400, "bad-json"),
    ("a reversed surrogate pair", b'{"agent": "echo", "input": "\\ude00\\ud83d"}', 400, "bad-json"),
    ("an encoded surrogate (CESU-8)", b'{"agent": "echo", "input": "\xed\xa0\x80"}', 400, "bad-json"),
    ("bytes that are not UTF-8", b'{"agent": "echo", "input": "\xff\xfe"}', 400, "bad-json"),
    ("a body nested 50,000 levels", deep(DEEP).encode(), 400, "too-deep"),
    ("input nested 50,000 levels", b'{"agent": "echo", "input": ' + deep(DEEP).encode() + b"}", 400, "too-deep"),
    ("input nested 500 levels", b'{"agent": "echo", "input": ' + deep(500).encode() + b"}", 400, "too-deep"),
    ("input nested 65 levels", b'{"agent": "echo", "input": ' + deep(65).encode() + b"}", 400, "too-deep"),
    ("deep objects", b'{"agent": "echo", "input": ' + b'{"a":' * 200 + b"1" + b"}" * 200 + b"}", 400, "too-deep"),
    ("NaN", b'{"agent": "echo", "input": NaN}', 400, "bad-json"),
    ("Infinity", b'{"agent": "echo", "input": [Infinity]}', 400, "bad-json"),
    ("-Infinity as a priority", b'{"agent": "echo", "priority": -Infinity}', 400, "bad-json"),
    ("a float past 64 bits", b'{"agent": "echo", "input": 1e999}', 400, "bad-json"),
    ("an integer of 5,000 digits", b'{"agent": "echo", "input": ' + b"9" * 5000 + b"}", 400, "bad-json"),
    ("a NUL in input", b'{"agent": "echo", "input": "a\\u0000b"}', 400, "nul-character"),
    ("a NUL in an input key", b'{"agent": "echo", "input": {"\\u0000": 1}}', 400, "nul-character"),
    ("a huge integer deadline", b'{"agent": "echo", "deadline_s": 1' + b"0" * 400 + b"}", 422, "invalid-request"),
    ("a huge integer priority", b'{"agent": "echo", "priority": 1' + b"0" * 4000 + b"}", 422, "invalid-request"),
    ("half a megabyte of field names", json.dumps({"agent": "echo", **MANY}).encode(), 422, "invalid-request"),
]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def up(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    d: Path = tmp_path_factory.mktemp(f"hostile-{request.param}")
    with store_url(request.param, d) as url:
        server = Up(url, d, workers=1)
        yield server
        assert server.stop() == 0, server.log()
        assert "Traceback" not in server.log()


def is_problem(r: httpx.Response, status: int, kind: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text[:500])
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert {"type", "title", "detail", "status"} <= set(body) and body["status"] == status, body
    if kind is not None:
        assert body["type"].endswith("/" + kind), body
    assert "Traceback" not in r.text and len(r.text) < 2000  # it quotes what was wrong, never all of it
    return body  # type: ignore[no-any-return]


async def job_count(up: Up) -> int:
    async with httpx.AsyncClient(base_url=up.url, headers=up.headers(None), timeout=30) as admin:
        return len((await admin.get("/v1/jobs", params={"limit": 500})).json()["jobs"])


async def wait_state(c: httpx.AsyncClient, job_id: str, states: set[str], timeout_s: float = 20) -> dict[str, Any]:
    async with asyncio.timeout(timeout_s):
        while True:
            job = (await c.get(f"/v1/jobs/{job_id}")).json()
            if job["state"] in states:
                return job  # type: ignore[no-any-return]
            await asyncio.sleep(0.05)


@pytest.mark.parametrize(("what", "body", "status", "kind"), HOSTILE_BODIES, ids=[c[0] for c in HOSTILE_BODIES])
async def test_a_hostile_submit_body_is_a_problem_and_writes_nothing(
    up: Up, what: str, body: bytes, status: int, kind: str
) -> None:
    before = await job_count(up)
    async with httpx.AsyncClient(base_url=up.url, headers=up.headers(), timeout=30) as c:
        r = await c.post("/v1/jobs", content=body, headers={"Content-Type": "application/json"})
        is_problem(r, status, kind)
        assert (await c.get("/healthz")).status_code == 200
    assert await job_count(up) == before


async def test_input_may_nest_64_levels_and_such_a_job_runs_and_renders(up: Up) -> None:
    async with httpx.AsyncClient(base_url=up.url, headers=up.headers(), timeout=30) as c:
        value: Any = "core"
        for _ in range(64):
            value = [value]
        r = await c.post("/v1/jobs", json={"agent": "echo", "input": value})
        assert r.status_code == 201, r.text
        done = await wait_state(c, r.json()["id"], {"succeeded", "failed", "dead"})
        assert done["state"] == "succeeded" and done["result"] == value
        too_deep = {"agent": "echo", "input": [value]}
        is_problem(await c.post("/v1/jobs", json=too_deep), 400, "too-deep")
        # A surrogate pair is one character, not a lone surrogate: accepted, and it comes back whole.
        r = await c.post("/v1/jobs", content=b'{"agent": "echo", "input": "\\ud83d\\ude00"}')
        assert r.status_code == 201 and r.json()["input"] == "\U0001f600"


async def test_hostile_input_and_approval_bodies_are_problems_and_reach_no_handler(up: Up) -> None:
    async with httpx.AsyncClient(base_url=up.url, headers=up.headers(), timeout=30) as c:
        job = (await c.post("/v1/jobs", json={"agent": "converse"})).json()
        await wait_state(c, job["id"], {"waiting"})
        for body, kind in [
            (b'{"input": "\\ud800"}', "bad-json"),
            (b'{"input": NaN}', "bad-json"),
            (b'{"input": 1e400}', "bad-json"),  # once stored as Infinity: not JSON, and PostgreSQL refuses it
            (b'{"input": "\\u0000"}', "nul-character"),
            (b'{"input": ' + deep(65).encode() + b"}", "too-deep"),
            (deep(DEEP).encode(), "too-deep"),
        ]:
            is_problem(await c.post(f"/v1/jobs/{job['id']}/input", content=body), 400, kind)
        for body, kind in [(b'{"comment": "\\udbff"}', "bad-json"), (deep(DEEP).encode(), "too-deep")]:
            is_problem(await c.post(f"/v1/jobs/{job['id']}/approve", content=body), 400, kind)
        assert (await c.post(f"/v1/jobs/{job['id']}/input", json={"input": "bye"})).status_code == 202
        done = await wait_state(c, job["id"], {"succeeded", "failed", "dead"})
        assert done["result"] == {"turns": 0}  # not one of the hostile inputs reached the handler


async def test_hostile_parameters_and_headers_are_problems(up: Up) -> None:
    async with httpx.AsyncClient(base_url=up.url, headers=up.headers(), timeout=30) as c:
        job = (await c.post("/v1/jobs", json={"agent": "echo", "input": 1})).json()
        await wait_state(c, job["id"], {"succeeded"})
        events = f"/v1/jobs/{job['id']}/events"
        for after in ["1-99999999999999999999999", "99999999999999999999-1", "1-" + "9" * 5000, "\u0663-1", "\u00b2-1"]:
            is_problem(await c.get(events, params={"format": "json", "after": after}), 400, "bad-cursor")
        for last_id in [b"1-99999999999999999999999", b"1-" + b"9" * 5000, b"\xc2\xb2-1", b"9223372036854775808-1"]:
            is_problem(await c.get(events, headers={"Last-Event-ID": last_id}), 400, "bad-cursor")
        is_problem(await c.get("/v1/jobs", params={"agent": "\x00"}), 400, "bad-parameter")  # was 503 on PostgreSQL
        is_problem(await c.get("/v1/jobs?state=%ED%A0%80"), 400, "bad-parameter")  # decoded as U+FFFD
        is_problem(await c.get("/v1/jobs", params={"limit": "9" * 5000}), 400, "bad-parameter")
        is_problem(await c.post(f"/v1/jobs/{job['id']}/cancel", params={"wait": "nan"}), 400, "bad-parameter")
        is_problem(await c.get("/v1/jobs/%ED%A0%80"), 404, "not-found")
        # Header bytes are Latin-1 to the gateway: never a surrogate, so these keys are just keys.
        queued = {"agent": "echo", "requires": IMPOSSIBLE}
        for key in [b"\xed\xa0\x80", "caf\u00e9".encode(), b"a\x01b"]:
            r = await c.post("/v1/jobs", json=queued, headers={"Idempotency-Key": key})
            assert r.status_code == 201, r.text
            again = await c.post("/v1/jobs", json=queued, headers={"Idempotency-Key": key})
            assert again.status_code == 200 and again.json()["id"] == r.json()["id"]


async def test_hostile_websocket_frames_get_error_frames_and_the_socket_keeps_serving(up: Up) -> None:
    before = await job_count(up)
    url = up.url.replace("http", "ws") + "/v1/ws"
    async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {KEYS['tenant-a']}"}) as ws:
        job = None
        for n, (frame, status, kind) in enumerate(
            [
                ('{"op": "submit", "agent": "echo", "input": "\\ud800"}', 400, "bad-json"),
                ('{"op": "submit", "agent": "echo", "input": {"\\udc00": 1}}', 400, "bad-json"),
                ('{"op": "submit", "agent": "echo", "idempotency_key": "\\ud800"}', 400, "bad-json"),
                ('{"op": "ping", "ref": "\\ud800"}', 400, "bad-json"),  # the ref is echoed: it must be text
                ('{"op": "\\ud800"}', 400, "bad-json"),
                ('{"op": "submit", "agent": "echo", "input": NaN}', 400, "bad-json"),
                ('{"op": "submit", "agent": "echo", "input": "\\u0000"}', 400, "nul-character"),
                (deep(DEEP), 400, "too-deep"),
                ('{"op": "submit", "agent": "echo", "input": ' + deep(65) + "}", 400, "too-deep"),
                ('{"op": "submit", "agent": "echo", "input": ' + "9" * 5000 + "}", 400, "bad-json"),
                ('{"op": "submit", "agent": "echo", "deadline_s": 1' + "0" * 400 + "}", 422, "invalid-request"),
                ('{"op": "subscribe", "job_id": "JOB", "after": "1-99999999999999999999999"}', 400, "bad-cursor"),
                ('{"op": "input", "job_id": "JOB", "input": Infinity}', 400, "bad-json"),
            ]
        ):
            if "JOB" in frame:
                if job is None:
                    await ws.send(json.dumps({"op": "submit", "ref": "ok", "agent": "echo", "input": 1}))
                    job = json.loads(await asyncio.wait_for(ws.recv(), 30))["job"]["id"]
                    before += 1
                frame = frame.replace("JOB", job)
            await ws.send(frame)
            reply = json.loads(await asyncio.wait_for(ws.recv(), 30))
            assert reply["op"] == "error" and reply["status"] == status, (n, frame[:80], reply)
            assert reply["type"].endswith("/" + kind) and {"title", "detail"} <= set(reply), reply
            await ws.send(json.dumps({"op": "ping", "ref": n}))
            assert json.loads(await asyncio.wait_for(ws.recv(), 30)) == {"op": "pong", "ref": n}
    assert await job_count(up) == before
