"""A mock OpenAI-compatible chat model: fixed latency, deterministic replies, a hard concurrency limit.

Seed 000 isolates a runtime's own stalls from model variance by swapping the model for "a mock with fixed
latency and fixed replies"; seed 000's third layer is about an upstream that answers 429 as soon as more
than its global quota of requests are in flight. This server is both: it streams `chat.completion.chunk`
events like OpenAI, answers `429` once more than `max_concurrency` requests are in flight, and counts what
it did so a test can compare the model's view with the clients' (`GET /stats`).

    python -m tenure.demos.mock_model --port 8001 --max-concurrency 4 --latency-ms 200 --tokens 16

Endpoints: `POST /v1/chat/completions` (stream or not), `GET /v1/models`, `GET /stats`, `POST /stats/reset`.
The counters live in this one process; run one server process per mock model (never several workers).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

MODEL_ID = "mock"
"""The one model id the server lists; requests may name any model and get it echoed back."""


@dataclass(slots=True)
class MockModelStats:
    """What the server did since start (or the last reset)."""

    requests: int = 0
    """Chat completion requests received, whatever their answer (200, 400 or 429)."""
    rejected_429: int = 0
    """Requests answered `429` because `max_concurrency` requests were already in flight."""
    max_in_flight: int = 0
    """The highest number of admitted requests in flight at once."""
    in_flight: int = 0
    """Admitted requests whose reply has not finished yet."""


class _BadRequest(Exception):
    """A request body the OpenAI API would refuse with 400; the message says why."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class _Completion:
    """A validated request, reduced to what the reply depends on."""

    model: str
    stream: bool
    prompt_tokens: int
    reply: list[str]  # one entry per streamed token, already spaced: ["hello", " world", ...]


def _error_body(message: str, type_: str, code: str | None, param: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error object."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _text_of(content: object, where: str) -> str:
    """The text of a message's content: a string, a list of content parts, or null."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict):
                raise _BadRequest(f"{where} must be a string or a list of content parts", where)
            if part.get("type") == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise _BadRequest(f"{where}: a text part needs a string 'text'", where)
                texts.append(text)
        return " ".join(texts)
    raise _BadRequest(f"{where} must be a string or a list of content parts", where)


def _positive_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    # bool is an int in Python, but `true` is not a token count.
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise _BadRequest(f"'{name}' must be a positive integer", name)
    return value


def _parse(raw: bytes, tokens: int) -> _Completion:
    """Validate a chat completion request and derive its deterministic reply."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _BadRequest(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise _BadRequest("the request body must be a JSON object")
    model = body.get("model", MODEL_ID)
    if not isinstance(model, str):
        raise _BadRequest("'model' must be a string", "model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _BadRequest("'stream' must be a boolean", "stream")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _BadRequest("'messages' must be a non-empty array", "messages")
    prompt_tokens = 0
    last_user = ""
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _BadRequest(f"messages[{i}] must be an object with a string 'role'", f"messages[{i}]")
        text = _text_of(message.get("content"), f"messages[{i}].content")
        prompt_tokens += len(text.split())
        if message["role"] == "user":
            last_user = text
    limit = _positive_int(body, "max_completion_tokens") or _positive_int(body, "max_tokens")
    count = min(tokens, limit) if limit is not None else tokens
    # Echo the last user message's words, cycled to `count` tokens: the same request, the same reply.
    words = last_user.split() or [MODEL_ID]
    reply = [words[i % len(words)] if i == 0 else " " + words[i % len(words)] for i in range(count)]
    return _Completion(model=model, stream=stream, prompt_tokens=prompt_tokens, reply=reply)


class _HeldStream(StreamingResponse):
    """A streaming response that gives its concurrency slot back when the stream ends, however it ends.

    The slot is released here rather than in the generator because Starlette abandons a generator without
    closing it when the client disconnects mid-send; its `finally` would then run only at garbage collection.
    """

    def __init__(self, chunks: AsyncGenerator[bytes, None], release: Callable[[], None]) -> None:
        super().__init__(chunks, media_type="text/event-stream", headers={"cache-control": "no-cache"})
        self._chunks = chunks
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()
            await self._chunks.aclose()


class MockModel:
    """The server's state: its settings, the in-flight count and the counters."""

    def __init__(self, max_concurrency: int, latency_ms: float, tokens: int) -> None:
        """`max_concurrency` requests may be in flight; the first token comes after `latency_ms` and the
        other `tokens - 1` follow `latency_ms / tokens` apart (a whole reply takes just under twice
        `latency_ms`)."""
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if latency_ms < 0:
            raise ValueError(f"latency_ms must be >= 0, got {latency_ms}")
        if tokens < 1:
            raise ValueError(f"tokens must be >= 1, got {tokens}")
        self.max_concurrency = max_concurrency
        self.latency_s = latency_ms / 1000
        self.tokens = tokens
        self.stats = MockModelStats()
        self._next_id = 0

    # -- admission -------------------------------------------------------------------------------------------
    def _try_enter(self) -> bool:
        # One event loop serves every request, so a plain counter is exact: no await between test and set.
        if self.stats.in_flight >= self.max_concurrency:
            self.stats.rejected_429 += 1
            return False
        self.stats.in_flight += 1
        self.stats.max_in_flight = max(self.stats.max_in_flight, self.stats.in_flight)
        return True

    def _leave(self) -> None:
        self.stats.in_flight -= 1

    # -- endpoints -------------------------------------------------------------------------------------------
    async def chat_completions(self, request: Request) -> Response:
        """`POST /v1/chat/completions`: one `chat.completion`, or `chat.completion.chunk` events."""
        self.stats.requests += 1
        try:
            ask = _parse(await request.body(), self.tokens)
        except _BadRequest as exc:
            return JSONResponse(_error_body(str(exc), "invalid_request_error", None, exc.param), 400)
        if not self._try_enter():
            message = f"Rate limit reached: {self.max_concurrency} requests already in flight on {ask.model}"
            return JSONResponse(_error_body(message, "requests", "rate_limit_exceeded"), 429, headers={"retry-after": "1"})
        self._next_id += 1
        completion_id = f"chatcmpl-mock{self._next_id:08d}"
        if ask.stream:
            return _HeldStream(self._stream(ask, completion_id), self._leave)
        try:
            await asyncio.sleep(self._total_delay(len(ask.reply)))
        finally:
            self._leave()
        return JSONResponse(
            {
                "id": completion_id,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": ask.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "".join(ask.reply)},
                        "logprobs": None,
                        "finish_reason": "stop",
                    }
                ],
                "usage": self._usage(ask),
            }
        )

    async def models(self, request: Request) -> Response:
        """`GET /v1/models`: the one model, `mock`."""
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "tenure"}],
            }
        )

    async def get_stats(self, request: Request) -> Response:
        """`GET /stats`: the counters as JSON."""
        return JSONResponse(asdict(self.stats))

    async def reset_stats(self, request: Request) -> Response:
        """`POST /stats/reset`: zero the counters. Requests still in flight stay counted in `in_flight`,
        so the count comes back to zero when they finish instead of going negative."""
        in_flight = self.stats.in_flight
        self.stats = MockModelStats(in_flight=in_flight, max_in_flight=in_flight)
        return JSONResponse(asdict(self.stats))

    # -- the reply -------------------------------------------------------------------------------------------
    def _gap(self, count: int) -> float:
        return self.latency_s / count

    def _total_delay(self, count: int) -> float:
        return self.latency_s + self._gap(count) * (count - 1)

    @staticmethod
    def _usage(ask: _Completion) -> dict[str, int]:
        completion = len(ask.reply)
        return {
            "prompt_tokens": ask.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": ask.prompt_tokens + completion,
        }

    async def _stream(self, ask: _Completion, completion_id: str) -> AsyncGenerator[bytes, None]:
        created = int(time.time())

        def chunk(delta: dict[str, str], finish: str | None, usage: dict[str, int] | None = None) -> bytes:
            event: dict[str, Any] = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": ask.model,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            }
            if usage is not None:
                event["usage"] = usage
            return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"

        await asyncio.sleep(self.latency_s)
        for i, token in enumerate(ask.reply):
            if i:
                await asyncio.sleep(self._gap(len(ask.reply)))
            yield chunk({"role": "assistant", "content": token} if i == 0 else {"content": token}, None)
        yield chunk({}, "stop", self._usage(ask))
        yield b"data: [DONE]\n\n"


def create_app(max_concurrency: int, latency_ms: float, tokens: int = 16) -> Starlette:
    """The mock model as an ASGI app; `app.state.mock` is its `MockModel` (settings and counters)."""
    mock = MockModel(max_concurrency, latency_ms, tokens)
    app = Starlette(
        routes=[
            Route("/v1/chat/completions", mock.chat_completions, methods=["POST"]),
            Route("/v1/models", mock.models, methods=["GET"]),
            Route("/stats", mock.get_stats, methods=["GET"]),
            Route("/stats/reset", mock.reset_stats, methods=["POST"]),
        ]
    )
    app.state.mock = mock
    return app


async def run_mock_model(
    host: str,
    port: int,
    max_concurrency: int,
    latency_ms: float,
    tokens: int = 16,
    *,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve the mock model until SIGINT or SIGTERM. `port=0` picks a free port; `on_ready` receives the
    base URL (`http://host:port`) once the socket listens."""
    app = create_app(max_concurrency, latency_ms, tokens)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # Bind here rather than in uvicorn so that the real port is known before serving (port 0 races nothing).
    # The protocol is named explicitly: asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP,
    # and without it every keep-alive reply waits ~40 ms for a delayed ACK between its header and body.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
        bound = sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            # A stream still running at shutdown is cut after a second: a mock must stop promptly.
            timeout_graceful_shutdown=1,
        )
        server = uvicorn.Server(config)
        if on_ready is not None:
            shown = f"[{host}]" if family == socket.AF_INET6 else host
            on_ready(f"http://{shown}:{bound}")
        await server.serve(sockets=[sock])
    finally:
        sock.close()


def serve(host: str, port: int, max_concurrency: int, latency_ms: float, tokens: int) -> None:
    """Run the mock model in the foreground (the `tenure mock-model` command). Prints its URL when ready."""

    def announce(url: str) -> None:
        print(f"mock model listening on {url}", flush=True)

    asyncio.run(run_mock_model(host, port, max_concurrency, latency_ms, tokens, on_ready=announce))


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m tenure.demos.mock_model`: parse flags and serve."""
    parser = argparse.ArgumentParser(
        prog="python -m tenure.demos.mock_model",
        description="A mock OpenAI-compatible chat model with fixed latency and a concurrency limit.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001, help="0 picks a free port (printed when ready)")
    parser.add_argument("--max-concurrency", type=int, default=4, help="requests in flight before 429")
    parser.add_argument("--latency-ms", type=float, default=200.0, help="delay of the first token")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per reply")
    args = parser.parse_args(argv)
    try:
        serve(args.host, args.port, args.max_concurrency, args.latency_ms, args.tokens)
    except ValueError as exc:
        parser.error(str(exc))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
