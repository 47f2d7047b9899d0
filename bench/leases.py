"""Benchmark of the global quota: lease round trips per backend, and jobs under a quota end to end.

    .venv/bin/python bench/leases.py                     # both parts
    .venv/bin/python bench/leases.py --part leases --seconds 3
    .venv/bin/python bench/leases.py --part jobs --jobs 2000

Part 1 (`leases`): acquire + release pairs per second on each `Leases` backend (Redis, PostgreSQL, SQLite)
with 1 and 50 concurrent clients (coroutines of this process, each its own holder, on one key whose limit
never refuses), next to a bare `EVALSHA` of a script that only returns, measured in the same run with the
same client library and concurrency. On Redis, bare EVALSHA, plain pairs (`acquire` + `release`) and quota
pairs (`acquire_in_line` + `release_and_hand_over`, what `ctx.quota` runs) alternate in slices of 0.25 s and
the medians are reported. A pair is two round trips, so it is compared both per round trip (`2 × pairs/s`
against bare round trips/s) and pair for pair (`pairs/s` against bare round trips/s).

Part 2 (`jobs`): N jobs that each hold the quota `bench:q` (limit 8) for 50 ms, run by 2 `tenure worker`
processes (concurrency 8 each, so the quota, not the workers, is the bound) on PostgreSQL with Redis leases.
Theoretical ceiling: 8 / 0.05 s = 160 jobs/s. Reported from the database's clock: first start → last finish.

Writes bench/results/leases.json. Uses a scratch PostgreSQL schema and a unique Redis key prefix (the shared
Redis is never flushed).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import resource
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import asyncpg
import redis
import redis.asyncio
from redis.driver_info import DriverInfo

import tenure
from tenure.backends.postgres import PostgresLeases, PostgresStore
from tenure.backends.redis import RedisLeases
from tenure.backends.sqlite import SqliteLeases, SqliteStore, database_files
from tenure.contracts.store import Leases

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SRC = Path(os.environ.get("TENURE_BENCH_SRC", ROOT / "src")).resolve()
"""The package the worker processes run (another checkout's `src` for an A/B run of the same benchmark)."""
PG_BASE = os.environ.get("TENURE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("TENURE_BENCH_REDIS", "redis://127.0.0.1:6379/0")
QUOTA_KEY = "bench:q"
QUOTA_LIMIT = 8
JOB_S = 0.05

app = tenure.Tenure("bench-leases")


@app.agent("quota_sleep", timeout=600)
async def quota_sleep(ctx: tenure.Context, input: Any) -> dict[str, float]:
    """Hold one slot of `bench:q` for `JOB_S` seconds (a model call under a quota).

    Returns the wall-clock moments (one machine, so one clock for both workers) at which the handler began, the
    slot was held, and the block began to give it back: the hand-off analysis is computed from them."""
    began = time.time()
    async with ctx.quota(QUOTA_KEY):
        held = time.time()
        await asyncio.sleep(JOB_S)
        releasing = time.time()
    return {"began": began, "held": held, "releasing": releasing, "pid": os.getpid()}


def _quantiles(values: list[float]) -> dict[str, float]:
    """p50 / p90 / p99 / max of `values` in milliseconds (values in seconds)."""
    if not values:
        return {}
    v = sorted(values)

    def q(p: float) -> float:
        return 1000 * v[min(len(v) - 1, int(p * len(v)))]

    return {"p50_ms": q(0.5), "p90_ms": q(0.9), "p99_ms": q(0.99), "max_ms": 1000 * v[-1]}


def handoff_analysis(rows: list[tuple[float, float, float, int]], limit: int) -> dict[str, Any]:
    """From (began, held, releasing, worker pid) per job: how the quota's slots were used, independent of the total time.

    - `holders_time_share`: the share of the steady window (from the moment `limit` slots were first held to
      the last moment a job still waited for one) spent with k slots held, from the jobs' own clocks;
    - `handoff`: for every release while jobs were waiting, the time until the next job held a slot (the
      release round trip, the grant, the wake-up of a waiter), split by whether the next holder ran in the
      releasing worker process or in the other one (matched in order, so approximate at the edges);
    - `slot_cycle`: `limit` × steady window / jobs held in it, i.e. the average time one slot takes per job
      (the job's own JOB_S plus every overhead); the ceiling fraction in the steady state is JOB_S / cycle.
    """
    events: list[tuple[float, int, int]] = []
    for _, held, releasing, pid in rows:
        events.append((held, +1, pid))
        events.append((releasing, -1, pid))
    events.sort()
    # Steady window: from the first time `limit` slots are held to the last `held` of a job that had to wait
    # (after that the queue drains and slots go idle for lack of jobs, not for a slow hand-off).
    count = 0
    start = None
    for t, d, _ in events:
        count += d
        if count >= limit and start is None:
            start = t
    end = max(held for _, held, _, _ in rows)
    share: dict[int, float] = {}
    gaps: list[float] = []
    by_place: dict[str, list[float]] = {"same_process": [], "other_process": []}
    pending: list[tuple[float, int]] = []
    count = 0
    prev = None
    for t, d, pid in events:
        if start is not None and prev is not None and start <= prev and t <= end:
            share[count] = share.get(count, 0.0) + (t - prev)
        if d < 0:
            if start is not None and start <= t <= end:
                pending.append((t, pid))
        elif pending:
            released, by = pending.pop(0)
            gaps.append(t - released)
            by_place["same_process" if by == pid else "other_process"].append(t - released)
        count += d
        prev = t
    # Releases at which no job was waiting for a slot (began <= t < held): the slot then idles for lack of a job
    # (claiming and starting the next one), not for a slow hand-off.
    began_sorted = sorted(began for began, _, _, _ in rows)
    held_sorted = sorted(held for _, held, _, _ in rows)
    releases = [t for t, d, _ in events if d < 0 and start is not None and start <= t <= end]
    nobody_waiting = sum(
        1 for t in releases if bisect.bisect_right(began_sorted, t) - bisect.bisect_right(held_sorted, t) <= 0
    )
    window = sum(share.values())
    held_in_window = sum(1 for _, held, _, _ in rows if start is not None and start <= held <= end)
    return {
        "steady_window_s": window,
        "holders_time_share": {str(k): v / window for k, v in sorted(share.items())} if window else {},
        "mean_holders": sum(k * v for k, v in share.items()) / window if window else 0.0,
        "handoff": _quantiles(gaps) | {"n": len(gaps), "mean_ms": 1000 * sum(gaps) / max(1, len(gaps))},
        "releases_with_nobody_waiting": nobody_waiting,
        "handoff_by_place": {k: _quantiles(v) | {"n": len(v)} for k, v in by_place.items()},
        "slot_cycle_ms": 1000 * limit * window / held_in_window if held_in_window else None,
        "wait_for_slot": _quantiles([held - began for began, held, _, _ in rows]),
    }


# -- part 1: lease round trips ----------------------------------------------------------------------------------
async def _rate(clients: int, seconds: float, one: Callable[[int, int], Awaitable[None]]) -> float:
    """Run `one(client, i)` in `clients` concurrent loops for `seconds`; return calls per second."""
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + seconds
    counts = [0] * clients

    async def run(c: int) -> None:
        i = 0
        while loop.time() < stop_at:
            await one(c, i)
            i += 1
        counts[c] = i

    started = loop.time()
    await asyncio.gather(*(run(c) for c in range(clients)))
    return sum(counts) / (loop.time() - started)


async def _pairs(leases: Leases, clients: int, seconds: float, key: str) -> float:
    async def pair(c: int, i: int) -> None:
        holder = f"c{c}"
        assert await leases.acquire(key, holder, 1_000_000, 30)
        await leases.release(key, holder)

    await _rate(clients, min(0.3, seconds), pair)  # warm up connections
    return await _rate(clients, seconds, pair)


def _median(values: list[float]) -> float:
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


async def _establish_lease_state(raw: redis.asyncio.Redis, prefix: str) -> None:
    """Mark a fresh prefix's lease state as begun long ago: the bench measures a running deployment, not the one
    TTL a new (or just emptied) Redis waits before its first grant (docs/quotas.md)."""
    try:
        from tenure.backends.redis._scripts import generation_key
    except ImportError:  # an older checkout, which grants at once
        return
    await raw.set(generation_key(prefix), 0)


async def bench_redis_interleaved(clients: int, seconds: float, ns: str) -> dict[str, Any]:
    """Bare EVALSHA, plain pairs (acquire + release) and quota pairs (acquire_in_line + release_and_hand_over,
    what `ctx.quota` does) on Redis, measured in alternating slices of 0.25 s for `seconds` each, so that load
    from other work on the machine falls on all three alike; the medians of the slices are reported."""
    raw = redis.asyncio.Redis.from_url(
        REDIS_URL, max_connections=clients, driver_info=DriverInfo(lib_version=redis.__version__)
    )
    script = raw.register_script("return 1")
    from tenure.contracts.store import new_ticket  # imported here: part 2 also runs against older checkouts

    await _establish_lease_state(raw, f"bench:{ns}:lease:")
    rl = RedisLeases(REDIS_URL, prefix=f"bench:{ns}:lease:", max_connections=clients)
    tickets = [new_ticket(f"q{c}") for c in range(clients)]

    async def bare(c: int, i: int) -> None:
        await script(keys=[f"bench:{ns}:bare"], args=[])

    async def pair(c: int, i: int) -> None:
        assert await rl.acquire("k", f"c{c}", 1_000_000, 30)
        await rl.release("k", f"c{c}")

    async def quota_pair(c: int, i: int) -> None:
        assert (await rl.acquire_in_line("q", tickets[c], 1_000_000, 30)).held
        await rl.release_and_hand_over("q", f"q{c}", 1_000_000, 30)

    cells = {"bare": bare, "pair": pair, "quota_pair": quota_pair}
    rates: dict[str, list[float]] = {name: [] for name in cells}
    try:
        for one in cells.values():
            await _rate(clients, 0.3, one)  # warm up connections and script caches
        for _ in range(max(1, round(seconds / 0.25))):
            for name, one in cells.items():
                rates[name].append(await _rate(clients, 0.25, one))
    finally:
        await raw.aclose()
        await rl.close()
    bare_rate = _median(rates["bare"])
    return {
        "redis_bare_evalsha_per_s": bare_rate,
        "redis_pairs_per_s": _median(rates["pair"]),
        "redis_quota_pairs_per_s": _median(rates["quota_pair"]),
        "redis_slices": len(rates["bare"]),
    }


async def bench_leases(seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ns = uuid.uuid4().hex[:12]
    for clients in (1, 50):
        row: dict[str, Any] = {"load_average_1m_before": os.getloadavg()[0]}
        row.update(await bench_redis_interleaved(clients, seconds, ns))

        async with AsyncExitStack() as stack:
            schema = f"bench_leases_{ns}"
            admin = await asyncpg.connect(PG_BASE)
            stack.push_async_callback(admin.close)
            await admin.execute(f"CREATE SCHEMA {schema}")
            try:
                url = f"{PG_BASE}?search_path={schema}"
                store = await PostgresStore.connect(url, pool_size=1)
                await store.migrate()
                await store.close()
                pl = await PostgresLeases.connect(url, pool_size=min(clients, 8))
                try:
                    row["postgres_pairs_per_s"] = await _pairs(pl, clients, seconds, "k")
                finally:
                    await pl.close()
            finally:
                await admin.execute(f"DROP SCHEMA {schema} CASCADE")

            path = f"/tmp/tenure-bench-leases-{ns}.db"
            sl = await SqliteStore.connect(f"sqlite:///{path}", synchronous="NORMAL")
            try:
                await sl.migrate()
                row["sqlite_pairs_per_s"] = await _pairs(SqliteLeases(sl.connection), clients, seconds, "k")
            finally:
                await sl.close()
                for file in database_files(path):
                    Path(file).unlink(missing_ok=True)
        row["load_average_1m_after"] = os.getloadavg()[0]
        bare = row["redis_bare_evalsha_per_s"]
        # A pair is two round trips: per round trip, 2 × pairs/s against bare round trips/s; pair for pair,
        # pairs/s against bare round trips/s (a pair can never beat one bare round trip).
        row["redis_lease_round_trips_vs_bare"] = 2 * row["redis_pairs_per_s"] / bare
        row["redis_pairs_vs_bare"] = row["redis_pairs_per_s"] / bare
        row["redis_quota_round_trips_vs_bare"] = 2 * row["redis_quota_pairs_per_s"] / bare
        row["redis_quota_pairs_vs_bare"] = row["redis_quota_pairs_per_s"] / bare
        out[f"clients_{clients}"] = row
    cleanup = redis.asyncio.Redis.from_url(REDIS_URL, driver_info=DriverInfo(lib_version=redis.__version__))
    try:
        keys = [k async for k in cleanup.scan_iter(match=f"bench:{ns}:*")]
        if keys:
            await cleanup.delete(*keys)
    finally:
        await cleanup.aclose()
    return out


# -- part 2: jobs under a quota -----------------------------------------------------------------------------------
async def bench_jobs(jobs: int, workers: int, concurrency: int, leases_on: str) -> dict[str, Any]:
    ns = uuid.uuid4().hex[:12]
    schema = f"bench_quota_{ns}"
    admin = await asyncpg.connect(PG_BASE)
    await admin.execute(f"CREATE SCHEMA {schema}")
    url = f"{PG_BASE}?search_path={schema}"
    prefix = f"bench:{ns}:"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
    env.update(
        {
            "TENURE_DATABASE_URL": url,
            "TENURE_QUOTAS": f"{QUOTA_KEY}={QUOTA_LIMIT}",
            "TENURE_LOG_LEVEL": "warning",
            "PYTHONPATH": os.pathsep.join([str(HERE), str(SRC)]),
            "TENURE_POLL_S": "0.2",
        }
    )
    if leases_on == "redis":
        env.update({"TENURE_REDIS_URL": REDIS_URL, "TENURE_REDIS_PREFIX": prefix})
        raw = redis.asyncio.Redis.from_url(REDIS_URL, driver_info=DriverInfo(lib_version=redis.__version__))
        try:
            await _establish_lease_state(raw, prefix + "lease:")
        finally:
            await raw.aclose()
    procs: list[subprocess.Popen[bytes]] = []
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        # A backlog is over the default cap on waiting jobs (500), which tenure.connect meets like the gateway.
        settings = tenure.settings.Settings.of(database_url=url, max_queued=10**9, max_queued_per_tenant=10**9)
        async with tenure.connect(app, settings=settings) as client:
            await client.submit_many([tenure.JobRequest("quota_sleep", {}) for _ in range(jobs)])
            for _ in range(workers):
                procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "tenure.cli",
                            "worker",
                            "--app",
                            "leases:app",
                            "--concurrency",
                            str(concurrency),
                        ],
                        env=env,
                        cwd=HERE,
                    )
                )
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                left = await admin.fetchval(
                    f"SELECT count(*) FROM {schema}.jobs WHERE state NOT IN "
                    "('succeeded','failed','cancelled','lost','expired','dead')"
                )
                if left == 0:
                    break
                await asyncio.sleep(0.25)
        row = await admin.fetchrow(
            f"SELECT count(*) FILTER (WHERE state = 'succeeded') AS ok, "
            f"extract(epoch FROM max(finished_at) - min(execution_started_at)) AS span FROM {schema}.jobs"
        )
        moments = [
            (r["began"], r["held"], r["releasing"], r["pid"])
            for r in await admin.fetch(
                f"SELECT (result->>'began')::float8 AS began, (result->>'held')::float8 AS held, "
                f"(result->>'releasing')::float8 AS releasing, (result->>'pid')::int AS pid "
                f"FROM {schema}.jobs WHERE state = 'succeeded'"
            )
        ]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        await admin.execute(f"DROP SCHEMA {schema} CASCADE")
        await admin.close()
        if leases_on == "redis":
            cleanup = redis.asyncio.Redis.from_url(REDIS_URL, driver_info=DriverInfo(lib_version=redis.__version__))
            keys = [k async for k in cleanup.scan_iter(match=prefix + "*")]
            if keys:
                await cleanup.delete(*keys)
            await cleanup.aclose()
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    worker_cpu = (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu_before.ru_utime + cpu_before.ru_stime)
    span = float(row["span"])
    rate = jobs / span
    ceiling = QUOTA_LIMIT / JOB_S
    return {
        "jobs": jobs,
        "succeeded": row["ok"],
        "seconds": span,
        "jobs_per_s": rate,
        "ceiling_per_s": ceiling,
        "fraction_of_ceiling": rate / ceiling,
        "leases_on": leases_on,
        "workers": workers,
        "concurrency": concurrency,
        "worker_cpu_s": worker_cpu,
        "worker_cpu_ms_per_job": 1000 * worker_cpu / jobs,
        "load_average_1m": os.getloadavg()[0],
        "quota": handoff_analysis(moments, QUOTA_LIMIT),
        "src": str(SRC),
    }


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("all", "leases", "jobs"), default="all")
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per lease cell")
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--leases-on", choices=("redis", "postgres", "both"), default="both")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    if args.part in ("all", "leases"):
        results["leases"] = await bench_leases(args.seconds)
        print(
            f"{'clients':>7}  {'bare EVALSHA/s':>14}  {'redis pairs/s':>13}  {'per RT':>6}  {'per pair':>8}  "
            f"{'quota pairs/s':>13}  {'per RT':>6}  {'per pair':>8}  {'postgres pairs/s':>16}  "
            f"{'sqlite pairs/s':>14}  {'load':>9}"
        )
        for name, row in results["leases"].items():
            print(
                f"{name.removeprefix('clients_'):>7}  {row['redis_bare_evalsha_per_s']:>14,.0f}  "
                f"{row['redis_pairs_per_s']:>13,.0f}  {row['redis_lease_round_trips_vs_bare']:>6.0%}  "
                f"{row['redis_pairs_vs_bare']:>8.0%}  {row['redis_quota_pairs_per_s']:>13,.0f}  "
                f"{row['redis_quota_round_trips_vs_bare']:>6.0%}  {row['redis_quota_pairs_vs_bare']:>8.0%}  "
                f"{row['postgres_pairs_per_s']:>16,.0f}  {row['sqlite_pairs_per_s']:>14,.0f}  "
                f"{row['load_average_1m_before']:>4.1f}/{row['load_average_1m_after']:<4.1f}"
            )
    if args.part in ("all", "jobs"):
        backends = ("redis", "postgres") if args.leases_on == "both" else (args.leases_on,)
        results["jobs"] = []
        for on in backends:
            r = await bench_jobs(args.jobs, args.workers, args.concurrency, on)
            results["jobs"].append(r)
            print(
                f"{r['jobs']} jobs of {JOB_S * 1000:.0f} ms under {QUOTA_KEY}={QUOTA_LIMIT}, leases on {on}, "
                f"{r['workers']} workers × {r['concurrency']}: {r['succeeded']} succeeded in {r['seconds']:.2f} s "
                f"= {r['jobs_per_s']:.1f} jobs/s, {r['fraction_of_ceiling']:.0%} of {r['ceiling_per_s']:.0f} "
                f"(worker CPU {r['worker_cpu_ms_per_job']:.2f} ms/job, load average {r['load_average_1m']:.1f})"
            )
            qa = r["quota"]
            print(
                f"  steady state: mean holders {qa['mean_holders']:.2f} of {QUOTA_LIMIT}, "
                f"all {QUOTA_LIMIT} held {qa['holders_time_share'].get(str(QUOTA_LIMIT), 0):.0%} of the time, "
                f"slot cycle {qa['slot_cycle_ms'] or 0:.1f} ms (job {JOB_S * 1000:.0f} ms); hand-off "
                f"p50 {qa['handoff'].get('p50_ms', 0):.2f} p90 {qa['handoff'].get('p90_ms', 0):.2f} "
                f"p99 {qa['handoff'].get('p99_ms', 0):.2f} ms over {qa['handoff']['n']} releases "
                f"({qa['releases_with_nobody_waiting']} with no job waiting)"
            )
            for place, q in qa["handoff_by_place"].items():
                print(
                    f"    to a waiter in the {place.replace('_', ' ')}: n {q['n']}, p50 {q.get('p50_ms', 0):.2f} "
                    f"p90 {q.get('p90_ms', 0):.2f} p99 {q.get('p99_ms', 0):.2f} ms"
                )
    out = HERE / "results" / "leases.json"
    out.parent.mkdir(exist_ok=True)
    # A run of one part keeps the other part's last results.
    previous = json.loads(out.read_text()) if out.exists() else {}
    results["redis_url"] = REDIS_URL
    out.write_text(json.dumps(previous | results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
