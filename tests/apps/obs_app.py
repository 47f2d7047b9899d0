"""Test-only agents for the observability tests (run by real `tenure worker` processes with
`--app tests.apps.obs_app:app`). Some of them break seed 000's rule on purpose."""

from __future__ import annotations

import asyncio
import fcntl
import json
import time
from typing import Any

from tenure.contracts.errors import PermanentError, RetryableError
from tenure.kernel.context import Context
from tenure.kernel.registry import Tenure

app = Tenure("obs-tests")


@app.agent("ticker", timeout=60)
async def ticker(ctx: Context, input: dict[str, Any]) -> dict[str, Any]:
    """A heartbeat-like ticker inside the worker: every `every` s, how late did the loop wake it?"""
    seconds, every = float(input["seconds"]), float(input.get("every", 0.02))
    loop = asyncio.get_running_loop()
    await ctx.emit("ticking", {})
    await ctx.flush()
    start = loop.time()
    max_late, ticks = 0.0, 0
    while loop.time() - start < seconds:
        due = loop.time() + every
        await asyncio.sleep(every)
        max_late = max(max_late, loop.time() - due)
        ticks += 1
    return {"max_late_s": max_late, "ticks": ticks}


@app.agent("block_on_loop")
async def block_on_loop(ctx: Context, input: dict[str, Any]) -> dict[str, Any]:
    """Seed 000's bug: a sync call straight inside `async def`, freezing the worker's loop."""
    time.sleep(float(input["seconds"]))  # noqa: ASYNC251 - the point of this agent
    return {"blocked_s": input["seconds"]}


@app.agent("block_in_thread")
async def block_in_thread(ctx: Context, input: dict[str, Any]) -> dict[str, Any]:
    """The fix: the same sync call through the bounded adapter, timed as an external tool call."""
    async with ctx.external("tool"):
        await ctx.to_thread(time.sleep, float(input["seconds"]))
    return {"blocked_s": input["seconds"]}


def _count(path: str, delta: int) -> dict[str, int]:
    """Concurrent executions in a file shared by every worker: {"current", "max", "total"}."""
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        state = json.loads(f.read() or '{"current": 0, "max": 0, "total": 0}')
        state["current"] += delta
        state["max"] = max(state["max"], state["current"])
        if delta > 0:
            state["total"] += 1
        f.seek(0)
        f.truncate()
        f.write(json.dumps(state))
    return dict(state)


@app.agent("hold_loop", max_attempts=3)
async def hold_loop(ctx: Context, input: dict[str, Any]) -> dict[str, Any]:
    """Count this execution in, freeze the loop for `seconds`, count it out."""
    await ctx.to_thread(_count, input["counter"], +1)
    await ctx.emit("holding", {})
    await ctx.flush()
    time.sleep(float(input["seconds"]))  # noqa: ASYNC251 - on purpose: no heartbeat can go out meanwhile
    try:
        await ctx.emit("released", {})
        await ctx.flush()
    finally:
        await asyncio.shield(ctx.to_thread(_count, input["counter"], -1))
    return {"held_s": input["seconds"]}


@app.agent("laggy", timeout=60)
async def laggy(ctx: Context, input: dict[str, Any]) -> dict[str, Any]:
    """Block the loop `block_s` out of every `block_s + gap_s`, `blocks` times: a loop that mostly runs late."""
    for _ in range(int(input["blocks"])):
        time.sleep(float(input["block_s"]))  # noqa: ASYNC251 - on purpose
        await asyncio.sleep(float(input["gap_s"]))
    return {"blocks": input["blocks"]}


@app.agent("model_call")
async def model_call(ctx: Context, input: dict[str, Any]) -> dict[str, Any]:
    """A stand-in model call timed with ctx.external("model"), streaming a few deltas."""
    async with ctx.external("model"):
        await asyncio.sleep(0.05)
    for i in range(3):
        await ctx.emit("message.delta", {"i": i})
    return {"ok": True}


@app.agent("fail_permanently")
async def fail_permanently(ctx: Context, input: Any) -> None:
    raise PermanentError("this agent always fails")


@app.agent("fail_once", max_attempts=3)
async def fail_once(ctx: Context, input: Any) -> dict[str, int]:
    if ctx.attempt == 1:
        raise RetryableError("first attempt fails")
    return {"attempt": ctx.attempt}
