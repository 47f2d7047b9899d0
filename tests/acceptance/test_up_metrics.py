"""Under `tenure up`, the gateway's /metrics is the whole machine's: its own loop lag (role="gateway") and
the workers' counters, summed from prometheus_client's multiprocess files."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx

from tests.acceptance.up import Up


def _sample(text: str, name: str, **labels: str) -> float:
    total, found = 0.0, False
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    assert found, f"no sample {name}{labels}"
    return total


async def test_the_gateway_metrics_cover_the_gateway_loop_and_every_worker(tmp_path: Path) -> None:
    up = Up(f"sqlite:///{tmp_path}/t.db", tmp_path, workers=2)
    try:
        async with httpx.AsyncClient(base_url=up.url, headers=up.headers("tenant-a"), timeout=30) as client:
            ids = [(await client.post("/v1/jobs", json={"agent": "echo", "input": i})).json()["id"] for i in range(6)]
            async with asyncio.timeout(60):
                while True:
                    states = [(await client.get(f"/v1/jobs/{i}")).json()["state"] for i in ids]
                    if all(s == "succeeded" for s in states):
                        break
                    await asyncio.sleep(0.1)
            async with asyncio.timeout(30):  # workers copy their numbers to the shared files every second
                while True:
                    text = (await client.get("/metrics")).text
                    if re.search(r'^tenure_jobs_finished_total\{[^}]*state="succeeded"', text, re.M):
                        done = _sample(text, "tenure_jobs_finished_total", state="succeeded")
                        if done >= 6:
                            break
                    await asyncio.sleep(0.5)
        assert _sample(text, "event_loop_lag_seconds_count", role="gateway") > 0
        assert _sample(text, "event_loop_lag_seconds_count", role="worker") > 0
        assert _sample(text, "tenure_queue_wait_seconds_count", agent="echo") >= 6
        assert _sample(text, "tenure_queue_capacity", scope="global") == 500  # the gateway's default cap
        assert _sample(text, "tenure_circuit_state", scope="agent:echo") == 0  # admitted: closed
    finally:
        assert up.stop() == 0, up.log()
