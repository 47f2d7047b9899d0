"""The agent of the concurrency-key tests (tests/integration/test_concurrency_keys.py): it records the start and
the end of each execution in a file (one line each, appended: O_APPEND writes this short are never interleaved),
which the test reads to check that no two jobs of one key ever ran at once."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from tenure import Context, Tenure

app = Tenure("keys")


def _record(what: str, job_id: str, key: str) -> None:
    line = json.dumps({"what": what, "job": job_id, "key": key, "t": time.time()}) + "\n"
    fd = os.open(os.environ["KEYS_TEST_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@app.agent("turn", max_attempts=1, timeout=60)
async def turn(ctx: Context, input: Any) -> dict[str, Any]:
    """One turn of a conversation: `seconds` of work, recorded (a cancellation ends it, recorded too)."""
    _record("start", ctx.job_id, input["key"])
    try:
        await asyncio.sleep(float(input.get("seconds", 0.1)))
    finally:
        _record("end", ctx.job_id, input["key"])
    return {"key": input["key"]}


@app.agent("deep", max_attempts=1, max_queued=5, degrade_to="fast")
async def deep(ctx: Context, input: Any) -> dict[str, Any]:
    """A costly agent with a bounded queue; when it is full its jobs run as `fast`."""
    return {"mode": "deep"}


@app.agent("fast", max_attempts=1, max_queued=5)
async def fast(ctx: Context, input: Any) -> dict[str, Any]:
    """The fallback, with a bounded queue of its own: when both are full, admission answers 429."""
    return {"mode": "fast"}
