"""Where a job's pickup latency goes (the harness's W2, decomposed), on PostgreSQL or SQLite.

    .venv/bin/python bench/pickup.py                 # 800 jobs, 2 workers x 10
    .venv/bin/python bench/pickup.py --n 2000 --workers 1
    .venv/bin/python bench/pickup.py --sqlite /tmp/pickup.db

One submit every 10 ms to idle workers (like W2). For each job, from the client's clock before the submit and
the database's timestamps (same machine, same clock):

    t0 -> created        the submit reaches the INSERT's transaction (created_at = its now())
    submit returns       the submit call returns, after created_at (statement, its commit, then the flush
                         barrier: the job is durable when submit returns)
    created -> claim     the worker's claim transaction begins (commit, NOTIFY delivery, wake-up)
    claim -> handler     the handler runs (claim + start, durable commit, reply, task start)
    total                t0 -> handler: the harness's pickup latency

Prints p50/p90/p99/max of each and the slowest totals (PICKUP_WORST=N shows N of them, default 5). Uses a
scratch schema `bench_pickup` in the test database, or a fresh SQLite file (whose clock is the same machine's).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg

import tenure
from tenure.settings import Settings

PG_BASE = os.environ.get("TENURE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
SCHEMA = "bench_pickup"
HERE = str(Path(__file__).resolve().parent)

app = tenure.Tenure()


@app.agent("pickup")
async def pickup(ctx: Any, input: Any) -> dict[str, float]:
    return {"t": time.time()}


def fresh_sqlite(path: str) -> str:
    """The URL of a new SQLite database at `path` (any earlier one removed)."""
    path = os.path.abspath(path)
    for f in (path, path + "-wal", path + "-shm"):
        if os.path.exists(f):
            os.remove(f)
    return f"sqlite:///{path}"


async def main(n: int, workers: int, sqlite: str | None) -> None:
    if sqlite:
        url = fresh_sqlite(sqlite)
    else:
        url = f"{PG_BASE}?search_path={SCHEMA}"
        admin = await asyncpg.connect(PG_BASE)
        await admin.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; CREATE SCHEMA {SCHEMA}")
        await admin.close()
    here = HERE
    env = dict(
        os.environ,
        TENURE_DATABASE_URL=url,
        TENURE_APP="pickup:app",
        TENURE_LOG_LEVEL="warning",
        PYTHONPATH=here + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    tenure_bin = os.path.join(os.path.dirname(sys.executable), "tenure")
    # Settings.of since issue 11; the constructor before it (so that older checkouts run this file too).
    async with tenure.connect(app, settings=getattr(Settings, "of", Settings)(database_url=url)) as client:
        procs = [
            subprocess.Popen(  # noqa: ASYNC220 - started once, before anything is measured
                [tenure_bin, "worker", "--concurrency", str(max(1, 20 // workers))],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            for _ in range(workers)
        ]
        try:
            await asyncio.sleep(2)  # workers up and listening
            sent: dict[str, tuple[float, float]] = {}
            start = time.perf_counter()
            for i in range(n):
                delay = start + i * 0.01 - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                t0 = time.time()
                made = await client.submit("pickup", {"i": i})
                job_id = getattr(made, "id", made)  # a Job since issue 11; its id before
                sent[job_id] = (t0, time.time())
            await asyncio.sleep(2)
            jobs = {j.id: j for j in await client.jobs(limit=n + 10)}
        finally:
            for p in procs:
                os.killpg(p.pid, signal.SIGTERM)
            for p in procs:
                p.wait(20)
    rows = []
    for job_id, (t0, returned) in sent.items():
        j = jobs[job_id]
        assert j.result is not None and j.claimed_at is not None, j
        rows.append(
            (
                j.created_at - t0,
                returned - j.created_at,
                j.claimed_at - j.created_at,
                j.result["t"] - j.claimed_at,
                j.result["t"] - t0,
            )
        )
    names = ["t0 -> created", "submit returns after created", "created -> claim", "claim -> handler", "total"]
    print(f"{'sqlite' if sqlite else 'postgres'}: {n} jobs, {workers} worker(s), load average {os.getloadavg()[0]:.1f}")
    for k, name in enumerate(names):
        xs = sorted(r[k] * 1000 for r in rows)
        q = [xs[min(len(xs) - 1, int(p * len(xs)))] for p in (0.5, 0.9, 0.99)]
        print(f"  {name:30s} p50 {q[0]:6.2f}  p90 {q[1]:6.2f}  p99 {q[2]:6.2f}  max {xs[-1]:6.2f} ms")
    worst = sorted(rows, key=lambda r: -r[4])[: int(os.environ.get("PICKUP_WORST", "5"))]
    print("  slowest totals (stages, ms):", [[round(x * 1000, 2) for x in r] for r in worst])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=800)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sqlite", metavar="PATH", help="a SQLite file to make afresh (default: PostgreSQL)")
    args = parser.parse_args()
    asyncio.run(main(args.n, args.workers, args.sqlite))
