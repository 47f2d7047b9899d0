"""Seed 003's worker slot rule: a worker claims a job of an agent with a global worker quota only while it
already holds a slot of that quota — it never claims first and waits for a slot after."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tenure.contracts.states import JobState
from tenure.local import connect
from tests.integration.procs import WorkerProc

pytestmark = pytest.mark.slow

APP = """
import asyncio
from tenure import Tenure

app = Tenure("gpu")

@app.agent("render", worker_quota="gpu-pool")
async def render(ctx, input):
    await asyncio.sleep(input["seconds"])
    return {"ok": True}
"""


async def test_jobs_of_a_worker_quota_agent_are_claimed_only_with_a_global_slot_held(
    sqlite_database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "gpu_app.py").write_text(APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    env = {"TENURE_QUOTAS": "gpu-pool=1", "PYTHONPATH": f"{tmp_path}:{Path(__file__).resolve().parents[2]}"}
    workers = [
        WorkerProc(sqlite_database_url, tmp_path, f"w{i}", concurrency=3, env=env, app="gpu_app:app") for i in range(2)
    ]
    owned_at_once: list[int] = []
    try:
        async with connect("gpu_app:app", sqlite_database_url) as client:
            ids = [(await client.submit("render", {"seconds": 0.3})).job.id for _ in range(5)]
            async with asyncio.timeout(60):
                while True:
                    jobs = [await client.job(i) for i in ids]
                    # Claimed (owned, not started) or running: each needs the one global slot.
                    owned_at_once.append(sum(1 for j in jobs if j.owner is not None and not j.state.terminal))
                    if all(j.state.terminal for j in jobs):
                        break
                    await asyncio.sleep(0.01)
    finally:
        logs = [w.log() for w in workers]
        for w in workers:
            w.stop()
    assert all(j.state is JobState.SUCCEEDED for j in jobs), logs
    assert max(owned_at_once) == 1, f"{max(owned_at_once)} jobs owned at once under gpu-pool=1"
    assert len(owned_at_once) > 50, "the sampler barely ran"


async def test_an_unconfigured_worker_quota_stops_the_worker_at_start_up(sqlite_database_url: str, tmp_path: Path) -> None:
    (tmp_path / "gpu_app.py").write_text(APP)
    env = {"PYTHONPATH": f"{tmp_path}:{Path(__file__).resolve().parents[2]}"}
    worker = WorkerProc(sqlite_database_url, tmp_path, "w", env=env, app="gpu_app:app")
    try:
        code = await asyncio.to_thread(worker.wait, 30)
        log = worker.log()
    finally:
        worker.stop()
    assert code != 0
    assert "gpu-pool" in log and "not configured" in log, log
