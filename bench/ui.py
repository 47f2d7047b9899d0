"""Dashboard benchmark: the jobs page at 100,000 jobs, and the live list under 200 new jobs per second.

    .venv/bin/python bench/ui.py                                   # SQLite file in a temporary directory
    .venv/bin/python bench/ui.py --database-url postgresql://postgres@127.0.0.1:5432/test   # a schema of its own
    .venv/bin/python bench/ui.py --jobs 1000000 --rate 200 --seconds 10

1. Fills a fresh store with `--jobs` jobs through the store's own `enqueue` (three tenants, four agents, with
   idempotency keys), then marks them as a day of history would leave them: 90 % succeeded (finished over
   the last hour), 4 % dead with an error, 1 % failed, the rest queued. `ANALYZE` / `PRAGMA optimize` after.
2. Starts `tenure gateway` (no worker: the queue stays as it is) and reads each page `--repeat` times with a
   session cookie, recording the server's own time (`Server-Timing: page;dur=`, from the route's start to
   its answer: queries and rendering) and the client's: the jobs list unfiltered, by state, by tenant, by
   both, by a rare agent (the bounded window), a deep keyset page, searches by id prefix and idempotency
   key, the live fragment the page polls, the overview and the dead letters.
3. The live list: a client submits `--rate` jobs per second over HTTP for `--seconds` seconds while a
   viewer polls the live fragment once a second, as the page does. For each poll: its server time, and the
   freshness of what it showed — the poll's time minus the submission time of the newest job in it.

Prints tables and writes bench/results/ui-<backend>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from tenure.app import open_store
from tenure.control.admission import Admission, JobRequest
from tenure.demos.examples import app as examples
from tenure.settings import Settings

HERE = Path(__file__).resolve().parent
TENANTS = ("tenant-a", "tenant-b", "tenant-c")
KEYS = {t: f"key-{t}-0123456789" for t in TENANTS}
ADMIN = "admin-key-0123456789"
AGENTS = ("echo", "sleep", "stream", "flaky")  # flaky is the rare one: 1 in 200


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def fill(url: str, n: int) -> dict[str, Any]:
    """`n` jobs through the store's enqueue, then a realistic spread of states (direct SQL: the bench only)."""
    store = await open_store(Settings.of(database_url=url))
    admission = Admission(store, examples.specs())
    rng = random.Random(15)
    started = time.monotonic()
    sample: dict[str, Any] = {}
    try:
        for lo in range(0, n, 1000):
            reqs = []
            for i in range(lo, min(n, lo + 1000)):
                agent = "flaky" if i % 200 == 7 else AGENTS[i % 3]
                reqs.append(JobRequest(agent, {"i": i}, None, (), 3600.0, None, f"order-{i}", TENANTS[i % 3]))
            out = await admission.submit_many(reqs)
            if lo == (n // 2) // 1000 * 1000:
                sample["middle_id"] = out[0].job_id
            sample["last_id"] = out[-1].job_id
    finally:
        await store.close()
    now = time.time()
    if url.startswith("sqlite:"):
        import sqlite3

        db = sqlite3.connect(url[len("sqlite:///") :])
        rows = [(r[0],) for r in db.execute("SELECT id FROM jobs")]
        states = []
        for (job_id,) in rows:
            x = rng.random()
            fin = now - rng.random() * 3600
            if x < 0.90:
                states.append(("succeeded", fin, None, None, fin - 0.05, fin - 0.04, job_id))
            elif x < 0.94:
                states.append(("dead", fin, "RetryableError", "flaky: failing attempt 3", fin - 1, fin - 0.9, job_id))
            elif x < 0.95:
                states.append(("failed", fin, "ValueError", "bad input", fin - 1, fin - 0.9, job_id))
        db.executemany(
            "UPDATE jobs SET state = ?, finished_at = ?, error_code = ?, error_message = ?, epoch = 1, attempts = 1,"
            " claimed_at = ?, execution_started_at = ? WHERE id = ?",
            states,
        )
        db.commit()
        db.execute("PRAGMA optimize")
        db.execute("ANALYZE")
        db.commit()
        db.close()
    else:
        import asyncpg

        conn = await asyncpg.connect(url.split("?")[0], server_settings=_pg_settings(url))
        try:
            await conn.execute(
                """
                WITH r AS (SELECT id, random() AS x, now() - random() * interval '1 hour' AS fin FROM jobs)
                UPDATE jobs AS j SET
                  state = CASE WHEN r.x < 0.90 THEN 'succeeded' WHEN r.x < 0.94 THEN 'dead' ELSE 'failed' END,
                  finished_at = r.fin, epoch = 1, attempts = 1,
                  claimed_at = r.fin - interval '50 ms', execution_started_at = r.fin - interval '40 ms',
                  error_code = CASE WHEN r.x < 0.90 THEN NULL ELSE 'RetryableError' END,
                  error_message = CASE WHEN r.x < 0.90 THEN NULL ELSE 'flaky: failing attempt 3' END
                  FROM r WHERE r.id = j.id AND r.x < 0.95
                """
            )
            await conn.execute("VACUUM (ANALYZE) jobs")
        finally:
            await conn.close()
    sample["fill_s"] = round(time.monotonic() - started, 1)
    return sample


def _pg_settings(url: str) -> dict[str, str]:
    if "?" not in url:
        return {}
    return dict(p.split("=", 1) for p in url.split("?", 1)[1].split("&") if "=" in p)


def start_gateway(url: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
    env.update(
        TENURE_DATABASE_URL=url,
        TENURE_API_KEYS=",".join(f"{t}:{k}" for t, k in KEYS.items()),
        TENURE_ADMIN_KEY=ADMIN,
        TENURE_MAX_QUEUED="100000000",
        TENURE_MAX_QUEUED_PER_TENANT="100000000",
        TENURE_LOG_LEVEL="warning",
        TENURE_UI_LABS="off",
    )
    with open(log, "wb") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "tenure.cli", "gateway", "--port", str(port)],
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


async def session(base: str, key: str) -> httpx.AsyncClient:
    c = httpx.AsyncClient(base_url=base, timeout=30, follow_redirects=False)
    r = await c.post("/ui/login", content=f"key={key}&next=/ui", headers={"Origin": base})
    assert r.status_code == 303, r.text
    return c


def server_ms(r: httpx.Response) -> float:
    m = re.search(r"dur=([0-9.]+)", r.headers.get("server-timing", ""))
    assert m is not None, (r.status_code, r.text[:200])
    return float(m.group(1))


async def pages(base: str, sample: dict[str, Any], repeat: int) -> list[dict[str, Any]]:
    admin = await session(base, ADMIN)
    tenant = await session(base, KEYS["tenant-a"])
    cases = [
        ("jobs, every tenant (admin)", admin, "/ui/jobs"),
        ("jobs of one tenant (its session)", tenant, "/ui/jobs"),
        ("jobs, state=dead (admin)", admin, "/ui/jobs?state=dead"),
        ("jobs, tenant + state=queued (admin)", admin, "/ui/jobs?tenant=tenant-b&state=queued"),
        ("jobs, state=failed (tenant)", tenant, "/ui/jobs?state=failed"),
        ("jobs, rare agent (window of 20,000)", admin, "/ui/jobs?agent=flaky"),
        ("jobs, agent nobody runs (window)", admin, "/ui/jobs?agent=nope"),
        ("jobs, deep page (before the middle)", admin, f"/ui/jobs?before={sample['middle_id']}"),
        ("search: id prefix", admin, f"/ui/jobs?q={sample['middle_id'][:13]}"),
        ("search: idempotency key (admin)", admin, "/ui/jobs?q=order-4242"),
        ("search: idempotency key (tenant)", tenant, "/ui/jobs?q=order-4242"),
        ("live fragment (polled each second)", tenant, "/ui/jobs/rows"),
        ("overview (admin)", admin, "/ui"),
        ("dead letters (tenant)", tenant, "/ui/dead"),
    ]
    out = []
    try:
        for name, client, path in cases:
            await client.get(path)  # warm: the first query of a kind plans it
            srv, wall = [], []
            for _ in range(repeat):
                t = time.perf_counter()
                r = await client.get(path)
                wall.append((time.perf_counter() - t) * 1000)
                assert r.status_code == 200, (name, r.status_code, r.text[:300])
                srv.append(server_ms(r))
            row = {
                "page": name,
                "path": path,
                "server_p50_ms": round(statistics.median(srv), 1),
                "server_p95_ms": round(_pct(srv, 0.95), 1),
                "server_max_ms": round(max(srv), 1),
                "client_p50_ms": round(statistics.median(wall), 1),
            }
            out.append(row)
            print(
                f"  {name:40} server p50 {row['server_p50_ms']:7.1f}  p95 {row['server_p95_ms']:7.1f}  "
                f"max {row['server_max_ms']:7.1f} ms   (client p50 {row['client_p50_ms']:.1f} ms)",
                flush=True,
            )
    finally:
        await admin.aclose()
        await tenant.aclose()
    return out


async def live(base: str, rate: float, seconds: float) -> dict[str, Any]:
    """Submit `rate` jobs/s for `seconds` while a viewer polls the live fragment every second."""
    submitted: dict[str, float] = {}
    stop = asyncio.Event()
    errors = 0
    spent = [seconds]  # how long the submissions took, the last answer included

    async def submitter() -> None:
        nonlocal errors
        async with httpx.AsyncClient(
            base_url=base, timeout=30, headers={"Authorization": f"Bearer {KEYS['tenant-a']}"}
        ) as c:
            sem = asyncio.Semaphore(32)
            start = time.monotonic()
            n = 0

            async def one(i: int) -> None:
                nonlocal errors
                async with sem:
                    try:
                        r = await c.post("/v1/jobs", json={"agent": "echo", "input": {"live": i}})
                    except httpx.HTTPError:
                        errors += 1
                        return
                    if r.status_code == 201:
                        submitted[r.json()["id"]] = time.time()
                    else:
                        errors += 1

            async with asyncio.TaskGroup() as tg:
                while time.monotonic() - start < seconds:
                    due = int((time.monotonic() - start) * rate)
                    while n < due:
                        tg.create_task(one(n))
                        n += 1
                    await asyncio.sleep(0.005)
            spent[0] = time.monotonic() - start
        stop.set()

    polls: list[dict[str, float]] = []

    async def viewer() -> None:
        c = await session(base, KEYS["tenant-a"])
        try:
            while not stop.is_set():
                t = time.time()
                r = await c.get("/ui/jobs/rows")
                seen = time.time()
                d = r.json()
                newest = d["newest"]
                rows = len(re.findall(r'data-job="', d["rows"]))
                polls.append(
                    {
                        "server_ms": server_ms(r),
                        "fresh_ms": (seen - submitted[newest]) * 1000 if newest in submitted else -1,
                        "rows": rows,
                        "t": t,
                    }
                )
                await asyncio.sleep(max(0.0, 1.0 - (time.time() - t)))
        finally:
            await c.aclose()

    async with asyncio.TaskGroup() as tg:
        tg.create_task(submitter())
        tg.create_task(viewer())
    fresh = [p["fresh_ms"] for p in polls[1:] if p["fresh_ms"] >= 0]
    srv = [p["server_ms"] for p in polls]
    return {
        "rate_asked": rate,
        "submitted": len(submitted),
        "rate_achieved": round(len(submitted) / spent[0], 1),
        "errors": errors,
        "polls": len(polls),
        "poll_server_p50_ms": round(statistics.median(srv), 1) if srv else None,
        "poll_server_max_ms": round(max(srv), 1) if srv else None,
        "fresh_p50_ms": round(statistics.median(fresh), 1) if fresh else None,
        "fresh_max_ms": round(max(fresh), 1) if fresh else None,
        "polls_showing_a_job_newer_than_the_last_poll": sum(1 for f in fresh if f < 1000 + 250),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", help="default: a SQLite file in a temporary directory")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--name", help="results file: bench/results/ui-NAME.json (default: the backend)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tenure-bench-ui-"))
    url, schema = args.database_url, None
    if url is None:
        url = f"sqlite:///{tmp}/bench.db"
    elif url.startswith("postgres") and "search_path" not in url:
        import asyncpg

        schema = f"bench_ui_{os.getpid()}"
        conn = await asyncpg.connect(url)
        await conn.execute(f"CREATE SCHEMA {schema}")
        await conn.close()
        url = f"{url}?search_path={schema}"
    backend = "sqlite" if url.startswith("sqlite") else "postgres"
    print(f"bench/ui.py: {args.jobs:,} jobs on {backend} ({url.split('?')[0] if backend == 'postgres' else url})")
    gateway = None
    try:
        sample = await fill(url, args.jobs)
        print(f"  filled in {sample['fill_s']} s", flush=True)
        port = _port()
        base = f"http://127.0.0.1:{port}"
        gateway = start_gateway(url, port, tmp / "gateway.log")
        async with httpx.AsyncClient() as c:
            for _ in range(300):
                with contextlib.suppress(httpx.HTTPError):
                    if (await c.get(base + "/healthz")).status_code == 200:
                        break
                await asyncio.sleep(0.1)
        print("pages (server time from Server-Timing; the client's over loopback in brackets):")
        rows = await pages(base, sample, args.repeat)
        print(f"live list: {args.rate:g} new jobs/s for {args.seconds:g} s, polled every second")
        lv = await live(base, args.rate, args.seconds)
        print(
            f"  submitted {lv['submitted']} ({lv['rate_achieved']}/s, {lv['errors']} errors); {lv['polls']} polls: server "
            f"p50 {lv['poll_server_p50_ms']} ms, max {lv['poll_server_max_ms']} ms; freshness of the newest row shown "
            f"p50 {lv['fresh_p50_ms']} ms, max {lv['fresh_max_ms']} ms"
        )
        load = os.getloadavg()[0]
        result = {
            "backend": backend,
            "jobs": args.jobs,
            "load_1min": round(load, 2),
            "pages": rows,
            "live": lv,
            "fill_s": sample["fill_s"],
        }
        (HERE / "results").mkdir(exist_ok=True)
        out = HERE / "results" / f"ui-{args.name or backend}.json"
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out} (1-min load {load:.2f})")
    finally:
        if gateway is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(gateway.pid, signal.SIGTERM)
            gateway.wait(15)
        if schema is not None:
            import asyncpg

            conn = await asyncpg.connect(url.split("?")[0])
            await conn.execute(f"DROP SCHEMA {schema} CASCADE")
            await conn.close()


if __name__ == "__main__":
    asyncio.run(main())
