"""A coordinator agent: split a text into parts, count each part's words in a child job, gather, add up.

    python examples/coordinator.py                      # on ./coordinator.db (SQLite, no service needed)
    TENURE_DATABASE_URL=postgresql://... python examples/coordinator.py

The children are jobs like any other (any worker that serves `count_words` runs them); the coordinator waits for
them in `waiting`, holding no worker slot: this worker has two slots and runs the coordinator and its six children.
In production: `tenure worker --app examples.coordinator:app` on as many machines as you like (docs/coordinators.md).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import tenure
from tenure.app import open_backends
from tenure.settings import Settings
from tenure.worker import Worker, WorkerConfig

app = tenure.Tenure("coordinator")

TEXT = (
    "A coordinator is an agent that splits its work into child jobs. Each child is admitted by the same door as "
    "any job and runs on any worker. The coordinator waits for them without holding a worker slot. A retried "
    "coordinator spawns the same keys again and gets the same children back. Cancelling it cancels them. "
    "Then it adds up what they found."
)


@app.agent("count_words", retry_safe=True)
async def count_words(ctx: tenure.Context, input: dict[str, Any]) -> dict[str, Any]:
    """One child: count the words of one sentence."""
    await asyncio.sleep(0.1)  # stands in for a model call
    return {"sentence": input["sentence"][:30], "words": len(input["sentence"].split())}


@app.agent("word_count", retry_safe=True, timeout=120)
async def word_count(ctx: tenure.Context, input: dict[str, Any]) -> dict[str, Any]:
    """The coordinator: one child per sentence, keyed by its position (a retry gets the same children back)."""
    sentences = [s.strip() for s in input["text"].split(".") if s.strip()]
    handles = [await ctx.spawn("count_words", {"sentence": s}, key=f"sentence-{i}") for i, s in enumerate(sentences)]
    results = await ctx.gather(*handles)  # the job is `waiting` meanwhile: no worker slot, no quota lease
    return {"sentences": len(results), "words": sum(r["words"] for r in results)}


async def main() -> None:
    url = os.environ.get("TENURE_DATABASE_URL", "sqlite:///./coordinator.db")
    settings = Settings.from_env(database_url=url)
    backends = await open_backends(settings)
    stop = asyncio.Event()
    worker = Worker(backends, app, WorkerConfig(concurrency=2, heartbeat_s=1, claim_ttl_s=3, poll_s=0.1))
    running = asyncio.create_task(worker.run(stop))
    try:
        async with tenure.connect(app, url) as client:
            submitted = await client.submit("word_count", {"text": TEXT})
            job = await client.wait(submitted, timeout_s=60)
            print(f"{job.agent} {job.state.value} result={job.result}")
            detail = await client.service.job_detail(job.id)
            for child in detail.children or ():
                kid = await client.job(child.id)
                print(f"    child {child.id} {child.agent} {child.state.value} {kid.result}")
            waits = [e.type for e in await client.events(job) if e.type in ("job.waiting", "job.resumed")]
            print(f"    parent events: {' → '.join(waits)}")
    finally:
        stop.set()
        await running
        await backends.close()


if __name__ == "__main__":
    asyncio.run(main())
