"""W2-like pickup latency: 2 idle workers x 10, one submit every 10 ms; latency = job start - before submit."""

import asyncio, os, signal, subprocess, sys, time, json, statistics
import asyncpg, redis

sys.path.insert(0, "/tmp/perf-runs")
import tenure
from tenure.settings import Settings
from w2app import app

URL = "postgresql://postgres@127.0.0.1:5432/perf_bench?search_path=perf_w2"
N = int(os.environ.get("W2_N", "500"))


async def main():
    if len(sys.argv) > 1 and sys.argv[1] == "sqlite":
        url = "sqlite:////tmp/perf-w2.db"
        for s in ("", "-wal", "-shm", "-tenure-lock"):
            try:
                os.unlink("/tmp/perf-w2.db" + s)
            except FileNotFoundError:
                pass
    else:
        url = URL
        c = await asyncpg.connect("postgresql://postgres@127.0.0.1:5432/perf_bench")
        await c.execute("DROP SCHEMA IF EXISTS perf_w2 CASCADE; CREATE SCHEMA perf_w2")
        await c.close()
    r = redis.Redis()
    r.delete("perf-w2")
    env = dict(
        os.environ,
        TENURE_DATABASE_URL=url,
        TENURE_APP="w2app:app",
        TENURE_LOG_LEVEL="warning",
        PYTHONPATH="/tmp/perf-runs" + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    async with tenure.connect(app, settings=Settings(database_url=url)) as client:
        procs = [
            subprocess.Popen(
                [os.path.join(os.path.dirname(sys.executable), "tenure"), "worker", "--concurrency", "10"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=open(f"/tmp/perf-runs/w2-worker{i}.log", "w"),
                start_new_session=True,
            )
            for i in range(2)
        ]
        try:
            for i in range(40):
                await client.submit("w2", {"i": -1 - i})
            while r.hlen("perf-w2") < 40:
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)
            t0s = {}
            start = time.perf_counter()
            for i in range(N):
                due = start + i * 0.01
                d = due - time.perf_counter()
                if d > 0:
                    await asyncio.sleep(d)
                t0s[i] = time.time()
                await client.submit("w2", {"i": i})
            deadline = time.time() + 30
            while r.hlen("perf-w2") < N + 40 and time.time() < deadline:
                await asyncio.sleep(0.05)
        finally:
            for p in procs:
                os.killpg(p.pid, signal.SIGTERM)
            for p in procs:
                p.wait(20)
    got = r.hgetall("perf-w2")
    lat = sorted((float(got[str(i).encode()]) - t0s[i]) * 1000 for i in range(N) if str(i).encode() in got)
    q = lambda p: lat[min(len(lat) - 1, int(round(p * len(lat) + 0.5)) - 1)]
    print(
        json.dumps(
            {
                "n": len(lat),
                "p50": round(q(0.5), 2),
                "p95": round(q(0.95), 2),
                "p99": round(q(0.99), 2),
                "max": round(lat[-1], 2),
                "load": os.getloadavg()[0],
            }
        )
    )


asyncio.run(main())
