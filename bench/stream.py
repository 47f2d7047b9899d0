"""Stream benchmark of the gateway: SSE throughput, emit → client latency, and idle connections.

    .venv/bin/python bench/stream.py                                  # SQLite file in /tmp
    .venv/bin/python bench/stream.py --database-url postgresql://postgres@127.0.0.1:5432/test?search_path=b
    .venv/bin/python bench/stream.py --events 20000 --streams 100 --idle 1000

It starts `tenure up` (one gateway, one worker process with 200 slots, this file as the app) and measures,
over real HTTP on loopback:

- throughput: one job emits `--events` events as fast as it can; one SSE client reads them; events/s =
  events / (first event received → last event received);
- fan-out latency: `ctx.emit` stamps `time.time()` in each payload; the client subtracts it on arrival
  (same machine clock): p50 / p99 for 1 stream, and for `--streams` concurrent streams (one job each,
  100 events, one every `--every` seconds, flushed: an interactive pace, not a flood — the client is one
  Python process and would otherwise measure its own parsing);
- idle connections: `--idle` SSE clients on jobs parked in `ctx.next_input()` (no events); the gateway
  process's resident memory (VmRSS) before and after, per connection.

Prints a table and writes bench/results/stream.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from tenure import Context, Tenure

app = Tenure("bench-stream")
HERE = Path(__file__).resolve().parent


@app.agent("flood", timeout=3600)
async def flood(ctx: Context, input: Any) -> dict[str, Any]:
    """Emit `count` events as fast as the runtime takes them, each stamped with the emit time."""
    for i in range(int(input["count"])):
        await ctx.emit("tick", {"i": i, "t": time.time()})
    return {"emitted": input["count"]}


@app.agent("ticks", timeout=3600)
async def ticks(ctx: Context, input: Any) -> dict[str, Any]:
    """After `delay` seconds (time for every client to connect), emit `count` stamped events, one every
    `every` seconds, flushing each (a paced, interactive stream)."""
    await asyncio.sleep(float(input.get("delay", 0)))
    for i in range(int(input["count"])):
        await ctx.emit("tick", {"i": i, "t": time.time()})
        await ctx.flush()
        await asyncio.sleep(float(input["every"]))
    return {"emitted": input["count"]}


@app.agent("park", timeout=3600)
async def park(ctx: Context, input: Any) -> None:
    """Wait for an input that never comes (holds no worker slot while waiting)."""
    await ctx.next_input()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _gateway_pid(up_pid: int) -> int:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmd = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == up_pid and b"gateway" in cmd:
                return int(entry.name)
    raise RuntimeError("no gateway process under tenure up")


async def _sse(c: httpx.AsyncClient, job_id: str, lat: list[float] | None = None) -> tuple[int, float, float]:
    n, first, last = 0, 0.0, 0.0
    async with c.stream("GET", f"/v1/jobs/{job_id}/events") as r:
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            now = time.time()
            e = json.loads(line[5:])
            if e["type"] == "tick":
                n += 1
                first = first or now
                last = now
                if lat is not None:
                    lat.append(now - e["payload"]["t"])
    return n, first, last


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] * 1000 if xs else float("nan")


async def measure(url: str, args: argparse.Namespace, gateway_pid: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    limits = httpx.Limits(max_connections=args.idle + args.streams + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(30, read=None), limits=limits) as c:
        job = (await c.post("/v1/jobs", json={"agent": "flood", "input": {"count": args.events}})).json()
        n, first, last = await _sse(c, job["id"])
        out["throughput_events_per_s"] = round(n / max(last - first, 1e-9))
        out["throughput_events"] = n

        for streams in (1, args.streams):
            lat: list[float] = []
            jobs = [
                (
                    await c.post(
                        "/v1/jobs",
                        json={
                            "agent": "ticks",
                            "input": {"count": 100, "every": args.every, "delay": 1 + streams / 20},
                        },
                    )
                ).json()
                for _ in range(streams)
            ]
            await asyncio.gather(*(_sse(c, j["id"], lat) for j in jobs))
            out[f"latency_ms_{streams}_streams"] = {
                "p50": round(_pct(lat, 50), 2),
                "p99": round(_pct(lat, 99), 2),
                "events": len(lat),
            }

        parked = [(await c.post("/v1/jobs", json={"agent": "park"})).json()["id"] for _ in range(10)]
        await asyncio.sleep(1.0)
        before = _rss_kib(gateway_pid)
        opened = 0

        async def hold(job_id: str, ready: asyncio.Event, done: asyncio.Event) -> None:
            nonlocal opened
            async with c.stream("GET", f"/v1/jobs/{job_id}/events") as r:
                assert r.status_code == 200
                opened += 1
                if opened == args.idle:
                    ready.set()
                await done.wait()

        ready, done = asyncio.Event(), asyncio.Event()
        holders = [asyncio.create_task(hold(parked[i % len(parked)], ready, done)) for i in range(args.idle)]
        await asyncio.wait_for(ready.wait(), 120)
        await asyncio.sleep(2.0)
        after = _rss_kib(gateway_pid)
        ok = (await c.get("/readyz")).json()
        done.set()
        await asyncio.gather(*holders, return_exceptions=True)
        for j in parked:
            await c.post(f"/v1/jobs/{j}/cancel")
        out["idle_connections"] = ok["subscribers"]
        out["gateway_rss_mib_before"] = round(before / 1024, 1)
        out["gateway_rss_mib_after"] = round(after / 1024, 1)
        out["kib_per_idle_connection"] = round((after - before) / max(args.idle, 1), 1)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database-url", help="default: a fresh SQLite file in a temporary directory")
    p.add_argument("--events", type=int, default=20000)
    p.add_argument("--streams", type=int, default=100)
    p.add_argument("--idle", type=int, default=1000)
    p.add_argument("--every", type=float, default=0.05, help="seconds between events of a paced stream")
    args = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="tenure-bench-stream-")
    db = args.database_url or f"sqlite:///{tmp}/tenure.db"
    port = _port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
    env.update(
        {
            "TENURE_DATABASE_URL": db,
            "TENURE_APP": "stream:app",
            "TENURE_CONCURRENCY": "200",
            "PYTHONPATH": f"{HERE}{os.pathsep}{env.get('PYTHONPATH', '')}",
        }
    )
    log = open(Path(tmp) / "up.log", "wb")
    up = subprocess.Popen(
        [sys.executable, "-m", "tenure.cli", "up", "--port", str(port), "--workers", "1"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/v1/workers", timeout=1).json()["workers"]:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        result = asyncio.run(measure(url, args, _gateway_pid(up.pid)))
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
    result = {
        "store": db.split(":", 1)[0],
        "events": args.events,
        "streams": args.streams,
        "load_average_1m": round(os.getloadavg()[0], 2),  # a 2-core machine shared with other runs
        **result,
    }
    print(f"store                          {result['store']}   (load average {result['load_average_1m']})")
    print(
        f"SSE throughput, 1 client       {result['throughput_events_per_s']:>8} events/s "
        f"({result['throughput_events']} events)"
    )
    for s in (1, args.streams):
        lat = result[f"latency_ms_{s}_streams"]
        print(
            f"emit → client, {s:>3} stream(s)   p50 {lat['p50']:>7.2f} ms   p99 {lat['p99']:>7.2f} ms "
            f"({lat['events']} events)"
        )
    print(
        f"idle SSE connections held      {result['idle_connections']:>8}   gateway RSS "
        f"{result['gateway_rss_mib_before']} → {result['gateway_rss_mib_after']} MiB, "
        f"{result['kib_per_idle_connection']} KiB per connection"
    )
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    name = "stream-postgres.json" if result["store"].startswith("postgres") else "stream-sqlite.json"
    (out / name).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
