"""Does a retention pass block claims? The harness's W2 with and without one (issue 14), PostgreSQL or SQLite.

    .venv/bin/python bench/retention.py                # PostgreSQL, scratch schema bench_retention
    .venv/bin/python bench/retention.py --sqlite       # a SQLite file in a temporary directory
    .venv/bin/python bench/retention.py --old 20000 --sweep-interval 0.5

Loads `--old` (100,000) jobs that finished 40 days ago, each with one execution and three events (PostgreSQL: one
INSERT ... SELECT generate_series per table; SQLite: executemany), plus five jobs of an agent no worker runs that
are not terminal and must survive: two running (one with a stale `finished_at`, so only the state check keeps it),
one waiting, one scheduled, one queued, all created 40 days ago, each with two events.

Then the W2-like load twice, each time with 2 fresh worker processes x 10 slots: 1,000 jobs one every 10 ms
(100/s for 10 s) onto the idle workers, pickup = created_at -> claimed_at (the database's clock), p50 and p99.

    off   TENURE_RETENTION_DAYS=100000 (nothing is old enough: every sweep's purge finds nothing)
    on    TENURE_RETENTION_DAYS=30: the sweeper duty deletes one batch (`retention_batch`, 100) per sweep

Both runs use the same `TENURE_SWEEP_INTERVAL_S` (`--sweep-interval`, 0.2 s), so the only difference is the
purge. Prints both, the ratio, how many old jobs went during the measured window (and in all), the survivors'
check and a one-line verdict. The load average is printed too: the machine may be shared.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg

import tenure
from tenure.settings import Settings

PG_BASE = os.environ.get("TENURE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
SCHEMA = "bench_retention"
HERE = str(Path(__file__).resolve().parent)
DAY = 86400.0

app = tenure.Tenure()


@app.agent("noop")
async def noop(ctx: Any, input: Any) -> None:
    return None


# (state, finished_at 40 days ago?): jobs of agent 'keep' (no worker runs it) that must survive.
SURVIVORS = [
    ("running", False),
    ("running", True),  # a stale finished_at: only the delete's state check keeps it
    ("waiting", False),
    ("scheduled", False),
    ("queued", False),
]

PG_LOAD = [
    """INSERT INTO jobs (id, tenant, agent, input, request_fingerprint, state, epoch, attempts, max_attempts,
                         execution_id, result, claimed_at, execution_started_at, created_at, updated_at, finished_at)
       SELECT md5('job' || g)::uuid, 'default', 'old', '{"i": 1}', '\\x00'::bytea, 'succeeded', 1, 1, 3,
              md5('exe' || g)::uuid, 'null', t - interval '2 s', t - interval '1 s', t - interval '3 s', t, t
         FROM generate_series(1, $1::int) AS g, LATERAL (SELECT now() - interval '40 days' + g * interval '1 ms') AS x(t)""",
    """INSERT INTO executions (id, job_id, epoch, worker_id, started_at, ended_at, outcome)
       SELECT md5('exe' || g)::uuid, md5('job' || g)::uuid, 1, 'bench', now() - interval '40 days',
              now() - interval '40 days', 'succeeded'
         FROM generate_series(1, $1::int) AS g""",
    """INSERT INTO events (job_id, epoch, seq, execution_id, type, payload, ts)
       SELECT md5('job' || g)::uuid, 1, s, md5('exe' || g)::uuid, 'progress', '{"n": 1}', now() - interval '40 days'
         FROM generate_series(1, $1::int) AS g, generate_series(1, 3) AS s""",
]


async def _load_pg(url: str, n: int) -> list[tuple[str, str]]:
    conn = await asyncpg.connect(url)
    try:
        for statement in PG_LOAD:
            await conn.execute(statement, n)
        survivors = []
        for state, stale in SURVIVORS:
            job_id = str(uuid.uuid4())
            owned = state in ("running", "waiting")
            await conn.execute(
                """INSERT INTO jobs (id, tenant, agent, input, request_fingerprint, state, owner, epoch, attempts,
                                     max_attempts, claimed_at, claim_expires_at, next_attempt_at, created_at,
                                     updated_at, finished_at)
                   VALUES ($1::uuid, 'default', 'keep', '{}', '\\x00'::bytea, $2, $3, 1, 1, 3,
                           CASE WHEN $3::text IS NULL THEN NULL ELSE now() END,
                           CASE WHEN $3::text IS NULL THEN NULL ELSE now() + interval '1 day' END,
                           CASE WHEN $2 = 'scheduled' THEN now() + interval '1 day' END,
                           now() - interval '40 days', now() - interval '40 days',
                           CASE WHEN $4 THEN now() - interval '40 days' END)""",
                job_id,
                state,
                "bench-ghost" if owned else None,
                stale,
            )
            await conn.execute(
                "INSERT INTO events (job_id, epoch, seq, type, payload, ts) "
                "SELECT $1::uuid, 1, s, 'progress', '{}', now() - interval '40 days' FROM generate_series(1, 2) AS s",
                job_id,
            )
            survivors.append((job_id, state))
        await conn.execute("ANALYZE jobs; ANALYZE events; ANALYZE executions")
        return survivors
    finally:
        await conn.close()


def _load_sqlite(path: str, n: int) -> list[tuple[str, str]]:
    db = sqlite3.connect(path, timeout=30)
    now = time.time()
    t0 = now - 40 * DAY
    ids = [(str(uuid.uuid4()), str(uuid.uuid4()), t0 + i * 0.001) for i in range(n)]
    with db:
        db.executemany(
            "INSERT INTO jobs (id, tenant, agent, input, request_fingerprint, state, epoch, attempts, max_attempts, "
            "execution_id, result, claimed_at, execution_started_at, created_at, updated_at, finished_at) "
            "VALUES (?, 'default', 'old', '{\"i\": 1}', x'00', 'succeeded', 1, 1, 3, ?, 'null', ?, ?, ?, ?, ?)",
            ((j, x, t - 2, t - 1, t - 3, t, t) for j, x, t in ids),
        )
        db.executemany(
            "INSERT INTO executions (id, job_id, epoch, worker_id, started_at, ended_at, outcome) "
            "VALUES (?, ?, 1, 'bench', ?, ?, 'succeeded')",
            ((x, j, t - 1, t) for j, x, t in ids),
        )
        db.executemany(
            "INSERT INTO events (job_id, epoch, seq, execution_id, type, payload, ts) "
            "VALUES (?, 1, ?, ?, 'progress', '{\"n\": 1}', ?)",
            ((j, s, x, t) for j, x, t in ids for s in (1, 2, 3)),
        )
        survivors = []
        for state, stale in SURVIVORS:
            job_id = str(uuid.uuid4())
            owned = state in ("running", "waiting")
            db.execute(
                "INSERT INTO jobs (id, tenant, agent, input, request_fingerprint, state, owner, epoch, attempts, "
                "max_attempts, claimed_at, claim_expires_at, next_attempt_at, created_at, updated_at, finished_at) "
                "VALUES (?, 'default', 'keep', '{}', x'00', ?, ?, 1, 1, 3, ?, ?, ?, ?, ?, ?)",
                (
                    job_id,
                    state,
                    "bench-ghost" if owned else None,
                    now if owned else None,
                    now + DAY if owned else None,
                    now + DAY if state == "scheduled" else None,
                    t0,
                    t0,
                    t0 if stale else None,
                ),
            )
            db.executemany(
                "INSERT INTO events (job_id, epoch, seq, type, payload, ts) VALUES (?, 1, ?, 'progress', '{}', ?)",
                ((job_id, s, t0) for s in (1, 2)),
            )
            survivors.append((job_id, state))
    db.execute("ANALYZE")
    db.close()
    return survivors


class Counter:
    """Counts rows through a connection of its own (asyncpg or sqlite3), outside the client's store."""

    def __init__(self, url: str, sqlite_path: str | None) -> None:
        self.url, self.path = url, sqlite_path

    async def one(self, sql: str, *args: Any) -> Any:
        if self.path is not None:
            db = sqlite3.connect(self.path, timeout=30)
            try:
                return db.execute(sql.replace("$1", "?1"), args).fetchone()
            finally:
                db.close()
        conn = await asyncpg.connect(self.url)
        try:
            return await conn.fetchrow(sql, *args)
        finally:
            await conn.close()

    async def old_left(self) -> int:
        return int((await self.one("SELECT count(*) FROM jobs WHERE agent = 'old'"))[0])

    async def orphans(self, table: str) -> int:
        """Rows of `table` whose job is gone (a purge that left history behind)."""
        sql = f"SELECT count(*) FROM {table} AS r WHERE NOT EXISTS (SELECT 1 FROM jobs AS j WHERE j.id = r.job_id)"
        return int((await self.one(sql))[0])

    async def survivors_ok(self, survivors: list[tuple[str, str]]) -> tuple[bool, list[str]]:
        ok, seen = True, []
        cast = "" if self.path is not None else "::uuid"
        for job_id, state in survivors:
            row = await self.one(f"SELECT state, (SELECT count(*) FROM events WHERE job_id = $1{cast}) FROM jobs "
                                 f"WHERE id = $1{cast}", job_id)  # fmt: skip
            good = row is not None and row[0] == state and row[1] == 2
            ok = ok and good
            seen.append(f"{state}:{'kept' if good else row}")
        return ok, seen


async def _run(name: str, days: str, args: argparse.Namespace, url: str, client: Any, counter: Counter) -> dict[str, float]:
    env = dict(
        os.environ,
        TENURE_DATABASE_URL=url,
        TENURE_APP="retention:app",
        TENURE_LOG_LEVEL="warning",
        TENURE_RETENTION_DAYS=days,
        TENURE_SWEEP_INTERVAL_S=str(args.sweep_interval),
        PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    tenure_bin = os.path.join(os.path.dirname(sys.executable), "tenure")
    before = await counter.old_left()
    procs = [
        subprocess.Popen(  # noqa: ASYNC220 - started once, before anything is measured
            [tenure_bin, "worker", "--concurrency", str(args.concurrency)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for _ in range(args.workers)
    ]
    try:
        await asyncio.sleep(2)  # workers up and listening
        load0 = os.getloadavg()[0]
        window_start = await counter.old_left()
        ids = []
        start = time.perf_counter()
        n = int(args.rate * args.seconds)
        for i in range(n):
            delay = start + i / args.rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            ids.append((await client.submit("noop", {"i": i})).id)
        waits = []
        for job_id in ids:
            job = await client.wait(job_id, timeout_s=60)
            assert job.claimed_at is not None, job
            waits.append((job.claimed_at - job.created_at) * 1000)
        elapsed = time.perf_counter() - start
        window_end = await counter.old_left()
        load1 = os.getloadavg()[0]
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            p.wait(30)
    after = await counter.old_left()
    waits.sort()
    p50, p99 = waits[len(waits) // 2], waits[min(len(waits) - 1, int(0.99 * len(waits)))]
    purged_window = window_start - window_end
    print(
        f"{name:3s}  retention_days={days:>6s}  {n} jobs in {elapsed:4.1f} s  pickup p50 {p50:6.2f} p99 {p99:7.2f} "
        f"max {waits[-1]:7.2f} ms  purged in window {purged_window} ({purged_window / elapsed:.0f} jobs/s), "
        f"in all {before - after}  old left {after}  load {load0:.1f} -> {load1:.1f}",
        flush=True,
    )
    return {"p50": p50, "p99": p99, "purged": purged_window, "total": before - after}


async def main(args: argparse.Namespace) -> None:
    tmp = None
    if args.sqlite:
        tmp = tempfile.TemporaryDirectory(prefix="bench-retention-")
        path: str | None = os.path.join(tmp.name, "tenure.db")
        url = f"sqlite:///{path}"
    else:
        path = None
        url = f"{PG_BASE}?search_path={SCHEMA}"
        admin = await asyncpg.connect(PG_BASE)
        await admin.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE; CREATE SCHEMA {SCHEMA}")
        await admin.close()
    limits = Settings.of(database_url=url, max_queued=100_000, max_queued_per_tenant=100_000)
    try:
        async with tenure.connect(app, settings=limits) as client:  # runs the migrations
            t = time.perf_counter()
            if path is not None:
                survivors = await asyncio.to_thread(_load_sqlite, path, args.old)
            else:
                survivors = await _load_pg(url, args.old)
            counter = Counter(url, path)
            print(f"{'sqlite' if path else 'postgres'}: loaded {await counter.old_left()} jobs finished 40 days ago "
                  f"(+ {len(survivors)} not terminal) in {time.perf_counter() - t:.1f} s; {args.workers} workers x "
                  f"{args.concurrency}, {args.rate:g}/s for {args.seconds:g} s, sweep every {args.sweep_interval:g} s, "
                  f"batch 100; load average {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
            off = await _run("off", "100000", args, url, client, counter)
            on = await _run("on", "30", args, url, client, counter)
            ok, seen = await counter.survivors_ok(survivors)
            orphans = [await counter.orphans(table) for table in ("events", "executions")]
    finally:
        if tmp is not None:
            tmp.cleanup()
    ratio = on["p99"] / off["p99"] if off["p99"] else float("inf")
    print(f"survivors: {', '.join(seen)}; rows of deleted jobs left: events {orphans[0]}, executions {orphans[1]}")
    print(f"p50 off {off['p50']:.2f} ms, on {on['p50']:.2f} ms; p99 off {off['p99']:.2f} ms, on {on['p99']:.2f} ms; "
          f"p99 ratio {ratio:.2f} (must-show: <= 2); load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"retention: purged={on['purged']} p99_off={off['p99']:.2f} ms p99_on={on['p99']:.2f} ms "
          f"ratio={ratio:.2f} survivors_ok={ok}")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sqlite", action="store_true", help="a SQLite file instead of PostgreSQL")
    parser.add_argument("--old", type=int, default=100_000, help="finished jobs 40 days old to load (100000)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    parser.add_argument("--concurrency", type=int, default=10, help="slots per worker (10)")
    parser.add_argument("--rate", type=float, default=100.0, help="submits per second (100)")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds of submits (10)")
    parser.add_argument("--sweep-interval", type=float, default=0.2, help="TENURE_SWEEP_INTERVAL_S (0.2)")
    asyncio.run(main(parser.parse_args()))
