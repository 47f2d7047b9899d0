"""Test agents of the audit chain and the effect journal (tests/integration/test_audit*.py)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from tenure import Context, RetryableError, StepUnknown, Tenure, tool

app = Tenure("audit")


@app.agent("researcher", timeout=60, max_attempts=3)
async def researcher(ctx: Context, input: Any) -> dict[str, Any]:
    """Per attempt: two tool calls (one raising inside its block), one piece of evidence and one usage report;
    attempts before `succeed_on` fail (a retry), the last returns."""
    async with ctx.tool_call("search", {"q": "tenure", "attempt": ctx.attempt}) as call:
        call.result({"hits": 3})
    try:
        async with ctx.tool_call("fetch", {"url": "http://x"}):
            raise ConnectionError("refused")
    except ConnectionError:
        pass
    await ctx.evidence("notes", {"attempt": ctx.attempt, "text": f"gathered in attempt {ctx.attempt}"})
    ctx.usage(model="gpt-test", input_tokens=100 * ctx.attempt, output_tokens=10)
    if ctx.attempt < int(input.get("succeed_on", 1)):
        raise RetryableError(f"attempt {ctx.attempt} fails on purpose")
    return {"ok": True}


def _append(path: str, line: str) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)
    return line


def _slow_append(path: str, line: str, marker: str, before_s: float, after_s: float) -> str:
    """The step the test kills: says it began (the marker names this process), pauses, appends, pauses."""
    _append(marker, f"{os.getpid()}")
    time.sleep(before_s)
    _append(path, line)
    time.sleep(after_s)
    return line


@app.agent("journaled", timeout=120, max_attempts=5, retry_safe=True)
async def journaled(ctx: Context, input: Any) -> dict[str, Any]:
    """Three journaled steps, each appending one line to `path`. The second is the slow one: a later attempt
    that finds it begun and never ended (StepUnknown) looks at the file, appends the line only if it is missing,
    and resolves the step; each StepUnknown is noted in `unknown` as `key started_at done|undone`."""
    path, marker = input["path"], input["marker"]
    one = await ctx.step("one", _append, path, "one")
    try:
        pauses = float(input.get("before_s", 0.05)), float(input.get("after_s", 0.5))
        two = await ctx.step("two", _slow_append, path, "two", marker, *pauses)
    except StepUnknown as exc:
        lines = (await ctx.to_thread(Path(path).read_text)).split()
        found = "two" in lines
        await ctx.to_thread(_append, input["unknown"], f"{exc.key} {exc.started_at} {'done' if found else 'undone'}")
        if not found:
            await ctx.to_thread(_append, path, "two")
        await ctx.resolve_step("two", "two")
        two = "two"
    three = await ctx.step("three", _append, path, "three")
    return {"steps": [one, two, three]}


@app.agent("frozen", timeout=120, max_attempts=3, retry_safe=True)
async def frozen(ctx: Context, input: Any) -> dict[str, Any]:
    """Writes one of each record, says so in `ready`, then waits for the file `go` and writes one of each
    again (named `late`): what a worker frozen in between and resumed after its job was reclaimed would add."""
    go = Path(input["go"])
    if ctx.attempt == 1:
        async with ctx.tool_call("early", {}) as call:
            call.result(1)
        await ctx.step("early", _append, input["effects"], "early")
        await ctx.evidence("early", 1)
        await ctx.to_thread(_append, input["ready"], str(os.getpid()))
        while not go.exists():
            await asyncio.sleep(0.02)
        async with ctx.tool_call("late", {}) as call:
            call.result(2)
        ctx.usage(model="late", input_tokens=1)
        await ctx.evidence("late", 2)
        await ctx.step("late", _append, input["effects"], "late")
        return {"attempt": 1}
    return {"attempt": ctx.attempt}


@app.agent("runaway", timeout=60, max_attempts=1)
async def runaway(ctx: Context, input: Any) -> None:
    """A loop calling a tool forever (each call reports 100 tokens of usage): only a budget stops it."""
    n = 0
    while True:
        n += 1
        async with ctx.tool_call("lookup", {"n": n}) as call:
            ctx.usage(model="gpt-test", input_tokens=90, output_tokens=10)
            call.result(n)
        await asyncio.sleep(0)


@app.agent("frugal", timeout=60, max_attempts=1, budget={"tokens": 300, "wall_s": 600})
async def frugal(ctx: Context, input: Any) -> int:
    """`calls` tool calls (10 by default), each reporting 100 tokens, under its agent's default budget of 300."""
    calls = int((input or {}).get("calls", 10))
    for n in range(1, calls + 1):
        async with ctx.tool_call("lookup", {"n": n}) as call:
            ctx.usage(model="gpt-test", input_tokens=90, output_tokens=10)
            call.result(n)
    return calls


@app.agent("concurrent_steps", timeout=60, max_attempts=1)
async def concurrent_steps(ctx: Context, input: Any) -> dict[str, Any]:
    """Two first steps at once, then the same keys again, then one key twice at once."""
    path = input["path"]

    async def effect(line: str) -> str:
        await asyncio.sleep(0.01)
        return await ctx.to_thread(_append, path, line)

    a, b = await asyncio.gather(ctx.step("a", effect, "a"), ctx.step("b", effect, "b"))
    again = [await ctx.step("a", effect, "a"), await ctx.step("b", effect, "b")]
    twice = await asyncio.gather(ctx.step("c", effect, "c"), ctx.step("c", effect, "c"), return_exceptions=True)
    return {"first": [a, b], "again": again, "twice": [repr(t) if isinstance(t, Exception) else t for t in twice]}


@tool()
async def lookup(ctx: Context, q: str, limit: int = 3) -> list[str]:
    return [f"{q}-{i}" for i in range(limit)]


@tool("word_count")
def count_words(ctx: Context, text: str) -> int:
    return len(text.split())


@app.agent("tooled", timeout=60, max_attempts=1)
async def tooled(ctx: Context, input: Any) -> dict[str, Any]:
    """Tool functions decorated with `tenure.tool`: each call is a tool_call record."""
    hits = await lookup(ctx, "tenure", limit=2)
    words = await count_words(ctx, "one two three")
    return {"hits": hits, "words": words}
