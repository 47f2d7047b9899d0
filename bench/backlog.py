"""The claim's cost against a backlog (issue 13): claim → start → finish per job of agent `b` / tenant `b` while N
jobs of another agent (`--of agent`) or of another tenant (`--of tenant`) sit queued in front of them.

    .venv/bin/python bench/backlog.py --sizes 1000,100000 --of tenant
    .venv/bin/python bench/backlog.py --sizes 1000,100000 --of agent --database-url postgresql://postgres@127.0.0.1:5432/test

The backlog is inserted through the store's own enqueue (in batches of 1,000, as admission would) before the
clock starts; then one worker-like loop claims and starts (`claim_and_start`, limit 4) and finishes `--jobs`
no-op jobs of agent `b` (whichever tenant's the claim hands it), and the mean cost per job is printed, one line
per size. With
`--of tenant` the backlog is tenant `a`'s jobs of agent `b` (the worker may claim both; fair shares put `b`'s jobs
in turn); with `--of agent` it is tenant `b`'s jobs of agent `a`, which this worker does not serve. A PostgreSQL
URL names a server: a schema of its own is created there and dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
import uuid
from collections.abc import AsyncIterator

import asyncpg

from tenure.app import open_backends
from tenure.contracts.states import JobState
from tenure.contracts.store import JobStore
from tenure.contracts.types import AgentSpec, Finish
from tenure.control.admission import Admission, JobRequest
from tenure.settings import Settings

AGENTS = {"a": AgentSpec("a"), "b": AgentSpec("b")}


@contextlib.asynccontextmanager
async def database(url: str | None) -> AsyncIterator[str]:
    if url is None:
        with tempfile.TemporaryDirectory() as d:
            yield f"sqlite:///{d}/backlog.db"
        return
    schema = f"backlog_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(url)
    await conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"{url}?search_path={schema}"
    finally:
        await conn.execute(f"DROP SCHEMA {schema} CASCADE")
        await conn.close()


async def fill(store: JobStore, admission: Admission, n: int, agent: str, tenant: str) -> None:
    for start in range(0, n, 1000):
        await store.enqueue(
            [admission.build(JobRequest(agent, i, tenant=tenant)) for i in range(start, min(n, start + 1000))]
        )


async def run(url: str, size: int, of: str, jobs: int) -> float:
    backends = await open_backends(Settings.of(database_url=url))
    store = backends.jobs
    try:
        admission = Admission(store, AGENTS)
        await fill(store, admission, size, "b" if of == "tenant" else "a", "a" if of == "tenant" else "b")
        await fill(store, admission, jobs, "b", "b")
        if url.startswith("postgres"):
            conn = await asyncpg.connect(url.split("?")[0], server_settings={"search_path": url.split("search_path=")[1]})
            await conn.execute("ANALYZE jobs")
            await conn.close()
        done = 0
        began = time.perf_counter()
        while done < jobs:
            pairs = await store.claim_and_start("bench", ["b"], [], 4, 30.0)
            finishes = [Finish(c.fence, s.execution_id, s.started_at, JobState.SUCCEEDED, 2, "null", None, None, 0.0)
                        for c, s in pairs]  # fmt: skip
            await store.finish("bench", finishes)
            done += len(pairs)  # with --of tenant, fair shares interleave a's jobs with b's: every job counts
            if not pairs:
                raise SystemExit("backlog: the claim found nothing to do")
        return (time.perf_counter() - began) / jobs
    finally:
        await backends.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,100000", help="backlog sizes, comma-separated")
    parser.add_argument("--of", choices=["agent", "tenant"], default="tenant")
    parser.add_argument("--jobs", type=int, default=400, help="jobs of agent b / tenant b timed per size")
    parser.add_argument("--database-url", help="a PostgreSQL server (default: a SQLite file)")
    args = parser.parse_args()
    for size in (int(s) for s in args.sizes.split(",")):
        async with database(args.database_url) as url:
            cost = await run(url, size, args.of, args.jobs)
        dialect = "postgres" if args.database_url else "sqlite"
        print(f"backlog: {dialect} of={args.of} queued={size} per_job_ms={cost * 1000:.3f}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
