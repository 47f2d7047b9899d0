"""Server time of one submit on PostgreSQL, by function, while the table churns as it does under a worker.

    .venv/bin/python bench/enqueue_server.py                 # 1,000 submits
    .venv/bin/python bench/enqueue_server.py --n 3000 --database-url postgresql://postgres@127.0.0.1:5432/test

Each `tenure.connect(...).submit` is followed by the two updates a worker's claim and finish make to the row
(queued -> running -> succeeded), so the partial indexes of waiting jobs see the dead entries and the table
grows with finished jobs, as in the harness's W2 or any deployment. The store's connections run with
`track_functions=all`; the figures are `pg_stat_user_functions` (mean total and self time per call of
`tenure_enqueue` and of the gate's read it makes, `tenure_admission_state`), which leave out the client, the
network and the commit. Uses a scratch schema `bench_enqueue_server`.
"""

from __future__ import annotations

import argparse
import asyncio
import os

import asyncpg

import tenure
from tenure.settings import Settings

SCHEMA = "bench_enqueue_server"
app = tenure.Tenure()


@app.agent("echo")
async def echo(ctx: tenure.Context, input: dict) -> dict:
    return input


async def stats(conn: asyncpg.Connection) -> dict[str, tuple[int, float, float]]:
    rows = await conn.fetch(
        "SELECT funcname, calls, total_time, self_time FROM pg_stat_user_functions WHERE schemaname = $1", SCHEMA
    )
    return {r["funcname"]: (r["calls"], r["total_time"], r["self_time"]) for r in rows}


async def main(n: int, base: str) -> None:
    conn = await asyncpg.connect(base)
    await conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; CREATE SCHEMA {SCHEMA}")
    settings = Settings.from_env({"TENURE_DATABASE_URL": f"{base}?search_path={SCHEMA}&track_functions=all"})
    claim = f"UPDATE {SCHEMA}.jobs SET state = 'running', owner = 'w', claimed_at = now(), epoch = epoch + 1 WHERE id = $1"
    finish = f"UPDATE {SCHEMA}.jobs SET state = 'succeeded', owner = NULL, finished_at = now() WHERE id = $1"
    try:
        async with tenure.connect(app, settings=settings) as client:
            await asyncio.sleep(0.6)  # function statistics are flushed at most once a second
            before = await stats(conn)
            for _ in range(n):
                job = await client.submit("echo", {"x": 1})
                await conn.execute(claim, job.id)
                await conn.execute(finish, job.id)
            await asyncio.sleep(1.2)
            after = await stats(conn)
        for name, (calls, total, self_) in sorted(after.items()):
            c0, t0, s0 = before.get(name, (0, 0.0, 0.0))
            if calls > c0:
                k = calls - c0
                print(
                    f"{name:24} calls {k:6}  total {(total - t0) / k * 1e3:7.1f} us  self {(self_ - s0) / k * 1e3:7.1f} us"
                )
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        await conn.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1000, help="submits (default 1,000)")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("TENURE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test"),
        help="a PostgreSQL database to make the scratch schema in",
    )
    args = parser.parse_args()
    asyncio.run(main(args.n, args.database_url))
