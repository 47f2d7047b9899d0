"""The bundled example agents: `tenure.demos.examples:app`. Each one demonstrates one runtime behaviour.

echo                return the input
sleep               async sleep, emitting progress events           {"seconds": 1.0, "every": 0.2}
stream              emit `count` events as fast as possible          {"count": 1000}
flaky               fail the first N attempts, then succeed          {"fail_times": 2}
blocking            sync I/O through ctx.to_thread                   {"seconds": 0.2}
crash_after_effect  increment a counter file, then sleep (crash tests) {"counter": "/tmp/c", "seconds": 30}
journaled_steps     retry-safe: three journaled steps appending to a file, the second slow  {"path": "/tmp/j"}
converse            echo each input sent to the job until "bye"      (POST /v1/jobs/{id}/input)
publish             ask for an approval, then publish or not         (POST /v1/jobs/{id}/approve)
hang                sleep past its 0.5 s timeout (the circuit breaker counts the timeouts)
chat                stream a reply from the model at TENURE_MODEL_URL under the quota `llm:mock`
                                                                     {"prompt": "hello", "max_tokens": 16}
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import time
from typing import Any

from tenure.contracts.errors import RetryableError, StepUnknown
from tenure.kernel.context import Context
from tenure.kernel.registry import Tenure

app = Tenure("examples")


def _arg(input: Any, key: str, default: Any) -> Any:
    return input.get(key, default) if isinstance(input, dict) else default


@app.agent("echo")
async def echo(ctx: Context, input: Any) -> Any:
    """Return the input unchanged."""
    return input


@app.agent("sleep", timeout=3600)
async def sleep(ctx: Context, input: Any) -> dict[str, Any]:
    """Sleep `seconds` without blocking the loop, emitting a `progress` event every `every` seconds."""
    seconds = float(_arg(input, "seconds", 1.0))
    every = max(0.01, float(_arg(input, "every", 0.25)))
    start = time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds:
        await ctx.emit("progress", {"elapsed_s": round(elapsed, 3), "of_s": seconds})
        await asyncio.sleep(min(every, seconds - elapsed))
    return {"slept_s": seconds}


@app.agent("stream", timeout=3600)
async def stream(ctx: Context, input: Any) -> dict[str, Any]:
    """Emit `count` events of type `count` as fast as the runtime takes them."""
    count = int(_arg(input, "count", 1000))
    for i in range(count):
        await ctx.emit("count", {"i": i})
    return {"emitted": count}


@app.agent("flaky", max_attempts=5)
async def flaky(ctx: Context, input: Any) -> dict[str, Any]:
    """Raise a retryable error on the first `fail_times` attempts, then succeed."""
    fail_times = int(_arg(input, "fail_times", 1))
    if ctx.attempt <= fail_times:
        raise RetryableError(f"flaky: failing attempt {ctx.attempt} of the first {fail_times}")
    return {"succeeded_on_attempt": ctx.attempt}


def _blocking_io(seconds: float) -> float:
    # Stands in for a sync SDK call (object storage, sync HTTP): it holds its thread, never the loop.
    time.sleep(seconds)
    return seconds


@app.agent("blocking")
async def blocking(ctx: Context, input: Any) -> dict[str, Any]:
    """Do `seconds` of sync I/O through the bounded adapter (ctx.to_thread), never on the event loop."""
    seconds = float(_arg(input, "seconds", 0.2))
    async with ctx.external("tool"):  # timed as tenure_external_seconds{agent="blocking", kind="tool"}
        done = await ctx.to_thread(_blocking_io, seconds)
    return {"blocked_s": done}


def _increment(path: str) -> int:
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        value = int(f.read().strip() or 0) + 1
        f.seek(0)
        f.truncate()
        f.write(str(value))
        f.flush()
        os.fsync(f.fileno())
    return value


@app.agent("crash_after_effect", max_attempts=1)
async def crash_after_effect(ctx: Context, input: Any) -> dict[str, Any]:
    """Increment the counter file (an external side effect), then sleep: kill the worker meanwhile to see
    that the runtime never runs it twice (the job becomes `lost`)."""
    value = await ctx.to_thread(_increment, str(_arg(input, "counter", "/tmp/tenure-counter")))
    await ctx.emit("effect", {"counter": value})
    await asyncio.sleep(float(_arg(input, "seconds", 30.0)))
    return {"counter": value}


def _append_line(path: str, line: str, then_sleep_s: float = 0.0) -> str:
    with open(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
    time.sleep(then_sleep_s)
    return line


@app.agent("journaled_steps", max_attempts=3, retry_safe=True)
async def journaled_steps(ctx: Context, input: Any) -> dict[str, Any]:
    """Three journaled steps (`ctx.step`), each appending a line to the file `path`; the second sleeps `seconds`
    after its append on the first attempt (kill the worker then). Retry-safe: a lost run is requeued, a later
    attempt skips the steps recorded done, and is told (`StepUnknown`) of the one begun and never ended; it
    looks at the file, appends the line only if it is missing, and resolves the step."""
    path = str(_arg(input, "path", "/tmp/tenure-journal"))
    await ctx.step("fetch", _append_line, path, "fetch")
    await ctx.emit("step", {"done": "fetch", "attempt": ctx.attempt})
    try:
        await ctx.emit("step", {"begins": "publish", "attempt": ctx.attempt})
        await ctx.step("publish", _append_line, path, "publish", float(_arg(input, "seconds", 30.0)))
    except StepUnknown as exc:
        lines = (await ctx.to_thread(_read_text, path)).split()
        await ctx.emit("step.unknown", {"key": exc.key, "effect_found": "publish" in lines})
        if "publish" not in lines:
            await ctx.to_thread(_append_line, path, "publish")
        await ctx.resolve_step(exc.key, "publish")
    await ctx.step("notify", _append_line, path, "notify")
    return {"lines": (await ctx.to_thread(_read_text, path)).split()}


def _read_text(path: str) -> str:
    with open(path) as f:
        return f.read()


@app.agent("converse", timeout=3600)
async def converse(ctx: Context, input: Any) -> dict[str, Any]:
    """Wait for inputs (`ctx.next_input()`), answer each with a `message` event, stop at "bye". While it waits
    the job is `waiting` and holds no worker slot."""
    turns = 0
    while True:
        said = await ctx.next_input()
        if said == "bye":
            return {"turns": turns}
        turns += 1
        await ctx.emit("message", {"you_said": said, "turn": turns})


@app.agent("publish", timeout=3600)
async def publish(ctx: Context, input: Any) -> dict[str, Any]:
    """Draft, then wait for a human's approval (`ctx.approval`) before publishing."""
    draft = f"draft: {_arg(input, 'title', 'untitled')}"
    await ctx.emit("draft", {"text": draft})
    if await ctx.approval(f"publish {draft!r}?"):
        return {"published": draft}
    return {"published": None, "reason": "rejected"}


@app.agent("hang", timeout=0.5, max_attempts=1)
async def hang(ctx: Context, input: Any) -> dict[str, Any]:
    """Sleep past the agent's 0.5 s timeout: each run ends `dead` with error `timeout`, and the gateway's
    circuit breaker for `hang` opens after TENURE_BREAKER_THRESHOLD of them within the window."""
    await asyncio.sleep(float(_arg(input, "seconds", 10.0)))
    return {"woke": True}


# -- chat: a streamed model call under a global quota ------------------------------------------------------------
DEFAULT_MODEL_URL = "http://127.0.0.1:8001/v1"
_http: dict[str, Any] = {}


async def _model_client(ctx: Context) -> Any:
    """One httpx client per process. Built off the loop: creating it loads the TLS trust store from disk."""
    import httpx

    client = _http.get("client")
    if client is None:
        client = await ctx.to_thread(
            httpx.AsyncClient,
            timeout=httpx.Timeout(30.0, connect=5.0),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
        )
        _http["client"] = client
    return client


@app.agent("chat", timeout=300, max_attempts=5, retry_safe=True)
async def chat(ctx: Context, input: Any) -> dict[str, Any]:
    """Stream a chat completion from the OpenAI-compatible model at `TENURE_MODEL_URL` (default the mock model
    on port 8001) while holding one slot of the global quota `llm:mock`, emitting each token as a
    `message.delta` event. The quota keeps the fleet's requests in flight under the model's own limit, so it
    never answers 429; if it does anyway, the attempt fails and is retried. Retry-safe: a model call has no
    side effect, so an attempt lost with its worker is simply run again."""
    base = os.environ.get("TENURE_MODEL_URL", DEFAULT_MODEL_URL).rstrip("/")
    body = {
        "model": str(_arg(input, "model", "mock")),
        "messages": [{"role": "user", "content": str(_arg(input, "prompt", "hello from tenure"))}],
        "stream": True,
        "max_tokens": int(_arg(input, "max_tokens", 16)),
    }
    client = await _model_client(ctx)
    parts: list[str] = []
    usage: dict[str, Any] = {}
    async with ctx.quota(str(_arg(input, "quota", "llm:mock"))):
        async with client.stream("POST", f"{base}/chat/completions", json=body) as response:
            if response.status_code == 429:
                raise RetryableError("the model answered 429 (over its concurrency limit)")
            if response.status_code != 200:
                await response.aread()
                raise RetryableError(f"the model answered {response.status_code}: {response.text[:200]}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: ") :])
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices", []):
                    text = choice.get("delta", {}).get("content")
                    if text:
                        parts.append(text)
                        await ctx.emit("message.delta", {"text": text})
    if usage:
        ctx.usage(input_tokens=usage.get("prompt_tokens", 0), output_tokens=usage.get("completion_tokens", 0))
    return {"text": "".join(parts), "tokens": len(parts)}
