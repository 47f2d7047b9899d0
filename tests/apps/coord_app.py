"""Test agents: a coordinator that fans out to `leaf` children and gathers them (docs/coordinators.md)."""

from __future__ import annotations

import asyncio
from typing import Any

from tenure import Context, PermanentError, Tenure

app = Tenure("coord")


@app.agent("leaf", retry_safe=True, max_attempts=5, timeout=120)
async def leaf(ctx: Context, input: Any) -> dict[str, Any]:
    """Sleep `sleep_s` (cancellable), then answer its index and the worker that ran it."""
    await asyncio.sleep(float(input.get("sleep_s", 0)))
    if input["i"] in input.get("fail", ()):
        raise PermanentError(f"leaf {input['i']} fails on purpose")
    return {"i": input["i"], "worker": ctx.worker_id}


@app.agent("coordinator", retry_safe=True, max_attempts=3, timeout=300)
async def coordinator(ctx: Context, input: Any) -> dict[str, Any]:
    """Spawn `n` leaves (keys part-0 ... part-n-1), gather them, and sum their indexes."""
    leaf = {"sleep_s": float(input.get("sleep_s", 0)), "fail": input.get("fail", [])}
    handles = [await ctx.spawn("leaf", {"i": i, **leaf}, key=f"part-{i}") for i in range(input["n"])]
    await ctx.emit("spawned", {"children": len(handles), "created": sum(h.created for h in handles)})
    results = await ctx.gather(*handles)
    return {
        "n": len(results),
        "sum": sum(r["i"] for r in results),
        "attempt": ctx.attempt,
        "workers": sorted({r["worker"] for r in results}),
    }
