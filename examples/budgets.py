"""Budgets: an agent's default budget stops a runaway job; a job's own budget overrides it limit by limit.

    python examples/budgets.py                      # on ./budgets.db (SQLite, no service needed)
    TENURE_DATABASE_URL=postgresql://... python examples/budgets.py

See docs/budgets.md.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import tenure
from tenure.app import open_backends
from tenure.settings import Settings
from tenure.worker import Worker, WorkerConfig

app = tenure.Tenure("budgets")


@app.agent("lookup_loop", max_attempts=1, budget={"tool_calls": 5, "tokens": 10_000})
async def lookup_loop(ctx: tenure.Context, input: dict[str, Any]) -> dict[str, Any]:
    """Call a tool `calls` times, each reporting 100 tokens: the agent's default budget allows 5 calls."""
    for n in range(1, int(input.get("calls", 8)) + 1):
        async with ctx.tool_call("lookup", {"n": n}) as call:
            ctx.usage(model="mock", input_tokens=90, output_tokens=10)
            call.result(f"hit {n}")
    return {"calls": input.get("calls", 8)}


async def main() -> None:
    url = os.environ.get("TENURE_DATABASE_URL", "sqlite:///./budgets.db")
    backends = await open_backends(Settings.from_env(database_url=url))
    stop = asyncio.Event()
    worker = Worker(backends, app, WorkerConfig(concurrency=2, heartbeat_s=1, claim_ttl_s=3))
    running = asyncio.create_task(worker.run(stop))
    try:
        async with tenure.connect(app, url) as client:
            jobs = {
                "agent default": await client.submit("lookup_loop", {"calls": 8}),  # stopped at 5 tool calls
                "own tool_calls=20": await client.submit("lookup_loop", {"calls": 8}, budget={"tool_calls": 20}),
                "own tokens=300": await client.submit("lookup_loop", {"calls": 8}, budget={"tokens": 300}),
            }
            for name, submitted in jobs.items():
                job = await client.wait(submitted, timeout_s=30)
                print(f"{name:18} {job.state.value:9} {job.error_code or ''} {job.error_message or job.result}")
    finally:
        stop.set()
        await running
        await backends.close()


if __name__ == "__main__":
    asyncio.run(main())
