"""A runnable example of a global quota: `chat` jobs share `llm:mock=4` in front of a model that answers 429
beyond 4 requests in flight.

    .venv/bin/python examples/quota_chat.py            # SQLite file in /tmp, leases in its `leases` table
    TENURE_REDIS_URL=redis://127.0.0.1:6379/0 .venv/bin/python examples/quota_chat.py   # leases on Redis

It starts the mock model (`tenure mock-model`), two `tenure worker` processes with 6 slots each (12 handlers,
so the quota is what keeps the model under its limit), submits 60 `chat` jobs with `tenure.connect`, waits
for them, and prints the model's own counters: `rejected_429` stays 0 and `max_in_flight` stays <= 4.
On a Redis that has never held Tenure leases, the first slot is granted one claim TTL after the first try (Redis
cannot tell a new server from one that lost its leases; docs/quotas.md, "When Redis loses its leases").
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import tenure

LIMIT = 4
JOBS = 60


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="tenure-quota-example-"))
    db = f"sqlite:///{tmp}/tenure.db"
    model = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tenure.demos.mock_model",
            "--port",
            "0",
            "--max-concurrency",
            str(LIMIT),
            "--latency-ms",
            "100",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert model.stdout is not None
    base = model.stdout.readline().rsplit(" ", 1)[1].strip().rstrip("/")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_") or k == "TENURE_REDIS_URL"}
    env.update(
        {
            "TENURE_DATABASE_URL": db,
            "TENURE_QUOTAS": f"llm:mock={LIMIT}",
            "TENURE_MODEL_URL": base + "/v1",
            "TENURE_LOG_LEVEL": "warning",
        }
    )
    workers = [
        subprocess.Popen([sys.executable, "-m", "tenure.cli", "worker", "--concurrency", "6"], env=env) for _ in range(2)
    ]
    try:
        asyncio.run(submit_and_wait(db))
        with urllib.request.urlopen(base + "/stats") as answer:
            stats = json.load(answer)
        print(f"mock model: {stats}")
        ok = stats["rejected_429"] == 0 and stats["max_in_flight"] <= LIMIT
        print("the quota kept the model under its limit" if ok else "the model was overrun")
        return 0 if ok else 1
    finally:
        for p in (*workers, model):
            p.terminate()
        for p in (*workers, model):
            p.wait(30)


async def submit_and_wait(db: str) -> None:
    settings = tenure.settings.Settings.of(database_url=db)
    async with tenure.connect("tenure.demos.examples:app", settings=settings) as client:
        ids = await client.submit_many(
            [tenure.JobRequest("chat", {"prompt": f"question {i}", "max_tokens": 8}) for i in range(JOBS)]
        )
        states: dict[str, int] = {}
        for job_id in ids:
            job = await client.wait(job_id, timeout_s=120)
            states[job.state.value] = states.get(job.state.value, 0) + 1
        print(f"{JOBS} chat jobs: {states}")


if __name__ == "__main__":
    sys.exit(main())
