"""The agents the labs run (`tenure.demos.labs.agents:app`)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import tenure

app = tenure.Tenure()


@app.agent("lab_block", timeout=120, max_attempts=1)
async def lab_block(ctx: tenure.Context, input: dict[str, Any]) -> dict[str, Any]:
    """The same synchronous work, on the event loop (`mode: loop`) or through `ctx.to_thread` (`mode: thread`)."""
    seconds = float(input.get("block_ms", 300)) / 1000
    for i in range(int(input.get("blocks", 6))):
        if input.get("mode") == "loop":
            # On purpose: the first half of the lab shows what a blocking call on the loop costs the worker.
            time.sleep(seconds)  # noqa: ASYNC251
        else:
            await ctx.to_thread(time.sleep, seconds)
        await ctx.emit("block.done", {"i": i})
    return {"mode": input.get("mode")}


@app.agent("lab_sleep", timeout=120, max_attempts=1)
async def lab_sleep(ctx: tenure.Context, input: dict[str, Any]) -> dict[str, Any]:
    """Sleep `seconds` (without blocking the loop), with a progress event every half second."""
    seconds = float(input.get("seconds", 1.0))
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        await asyncio.sleep(min(0.5, left))
        await ctx.emit("progress", {"left_s": round(max(0.0, end - time.monotonic()), 2)})
    return {"slept_s": seconds}


@app.agent("lab_victim", timeout=60, max_attempts=3)
async def lab_victim(ctx: tenure.Context, input: dict[str, Any]) -> dict[str, Any]:
    """A short job that the freezing worker of the `owner` lab claims (its fault hook names this agent)."""
    await asyncio.sleep(float(input.get("seconds", 0.3)))
    return {"ran": True}


@app.agent("lab_hold", timeout=60, max_attempts=1)
async def lab_hold(ctx: tenure.Context, input: dict[str, Any]) -> dict[str, Any]:
    """Hold a slot of the quota `lab:pool` for `seconds`; with `crash`, SIGKILL this worker while holding it."""
    async with ctx.quota("lab:pool"):
        await ctx.emit("quota.acquired", {})
        await asyncio.sleep(float(input.get("seconds", 1.0)))
        if input.get("crash"):
            os.kill(os.getpid(), signal.SIGKILL)  # no finally runs: the holder is gone, its lease is not released
    await ctx.emit("quota.released", {})
    return {"held_s": input.get("seconds", 1.0)}
