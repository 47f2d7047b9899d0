"""The agents of the namespace tests (tests/integration/test_hosts.py): `tests.integration.hosts_app:app`.

ticker       retry-safe: emit a `tick` every `every` s, each also written as a line to the `marks` file (an
             effect the test reads from the root namespace while the host is cut off); the first attempt runs
             until `seconds` passed or the file `until` exists, a later attempt stops after `then` s
ticker_once  the same, not retry-safe (an attempt lost with its host is `lost`, never run again)
echo         return the input
quota_call   hold one slot of the quota `key` for `hold` s
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from tenure.kernel.context import Context
from tenure.kernel.registry import Tenure

app = Tenure("hosts")


def _mark(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line)


async def _tick(ctx: Context, input: dict[str, Any]) -> dict[str, Any]:
    seconds = float(input.get("seconds", 1.0)) if ctx.attempt == 1 else float(input.get("then", 0.5))
    every = float(input.get("every", 0.1))
    marks, until = input.get("marks"), input.get("until")
    began = time.monotonic()
    n = 0
    while time.monotonic() - began < seconds:
        if until is not None and ctx.attempt == 1 and await ctx.to_thread(os.path.exists, until):
            break
        n += 1
        if marks is not None:
            await ctx.to_thread(_mark, marks, f"{ctx.execution_id} {ctx.epoch} {n} {time.time():.3f}\n")
        await ctx.emit("tick", {"n": n, "execution_id": ctx.execution_id})
        await asyncio.sleep(every)
    return {"ticks": n, "execution_id": ctx.execution_id, "worker_id": ctx.worker_id}


@app.agent("ticker", retry_safe=True, max_attempts=3, timeout=600)
async def ticker(ctx: Context, input: dict[str, Any]) -> dict[str, Any]:
    """Retry-safe ticks (see the module docstring)."""
    return await _tick(ctx, input)


@app.agent("ticker_once", timeout=600)
async def ticker_once(ctx: Context, input: dict[str, Any]) -> dict[str, Any]:
    """Ticks that must not run twice (see the module docstring)."""
    return await _tick(ctx, input)


@app.agent("echo")
async def echo(ctx: Context, input: Any) -> Any:
    """Return the input unchanged."""
    return input


@app.agent("quota_call", max_attempts=2, timeout=120)
async def quota_call(ctx: Context, input: dict[str, Any]) -> dict[str, Any]:
    """Hold one slot of the quota `key` for `hold` seconds (a model call under a global limit)."""
    async with ctx.quota(str(input["key"])):
        await asyncio.sleep(float(input.get("hold", 0.1)))
    return {"key": input["key"], "worker_id": ctx.worker_id}
