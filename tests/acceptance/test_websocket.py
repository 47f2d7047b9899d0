"""WS /v1/ws: submit, subscribe with a cursor, cancel and input on one socket; bad frames; slow readers."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from websockets.asyncio.client import ClientConnection

from tests.acceptance.up import KEYS, Up

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    d: Path = tmp_path_factory.mktemp("ws")
    server = Up(f"sqlite:///{d}/tenure.db", d, workers=1)
    yield server
    assert server.stop() == 0, server.log()


def connect(up: Up, key: str | None = KEYS["tenant-a"], **kw: Any) -> Any:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return websockets.connect(up.url.replace("http", "ws") + "/v1/ws", additional_headers=headers, **kw)


async def recv(ws: ClientConnection) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), 30))  # type: ignore[no-any-return]


async def test_one_socket_submits_subscribes_resumes_and_controls(up: Up) -> None:
    async with connect(up) as ws:
        await ws.send(
            json.dumps(
                {
                    "op": "submit",
                    "ref": 1,
                    "agent": "sleep",
                    "input": {"seconds": 0.3, "every": 0.1},
                    "subscribe": True,
                }
            )
        )
        submitted = await recv(ws)
        assert submitted["op"] == "submitted" and submitted["ref"] == 1 and submitted["created"]
        job_id = submitted["job"]["id"]
        assert (await recv(ws))["op"] == "subscribed"
        events = []
        while True:
            f = await recv(ws)
            if f["op"] == "end":
                break
            events.append(f["event"])
        assert events[-1]["type"] == "job.succeeded"
        await ws.send(json.dumps({"op": "subscribe", "job_id": job_id, "after": events[1]["id"]}))
        assert (await recv(ws))["op"] == "subscribed"
        again = []
        while (f := await recv(ws))["op"] != "end":
            again.append(f["event"])
        assert again == events[2:]
        await ws.send(json.dumps({"op": "cancel", "ref": 2, "job_id": job_id}))
        assert (await recv(ws)) == {"op": "cancel", "ref": 2, "job_id": job_id, "outcome": "already_finished"}

        await ws.send(json.dumps({"op": "submit", "ref": 3, "agent": "converse"}))
        conv = (await recv(ws))["job"]["id"]
        await ws.send(json.dumps({"op": "input", "ref": 4, "job_id": conv, "input": "bye"}))
        assert (await recv(ws))["outcome"] == "requested"
        await ws.send(json.dumps({"op": "subscribe", "job_id": conv}))
        types = []
        while (f := await recv(ws))["op"] != "end":
            if f["op"] == "event":
                types.append(f["event"]["type"])
        assert types[-1] == "job.succeeded"


async def test_bad_frames_get_errors_and_the_socket_keeps_serving(up: Up) -> None:
    async with connect(up) as ws:
        for frame, status in [
            ("{not json", 400),
            ("[1,2]", 400),
            ('{"op": 5}', 400),
            ('{"op": "dance"}', 400),
            ('{"op": "submit", "agent": "nope"}', 422),
            ('{"op": "submit", "agent": "echo", "priority": "x"}', 422),
            ('{"op": "subscribe"}', 400),
            ('{"op": "subscribe", "job_id": "nope"}', 404),
            ('{"op": "cancel", "job_id": "00000000-0000-7000-8000-000000000000"}', 404),
        ]:
            await ws.send(frame)
            reply = await recv(ws)
            assert reply["op"] == "error" and reply["status"] == status, (frame, reply)
            assert {"type", "title", "detail"} <= set(reply)
        await ws.send(json.dumps({"op": "submit", "agent": "echo", "input": 1}))
        job_id = (await recv(ws))["job"]["id"]
        await ws.send(json.dumps({"op": "subscribe", "job_id": job_id, "after": "bad"}))
        reply = await recv(ws)
        assert reply["op"] == "error" and reply["status"] == 400 and "cursor" in reply["detail"]
        await ws.send(json.dumps({"op": "ping", "ref": "p"}))
        assert await recv(ws) == {"op": "pong", "ref": "p"}
    async with connect(up) as ws:
        await ws.send(b"\x00\x01")
        with pytest.raises(websockets.ConnectionClosed) as info:
            await recv(ws)
        assert info.value.rcvd is not None and info.value.rcvd.code == 1003
    async with connect(up, max_size=None) as ws:
        await ws.send("x" * (3 * 1024 * 1024))  # over the server's frame limit
        with pytest.raises(websockets.ConnectionClosed) as info:
            await recv(ws)
        assert info.value.rcvd is not None and info.value.rcvd.code == 1009


async def test_a_socket_without_a_valid_key_is_refused(up: Up) -> None:
    for key in (None, "wrong-key-123"):
        with pytest.raises(websockets.InvalidStatus) as info:
            async with connect(up, key):
                pass
        assert info.value.response.status_code == 403


def _client_frame(text: str) -> bytes:
    """One masked text frame, as a client must send it (RFC 6455 5.2)."""
    data = text.encode()
    mask = os.urandom(4)
    n = len(data)
    head = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big"))
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))


async def test_a_socket_that_never_reads_is_closed_and_others_are_served(up: Up) -> None:
    # A raw client with a tiny receive buffer that upgrades, subscribes to a big stream, and never reads again.
    reader, writer = await asyncio.open_connection("127.0.0.1", up.port)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        (
            f"GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1:{up.port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Authorization: Bearer {KEYS['tenant-a']}\r\n\r\n"
        ).encode()
    )
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101")
    writer.write(
        _client_frame(json.dumps({"op": "submit", "agent": "stream", "input": {"count": 60000}, "subscribe": True}))
    )
    await writer.drain()
    try:
        async with httpx.AsyncClient(base_url=up.url, headers=up.headers(), timeout=10) as c:
            for _ in range(600):
                assert (await c.get("/healthz")).status_code == 200  # others are served meanwhile
                if "slow consumer" in up.log():
                    break
                await asyncio.sleep(0.1)
        assert "slow consumer" in up.log()
    finally:
        writer.close()
    assert "Traceback" not in up.log()
