"""Quickstart: define agents, run a worker in this process, submit jobs and read their history.

    python examples/quickstart.py                      # on ./quickstart.db (SQLite, no service needed)
    TENURE_DATABASE_URL=postgresql://... python examples/quickstart.py

In production the worker runs as its own process (`tenure worker --app examples.quickstart:app`), on as many
machines as you like; submitting is the same call.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import tenure
from tenure.app import open_backends
from tenure.settings import Settings
from tenure.worker import Worker, WorkerConfig

app = tenure.Tenure("quickstart")


@app.agent("greet")
async def greet(ctx: tenure.Context, input: dict[str, Any]) -> dict[str, Any]:
    """Stream a greeting word by word, then return it."""
    words = ["hello", input.get("name", "world")]
    for word in words:
        await ctx.emit("message.delta", {"text": word})
    return {"greeting": " ".join(words)}


@app.agent("unreliable", max_attempts=3)
async def unreliable(ctx: tenure.Context, input: dict[str, Any]) -> dict[str, Any]:
    """Fail the first attempt: the runtime retries it after a backoff."""
    if ctx.attempt == 1:
        raise tenure.RetryableError("the first attempt always fails")
    return {"attempt": ctx.attempt}


async def main() -> None:
    url = os.environ.get("TENURE_DATABASE_URL", "sqlite:///./quickstart.db")
    settings = Settings.from_env(database_url=url)
    backends = await open_backends(settings)
    stop = asyncio.Event()
    worker = Worker(backends, app, WorkerConfig(concurrency=4, heartbeat_s=1, claim_ttl_s=3, retry_base_s=0.2))
    running = asyncio.create_task(worker.run(stop))
    try:
        async with tenure.connect(app, url) as client:
            admitted = [
                await client.submit("greet", {"name": "Tenure"}, idempotency_key="quickstart-greet"),
                await client.submit("unreliable", {}),
            ]
            for submitted in admitted:
                job = await client.wait(submitted, timeout_s=30)
                print(f"{job.agent:10} {job.state.value:9} attempts={job.attempts} result={job.result}")
                for event in await client.events(job):
                    print(f"    {event.cursor:>5} {event.type:20} {event.payload}")
    finally:
        stop.set()
        await running
        await backends.close()


if __name__ == "__main__":
    asyncio.run(main())
