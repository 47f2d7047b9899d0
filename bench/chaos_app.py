"""The agents of the chaos run (`bench/chaos.py`): `chaos_app:app`, with `bench/` on PYTHONPATH.

    safe    retry-safe: progress events, a short sleep, an optional failure on its first attempt; its result
            is a pure function of its input
    effect  NOT retry-safe: appends one line to its own counter file (the external side effect, fsynced),
            half-way through; a run lost mid-way ends `lost`, and a second line is the failure to catch
    chat    the bundled `tenure.demos.examples:chat` (a streamed call to the mock model under the quota `llm:mock`,
            retry-safe), registered here with more attempts: Redis outages fail attempts that need a lease
    stream  retry-safe: `count` numbered `tick` events, paced, that SSE clients follow, drop and resume

Every input is chosen by the chaos run from its seed. The effect directory comes from `CHAOS_EFFECTS_DIR`
(not a `TENURE_*` variable: Tenure's settings refuse names they do not know).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from tenure import Context, Tenure
from tenure.contracts.errors import RetryableError
from tenure.demos.examples import chat as bundled_chat

app = Tenure("chaos")

# Timeouts well above any freeze the run injects; attempts well above the failures a job meets in one run
# (every Redis outage fails the attempts that wanted a lease at that moment).
TIMEOUT_S = 60
ATTEMPTS = 8


def effects_dir() -> Path:
    return Path(os.environ.get("CHAOS_EFFECTS_DIR", "/tmp/chaos-effects"))


@app.agent("safe", retry_safe=True, max_attempts=ATTEMPTS, timeout=TIMEOUT_S)
async def safe(ctx: Context, input: dict[str, Any]) -> dict[str, Any]:
    """Emit `steps` progress events `sleep_s / steps` apart; fail the first attempt when `fail_first`."""
    steps = int(input["steps"])
    for i in range(steps):
        await ctx.emit("progress", {"i": i})
        await asyncio.sleep(float(input["sleep_s"]) / steps)
    if input.get("fail_first") and ctx.attempt == 1:
        raise RetryableError("safe: failing the first attempt on purpose")
    return {"n": input["n"], "steps": steps}


def _append_effect(path: Path, line: str) -> None:
    # O_APPEND writes of one short line are atomic; fsync so that a SIGKILL right after cannot unmake it.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@app.agent("effect", max_attempts=3, timeout=TIMEOUT_S)
async def effect(ctx: Context, input: dict[str, Any]) -> dict[str, Any]:
    """Sleep `before_s`, perform the side effect (one line in `<effects dir>/<job id>`: execution, epoch,
    attempt, worker, wall time), sleep `after_s`.

    Not retry-safe and never raising by itself: the runtime must never start it a second time, whatever
    happens to the worker running it (a run lost after its start ends `lost`)."""
    await ctx.emit("effect.before", {"n": input["n"]})
    await asyncio.sleep(float(input["before_s"]))
    line = f"{ctx.execution_id} {ctx.epoch} {ctx.attempt} {ctx.worker_id} {time.time():.6f}\n"
    await ctx.to_thread(_append_effect, effects_dir() / ctx.job_id, line)
    await ctx.emit("effect.done", {"n": input["n"]})
    await asyncio.sleep(float(input["after_s"]))
    return {"n": input["n"], "effect": True}


app.agent("chat", retry_safe=True, max_attempts=ATTEMPTS, timeout=TIMEOUT_S)(bundled_chat)


@app.agent("stream", retry_safe=True, max_attempts=ATTEMPTS, timeout=TIMEOUT_S)
async def stream(ctx: Context, input: dict[str, Any]) -> dict[str, Any]:
    """Emit `count` `tick` events numbered from 0, `every_s` apart."""
    count = int(input["count"])
    for i in range(count):
        await ctx.emit("tick", {"i": i, "n": input["n"]})
        await asyncio.sleep(float(input["every_s"]))
    return {"n": input["n"], "count": count}
