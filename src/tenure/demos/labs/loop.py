"""Lab 1, where the work runs: the same synchronous work on the event loop, then through `ctx.to_thread`.

One worker (heartbeat 1 s, claim TTL 5 s) serves Prometheus `/metrics` from a thread of its own, which keeps
answering while its loop is blocked; the lab reads the worker's own measurements there every 100 ms: the loop
lag (`event_loop_lag_max_seconds`) and the heartbeats sent more than half an interval late
(`tenure_heartbeats_late_total`).
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import httpx

from tenure.control.admission import JobRequest
from tenure.demos.labs._harness import Harness, emit, free_port, lab_store

_LAG = re.compile(r'^event_loop_lag_max_seconds\{[^}]*role="worker"[^}]*\} ([0-9.eE+-]+)$', re.MULTILINE)
_SUM = re.compile(r'^event_loop_lag_seconds_sum\{[^}]*role="worker"[^}]*\} ([0-9.eE+-]+)$', re.MULTILINE)
_COUNT = re.compile(r'^event_loop_lag_seconds_count\{[^}]*role="worker"[^}]*\} ([0-9.eE+-]+)$', re.MULTILINE)
_LATE = re.compile(r"^tenure_heartbeats_late_total\{[^}]*\} ([0-9.eE+-]+)$", re.MULTILINE)


async def _scrape(http: httpx.AsyncClient, url: str) -> tuple[float, float, float, float] | None:
    """(max lag over the sampler's window, late heartbeats, lag sum, lag samples) from the worker's /metrics."""
    try:
        text = (await http.get(url, timeout=2)).text
    except httpx.HTTPError:
        return None

    def total(pattern: re.Pattern[str]) -> float:
        return sum(float(m) for m in pattern.findall(text))

    return max((float(m) for m in _LAG.findall(text)), default=0.0), total(_LATE), total(_SUM), total(_COUNT)


async def run(h: Harness, params: dict[str, Any]) -> None:
    jobs, block_ms, blocks = int(params.get("jobs", 4)), float(params.get("block_ms", 300)), int(params.get("blocks", 6))
    h.heartbeat_s, h.claim_ttl_s = 1.0, 5.0
    port = free_port()
    emit(
        "info",
        text=f"one worker, {jobs} slots, heartbeat {h.heartbeat_s:g} s; its /metrics on :{port}",
        heartbeat_s=h.heartbeat_s,
        phases=["thread", "loop"],
    )
    async with lab_store(h) as client, httpx.AsyncClient() as http:
        worker = h.spawn("worker", concurrency=jobs, args=("--metrics-port", str(port)))
        await h.registered(client, [worker])
        url = f"http://127.0.0.1:{port}/metrics"
        summary: dict[str, dict[str, float]] = {}
        # Through ctx.to_thread first: the window-max gauge of the blocked phase would linger (10 s) into the next.
        last: tuple[float, float, float, float] | None = await _scrape(http, url)
        lag_ms, scraped = 0.0, time.monotonic()
        for mode in ("thread", "loop"):
            late0 = last[1] if last else 0.0
            emit(
                "event",
                t=h.t(),
                phase=mode,
                text=f"{jobs} jobs of {blocks} × {block_ms:g} ms, "
                + ("time.sleep on the event loop" if mode == "loop" else "await ctx.to_thread(time.sleep, ...)"),
            )
            lag_ms = 0.0
            reqs = [JobRequest("lab_block", {"mode": mode, "block_ms": block_ms, "blocks": blocks}) for _ in range(jobs)]
            ids = await client.submit_many(reqs)
            started = time.monotonic()
            max_lag, late = 0.0, 0.0
            while True:
                got = await _scrape(http, url)
                if got is not None:
                    max_lag = max(max_lag, got[0])
                    late = got[1] - late0
                    # The mean lag of the sampler's ticks since the last scrape; none completed: the loop is
                    # stalled, and the lag keeps growing for as long as it stays so.
                    if last is not None and got[3] > last[3]:
                        lag_ms = (got[2] - last[2]) / (got[3] - last[3]) * 1000
                    elif last is not None:
                        lag_ms += (time.monotonic() - scraped) * 1000
                    last, scraped = got, time.monotonic()
                    emit("sample", t=h.t(), phase=mode, lag_ms=round(lag_ms, 1), late_heartbeats=late)
                states = [(await client.job(i)).state for i in ids]
                if all(s.terminal for s in states):
                    break
                if time.monotonic() - started > 45:
                    raise RuntimeError(f"the {mode} phase did not finish within 45 s")
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)
            summary[mode] = {
                "max_lag_ms": round(max_lag * 1000, 1),
                "late_heartbeats": late,
                "seconds": round(time.monotonic() - started, 2),
            }
            emit(
                "event", t=h.t(), phase=mode, text=f"{mode}: max loop lag {max_lag * 1000:.0f} ms, {late:g} late heartbeats"
            )
        a, b = summary["loop"], summary["thread"]
        emit(
            "result",
            summary=summary,
            text=f"On the loop the worker's loop lag reached {a['max_lag_ms']:.0f} ms and {_n(a['late_heartbeats'])} "
            f"late; through ctx.to_thread it stayed at {b['max_lag_ms']:.0f} ms and {_n(b['late_heartbeats'])} "
            "late: the same work, and only the loop-free version keeps the worker's "
            "heartbeats (its claims and leases) on time.",
        )


def _n(late: float) -> str:
    return f"{late:g} heartbeat{'' if late == 1 else 's'} came"
