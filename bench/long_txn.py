"""What one long-running transaction does to a SKIP LOCKED job queue on PostgreSQL (issue 16).

    .venv/bin/python bench/long_txn.py                       # hold 120 s, 2 workers x 10, 2,000-job rounds
    .venv/bin/python bench/long_txn.py --hold 60 --backlog 1000 --vacuum-every 5

Two worker processes run a no-op agent. One *round* measures two things:

    drain    2,000 jobs submitted at once (in batches of 500): jobs/s from the first submit until the last one
             is finished
    pickup   then 100 jobs one every 10 ms onto the idle workers: created -> claimed (the database's clock),
             p50 and p99

Rounds run in phases: `before` (2 rounds); `control` (rounds back to back for `--hold` seconds, nothing held);
then the tables are emptied and `held` runs the same rounds for the same time while another session keeps a
REPEATABLE READ snapshot open: the xmin horizon stays where it was, so VACUUM can remove none of the dead
versions every claim, start and finish leaves behind; then `commit` (the snapshot committed, one round) and
`vacuum` (a manual `VACUUM` of the queue's tables, 2 rounds). Throughout, the bench itself runs `VACUUM` of the
queue's tables every `--vacuum-every` seconds (10), standing in for an autovacuum tuned for a queue (this
machine's server runs with `autovacuum = off`): in `control` it keeps the dead rows down, in `held` it can
remove nothing, so the difference between the two is the horizon's alone. Finished jobs stay in the table as
history in both, as they do in production until they are deleted. Each row shows the dead and live rows of
`jobs` and the table's size with its indexes, from `JobStore.health()` (what `tenure doctor` and the
`tenure_store_*` metrics report), and the load average of the machine.

Uses a scratch schema `bench_long_txn` in the test database.
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
from tenure.contracts.store import JobStore
from tenure.settings import Settings

PG_BASE = os.environ.get("TENURE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
SCHEMA = "bench_long_txn"
HERE = str(Path(__file__).resolve().parent)
BATCH = 500

app = tenure.Tenure()


@app.agent("noop")
async def noop(ctx: Any, input: Any) -> None:
    return None


async def _drain(client: Any, store: JobStore, n: int) -> float:
    start = time.perf_counter()
    for i in range(0, n, BATCH):
        await client.submit_many([tenure.JobRequest("noop", {"i": j}) for j in range(i, min(n, i + BATCH))])
    while (await store.count_live_jobs()).by_state:  # noqa: ASYNC110 - the store is polled, nothing to wait on
        await asyncio.sleep(0.02)
    return n / (time.perf_counter() - start)


async def _pickup(client: Any, n: int = 100) -> tuple[float, float]:
    ids = []
    start = time.perf_counter()
    for i in range(n):
        delay = start + i * 0.01 - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        ids.append((await client.submit("noop", {"p": i})).id)
    waits = []
    for job_id in ids:
        job = await client.wait(job_id, timeout_s=30)
        assert job.claimed_at is not None, job
        waits.append((job.claimed_at - job.created_at) * 1000)
    waits.sort()
    return waits[len(waits) // 2], waits[min(len(waits) - 1, int(0.99 * len(waits)))]


async def _round(phase: str, opened: float | None, client: Any, store: JobStore, backlog: int) -> None:
    rate = await _drain(client, store, backlog)
    p50, p99 = await _pickup(client)
    health = await store.health()
    held = f"{time.monotonic() - opened:5.0f}" if opened is not None else "    -"
    mib = health.table_bytes.get("jobs", 0) / 2**20
    print(
        f"{phase:7s} {held} s  drain {rate:7.0f} jobs/s  pickup p50 {p50:6.2f} p99 {p99:7.2f} ms  "
        f"horizon {health.oldest_xmin_age_s or 0:5.0f} s  jobs dead {health.dead_tuples.get('jobs', 0):7d} "
        f"live {health.live_tuples.get('jobs', 0):7d}  {mib:6.1f} MiB  load {os.getloadavg()[0]:4.1f}",
        flush=True,
    )


async def _vacuumer(url: str, every_s: float) -> None:
    conn = await asyncpg.connect(url, server_settings={"application_name": "bench-vacuumer"})
    try:
        while True:
            await asyncio.sleep(every_s)
            await conn.execute("VACUUM jobs, events, executions")
    finally:
        await conn.close()


async def _phase(name: str, hold: float, client: Any, store: JobStore, backlog: int) -> None:
    opened = time.monotonic()
    while time.monotonic() - opened < hold:
        await _round(name, opened, client, store, backlog)


async def main(hold: float, backlog: int, workers: int, vacuum_every: float) -> None:
    url = f"{PG_BASE}?search_path={SCHEMA}"
    admin = await asyncpg.connect(PG_BASE)
    await admin.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; CREATE SCHEMA {SCHEMA}")
    await admin.close()
    env = dict(
        os.environ,
        TENURE_DATABASE_URL=url,
        TENURE_APP="long_txn:app",
        TENURE_LOG_LEVEL="warning",
        PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    tenure_bin = os.path.join(os.path.dirname(sys.executable), "tenure")
    limits = Settings.of(database_url=url, max_queued=100_000, max_queued_per_tenant=100_000)
    async with tenure.connect(app, settings=limits) as client:
        store = client.store
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
        holder = await asyncpg.connect(url, server_settings={"application_name": "bench-long-txn"})
        try:
            await asyncio.sleep(2)  # workers up and listening
            print(f"{backlog}-job drain rounds, {workers} worker(s) x {max(1, 20 // workers)}, hold {hold:.0f} s, "
                  f"load average {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
            vacuumer = asyncio.create_task(_vacuumer(url, vacuum_every))
            for _ in range(2):
                await _round("before", None, client, store, backlog)
            await _phase("control", hold, client, store, backlog)
            await holder.execute("TRUNCATE jobs, events, executions")  # the held phase starts from the same state
            await _round("before", None, client, store, backlog)
            await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            await holder.fetchval("SELECT count(*) FROM jobs")  # the snapshot: from here the horizon stays put
            await _phase("held", hold, client, store, backlog)
            await holder.execute("COMMIT")
            await _round("commit", None, client, store, backlog)
            vacuumer.cancel()
            await holder.execute("VACUUM jobs, events, executions")
            for _ in range(2):
                await _round("vacuum", None, client, store, backlog)
            print(f"load average {os.getloadavg()[0]:.1f}")
        finally:
            await holder.close()
            for p in procs:
                os.killpg(p.pid, signal.SIGTERM)
            for p in procs:
                p.wait(20)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hold", type=float, default=120.0, help="seconds the transaction stays open (120)")
    parser.add_argument("--backlog", type=int, default=2000, help="jobs per drain round (2000)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes, 20 slots between them (2)")
    parser.add_argument("--vacuum-every", type=float, default=10.0, help="seconds between the bench's VACUUMs (10)")
    args = parser.parse_args()
    asyncio.run(main(args.hold, args.backlog, args.workers, args.vacuum_every))
