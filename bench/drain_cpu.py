"""What one no-op job costs: CPU per job of the worker processes and of the PostgreSQL server, in a drain.

Enqueues `--jobs` no-op jobs (no sleep, no Redis record, unlike the harness's W1), then starts `--workers`
`tenure worker` processes (`--concurrency` each) and waits until every job succeeded. Reports the drain rate
and, more robust on a shared machine than any rate, the CPU seconds the worker processes and all `postgres`
processes spent per job (from /proc), and the idle CPU of the workers afterwards. `steady_*` count from the
tenth job in ten on (no start-up), and split off the workers' event-loop threads from their other threads (the
SQLite connection thread). Run it on two checkouts in turn (each with its own `.venv`) to compare them:

    .venv/bin/python bench/drain_cpu.py                                  # PostgreSQL, schema drain_cpu
    .venv/bin/python bench/drain_cpu.py --sqlite /tmp/drain_cpu.db
    .venv/bin/python bench/drain_cpu.py --database-url postgresql://postgres@127.0.0.1:5432/test --jobs 20000

The PostgreSQL figure counts every `postgres` process of the machine: run it with nothing else using the server.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import tenure

app = tenure.Tenure()


@app.agent("noop")
async def noop(ctx: tenure.Context, input: dict) -> None:
    return None


TCK = os.sysconf("SC_CLK_TCK")
SCHEMA = "drain_cpu"


def _stat_cpu_s(path: str, children: bool) -> float:
    """User + system CPU seconds from a /proc `stat` file (a process's, or one thread's under `task/`), with the
    waited-for children's when `children`."""
    try:
        f = Path(path).read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return sum(int(v) for v in f[11 : 15 if children else 13]) / TCK


def _cpu_s(pid: int) -> float:
    """CPU seconds of a process and its waited-for children."""
    return _stat_cpu_s(f"/proc/{pid}/stat", children=True)


def _loop_cpu_s(pid: int) -> float:
    """CPU seconds of a process's main thread: a worker's event loop (its other threads are the SQLite
    connection thread, the PostgreSQL pool's helpers, and the like)."""
    return _stat_cpu_s(f"/proc/{pid}/task/{pid}/stat", children=False)


def _postgres_cpu_s() -> float:
    total = 0.0
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if Path(f"/proc/{p}/comm").read_text().startswith("postgres"):
                    total += _cpu_s(int(p))
            except (FileNotFoundError, ProcessLookupError):
                pass
    return total


async def _run(args: argparse.Namespace) -> dict[str, float]:
    import asyncpg

    if args.sqlite:
        url = f"sqlite:///{os.path.abspath(args.sqlite)}"
        for f in glob.glob(os.path.abspath(args.sqlite) + "*"):
            os.remove(f)
    else:
        url = args.database_url + ("&" if "?" in args.database_url else "?") + f"search_path={SCHEMA}"
        conn = await asyncpg.connect(args.database_url)
        await conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        await conn.execute(f"CREATE SCHEMA {SCHEMA}")
        await conn.close()

    async def succeeded() -> int:
        if args.sqlite:
            with sqlite3.connect(os.path.abspath(args.sqlite)) as db:
                return int(db.execute("SELECT count(*) FROM jobs WHERE state = 'succeeded'").fetchone()[0])
        c = await asyncpg.connect(args.database_url)
        try:
            return int(await c.fetchval(f"SELECT count(*) FROM {SCHEMA}.jobs WHERE state = 'succeeded'"))
        finally:
            await c.close()

    from tenure.settings import Settings

    # Settings.of since issue 11; the constructor before it (so that older checkouts run this file too).
    make = getattr(Settings, "of", Settings)
    settings = make(database_url=url, max_queued=10**9, max_queued_per_tenant=10**9)
    here = str(Path(__file__).resolve().parent)
    env = dict(os.environ, TENURE_DATABASE_URL=url, TENURE_APP="drain_cpu:app", TENURE_LOG_LEVEL="warning")
    env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
    tenure_bin = str(Path(sys.executable).parent / "tenure")
    async with tenure.connect(app, settings=settings) as client:
        t0 = time.perf_counter()
        for i in range(0, args.jobs, 1000):
            batch = range(i, min(args.jobs, i + 1000))
            await client.submit_many([tenure.JobRequest("noop", {"i": j}) for j in batch])
        enqueue_s = time.perf_counter() - t0
    procs = [
        subprocess.Popen([tenure_bin, "worker", "--concurrency", str(args.concurrency)], env=env)
        for _ in range(args.workers)
    ]
    try:
        pids = [p.pid for p in procs]
        w0, g0, t0 = sum(map(_cpu_s, pids)), _postgres_cpu_s(), time.perf_counter()
        while (n0 := await succeeded()) < args.jobs // 10:  # the steady state: start-up (imports) left behind
            await asyncio.sleep(0.02)
        ws, ls = sum(map(_cpu_s, pids)), sum(map(_loop_cpu_s, pids))
        while await succeeded() < args.jobs:
            await asyncio.sleep(0.1)
        t1, w1, g1 = time.perf_counter(), sum(map(_cpu_s, pids)), _postgres_cpu_s()
        l1 = sum(map(_loop_cpu_s, pids))
        await asyncio.sleep(2)
        w2, t2 = sum(map(_cpu_s, pids)), time.perf_counter()
        await asyncio.sleep(10)
        w3, t3 = sum(map(_cpu_s, pids)), time.perf_counter()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
    out = {
        "store": "sqlite" if args.sqlite else "postgres",
        "jobs": args.jobs,
        "enqueue_ms_per_job": round(enqueue_s * 1000 / args.jobs, 4),
        "drain_jobs_per_s": round(args.jobs / (t1 - t0)),
        "worker_cpu_ms_per_job": round((w1 - w0) * 1000 / args.jobs, 4),
        # From the tenth job in ten on: without the workers' start-up, the event loop apart from the rest.
        "steady_worker_cpu_ms_per_job": round((w1 - ws) * 1000 / (args.jobs - n0), 4),
        "steady_loop_thread_cpu_ms_per_job": round((l1 - ls) * 1000 / (args.jobs - n0), 4),
        "idle_worker_cpu_pct": round((w3 - w2) * 100 / (t3 - t2), 2),
    }
    if not args.sqlite:
        out["postgres_cpu_ms_per_job"] = round((g1 - g0) * 1000 / args.jobs, 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10_000, help="no-op jobs to drain (default 10,000)")
    ap.add_argument("--workers", type=int, default=2, help="tenure worker processes (default 2)")
    ap.add_argument("--concurrency", type=int, default=10, help="slots per worker (default 10)")
    ap.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test", help="PostgreSQL server")
    ap.add_argument("--sqlite", metavar="PATH", help="a SQLite file instead (deleted first)")
    print(json.dumps(asyncio.run(_run(ap.parse_args()))))


if __name__ == "__main__":
    main()
