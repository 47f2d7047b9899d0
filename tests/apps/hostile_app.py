"""Test agents that misbehave in every way a handler can, beside an ordinary one: none of them may end the
worker or another execution (tests/integration/test_hostile_handlers.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from tenure import Context, Tenure

app = Tenure("hostile")


class Unprintable(Exception):
    """An exception whose `str()` itself raises."""

    def __str__(self) -> str:
        raise RuntimeError("str() of this exception raises")


@app.agent("ordinary", timeout=60, max_attempts=1)
async def ordinary(ctx: Context, input: Any) -> dict[str, Any]:
    await ctx.emit("working")
    await asyncio.sleep(float(input.get("seconds", 0.5)))
    return {"ok": input.get("n")}


@app.agent("unprintable", max_attempts=1)
async def unprintable(ctx: Context, input: Any) -> None:
    await asyncio.sleep(0.05)
    raise Unprintable()


@app.agent("sys_exit", max_attempts=1)
async def sys_exit(ctx: Context, input: Any) -> None:
    await asyncio.sleep(0.05)
    raise SystemExit(3)


@app.agent("keyboard_interrupt", max_attempts=1)
async def keyboard_interrupt(ctx: Context, input: Any) -> None:
    await asyncio.sleep(0.05)
    raise KeyboardInterrupt


@app.agent("generator_exit", max_attempts=1)
async def generator_exit(ctx: Context, input: Any) -> None:
    await asyncio.sleep(0.05)
    raise GeneratorExit


@app.agent("sync_sys_exit", max_attempts=1)
def sync_sys_exit(ctx: Context, input: Any) -> None:
    raise SystemExit("from a thread")


@app.agent("swallows_cancellation", timeout=0.5, max_attempts=1)
async def swallows_cancellation(ctx: Context, input: Any) -> None:
    """Ignores the timeout's cancellation twice, then gives up: the execution must end on its own terms."""
    ignored = 0
    while ignored < 2:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            ignored += 1


@app.agent("never_stops", timeout=0.5, max_attempts=1)
async def never_stops(ctx: Context, input: Any) -> None:
    """Ignores every cancellation, forever (until the process ends)."""
    while True:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            pass


@app.agent("surrogate_result", max_attempts=1)
async def surrogate_result(ctx: Context, input: Any) -> dict[str, str]:
    return {"text": "\ud800"}


@app.agent("nul_error", max_attempts=1)
async def nul_error(ctx: Context, input: Any) -> None:
    raise ValueError("a\x00b \ud800 " + "x" * 100_000)


@app.agent("surrogate_event", max_attempts=1)
async def surrogate_event(ctx: Context, input: Any) -> None:
    await ctx.emit("message.delta", {"text": "\udfff"})


@app.agent("nan_usage", max_attempts=1)
async def nan_usage(ctx: Context, input: Any) -> dict[str, bool]:
    ctx.usage(input_tokens=float("nan"))
    return {"done": True}


@app.agent("nul_result", max_attempts=1)
async def nul_result(ctx: Context, input: Any) -> dict[str, str]:
    """PostgreSQL's json functions refuse U+0000: it must fail this job, not wedge the worker's writes."""
    return {"text": "a\x00b"}
