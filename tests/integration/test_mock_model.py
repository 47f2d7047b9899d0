"""The mock model as a real process driven over HTTP: OpenAI's wire format, its 429 limit, its counters."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from tests.integration.mockmodel import start_mock_model, stop_process

MAX_CONCURRENCY = 2
LATENCY_S = 0.1
TOKENS = 16  # the server's default reply length


@pytest.fixture(scope="module")
def mock_url() -> Iterator[str]:
    """`python -m tenure.demos.mock_model` on a free port (tests/integration/mockmodel.py); yield its base URL."""
    process, url = start_mock_model(MAX_CONCURRENCY, LATENCY_S * 1000, TOKENS)
    try:
        yield url.removesuffix("/v1")
    finally:
        stop_process(process)


@pytest.fixture
async def client(mock_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client on the shared server, whose counters start at zero for each test."""
    async with httpx.AsyncClient(base_url=mock_url, timeout=10) as http:
        reset = await http.post("/stats/reset")
        assert reset.status_code == 200
        yield http


def _chat(text: str, *, stream: bool, **extra: Any) -> dict[str, Any]:
    return {"model": "mock", "messages": [{"role": "user", "content": text}], "stream": stream, **extra}


async def test_models_lists_the_mock_model(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/models")
    assert response.status_code == 200
    assert [m["id"] for m in response.json()["data"]] == ["mock"]


async def test_a_streamed_reply_is_openai_chunks_then_usage_then_done(client: httpx.AsyncClient) -> None:
    body = {
        "model": "mock",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello there"},
            {"role": "assistant", "content": "hi"},
            {"role": "user", "content": [{"type": "text", "text": "alpha beta gamma"}]},
        ],
        "stream": True,
    }
    started = time.monotonic()
    first_token_after: float | None = None
    events: list[str] = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if not line:
                continue
            assert line.startswith("data: ")
            events.append(line.removeprefix("data: "))
            if first_token_after is None:
                first_token_after = time.monotonic() - started

    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "mock" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    deltas, final = chunks[:-1], chunks[-1]
    assert deltas[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["choices"][0]["finish_reason"] is None for c in deltas)
    text = "".join(c["choices"][0]["delta"]["content"] for c in deltas)
    words = "alpha beta gamma".split()
    assert text == " ".join(words[i % 3] for i in range(TOKENS))
    assert final["choices"][0]["finish_reason"] == "stop"
    assert final["usage"] == {"prompt_tokens": 8, "completion_tokens": TOKENS, "total_tokens": 8 + TOKENS}
    assert first_token_after is not None and first_token_after >= LATENCY_S * 0.9


async def test_a_plain_reply_is_a_chat_completion(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", json=_chat("one two", stream=False, max_tokens=3))
    assert response.status_code == 200
    reply = response.json()
    assert reply["object"] == "chat.completion"
    assert reply["choices"][0]["message"] == {"role": "assistant", "content": "one two one"}
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert reply["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}


async def test_requests_over_the_limit_get_429_and_the_stats_match_what_clients_saw(
    client: httpx.AsyncClient,
) -> None:
    async def one(i: int, stream: bool) -> int:
        async with client.stream("POST", "/v1/chat/completions", json=_chat(f"q{i}", stream=stream)) as r:
            body = await r.aread()
            if r.status_code == 429:
                assert json.loads(body)["error"]["code"] == "rate_limit_exceeded"
            return r.status_code

    statuses = await asyncio.gather(*(one(i, stream=i % 2 == 0) for i in range(5)))
    assert set(statuses) <= {200, 429}
    rejected = statuses.count(429)
    assert 1 <= rejected <= 5 - MAX_CONCURRENCY
    stats = (await client.get("/stats")).json()
    assert stats == {
        "requests": 5,
        "rejected_429": rejected,
        "max_in_flight": MAX_CONCURRENCY,
        "in_flight": 0,
    }


async def test_stats_reset_zeroes_the_counters(client: httpx.AsyncClient) -> None:
    await client.post("/v1/chat/completions", json=_chat("x", stream=False))
    assert (await client.get("/stats")).json()["requests"] == 1
    reset = await client.post("/stats/reset")
    assert reset.json() == {"requests": 0, "rejected_429": 0, "max_in_flight": 0, "in_flight": 0}
    assert (await client.get("/stats")).json() == reset.json()


async def test_malformed_requests_get_a_400_json_error(client: httpx.AsyncClient) -> None:
    bad_bodies: list[bytes] = [
        b"not json",
        b"[]",
        json.dumps({"model": "mock"}).encode(),
        json.dumps({"messages": []}).encode(),
        json.dumps({"messages": [{"content": "no role"}]}).encode(),
        json.dumps({**_chat("x", stream=False), "stream": "yes"}).encode(),
        json.dumps(_chat("x", stream=False, max_tokens=0)).encode(),
    ]
    for body in bad_bodies:
        response = await client.post("/v1/chat/completions", content=body)
        assert response.status_code == 400, body
        assert response.json()["error"]["type"] == "invalid_request_error"
    stats = (await client.get("/stats")).json()
    assert stats["requests"] == len(bad_bodies)
    assert stats["max_in_flight"] == 0


async def test_a_client_that_leaves_mid_stream_frees_its_slot(client: httpx.AsyncClient) -> None:
    async with client.stream("POST", "/v1/chat/completions", json=_chat("bye", stream=True)) as response:
        async for _ in response.aiter_lines():
            break  # leave after the first token: closing the response drops the connection
    deadline = time.monotonic() + 5
    while (await client.get("/stats")).json()["in_flight"] != 0:
        assert time.monotonic() < deadline, "the abandoned stream still holds its slot"
        await asyncio.sleep(0.02)
