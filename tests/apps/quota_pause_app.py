"""Test agents: a quota held across a human approval (seed 003's pause / resume)."""

from __future__ import annotations

from typing import Any

from tenure import Context, Tenure

app = Tenure("quota-pause")


@app.agent("hold_and_ask", timeout=120, max_attempts=1)
async def hold_and_ask(ctx: Context, input: Any) -> dict[str, Any]:
    """Hold the only slot of `k`, then wait for an approval: the slot must be free while it waits."""
    async with ctx.quota("k", wait=False):
        await ctx.emit("holding")
        approved = await ctx.approval("go on?")
        await ctx.emit("resumed", {"approved": approved})
    return {"approved": approved}


@app.agent("take", timeout=60, max_attempts=1)
async def take(ctx: Context, input: Any) -> dict[str, Any]:
    """Take the slot of `k` at once or fail (wait=False)."""
    async with ctx.quota("k", wait=False):
        return {"took": True}
