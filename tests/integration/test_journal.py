"""The effect journal under real crashes (worker processes, SIGKILL and SIGSTOP, SQLite and PostgreSQL).

A retry-safe agent with three journaled steps, each appending one line to an external file, is SIGKILLed
during its second step, over and over: every time the job is requeued (retry-safe), finishes, and the file
holds each step's line exactly once; the step interrupted mid-way surfaces as `StepUnknown` to the next attempt
(which looks at the file and resolves it). `JOURNAL_TEST_KILLS` sets the number of kills per backend
(default 50), in rounds of `LANES` jobs killed at once.

A worker frozen (SIGSTOP) in a handler and resumed after its job was reclaimed adds no tool call, evidence,
usage or step: asserted on the store.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import time
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import asyncpg
import pytest

from tenure.contracts.states import JobState
from tenure.local import LocalClient, connect
from tests.apps.audit_app import app
from tests.conftest import PG_BASE
from tests.integration.procs import WorkerProc, eventually

pytestmark = pytest.mark.slow

APP = "tests.apps.audit_app:app"
KILLS = int(os.environ.get("JOURNAL_TEST_KILLS", "50"))
LANES = 5  # jobs killed at once, each in a worker of its own (concurrency 1)
BEFORE_S, AFTER_S = 0.2, 0.6  # the second step's pauses around its append: a kill lands on either side


class Pool:
    """`size` single-slot worker processes; a killed one is replaced at once."""

    def __init__(self, database_url: str, log_dir: Path, size: int) -> None:
        self.url, self.log_dir, self.spawned = database_url, log_dir, 0
        self.procs: dict[int, WorkerProc] = {}
        for _ in range(size):
            self.spawn()

    def spawn(self) -> None:
        self.spawned += 1
        p = WorkerProc(self.url, self.log_dir, f"w{self.spawned}", app=APP)
        self.procs[p.pid] = p

    def kill(self, pid: int) -> None:
        self.procs.pop(pid).stop()  # SIGKILL (and reaped)
        self.spawn()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.log()[-3000:]}" for p in self.procs.values())

    def stop(self) -> None:
        for p in self.procs.values():
            p.stop()


async def _read(path: Path) -> list[str]:
    return (await asyncio.to_thread(path.read_text)).split("\n")[:-1] if path.exists() else []


async def _kill_in_step_two(pool: Pool, marker: Path) -> None:
    async def began() -> str | None:
        lines = await _read(marker)
        return lines[0] if lines else None

    pid = int(await eventually(began, 60, f"step two to begin ({marker})\n{pool.logs()}", interval=0.005))
    await asyncio.sleep(random.uniform(0, 2 * BEFORE_S))  # before or after its append, at random
    pool.kill(pid)


async def test_a_retry_safe_journaled_agent_killed_in_its_second_step_runs_each_step_once(
    database_url: str, tmp_path: Path
) -> None:
    pool = Pool(database_url, tmp_path, 2 * LANES)
    began = time.monotonic()
    outcomes: dict[str, int] = {}
    kills = 0
    try:
        async with connect(app, database_url) as client:
            while kills < KILLS:
                lane_count = min(LANES, KILLS - kills)
                runs = []
                for lane in range(lane_count):
                    d = tmp_path / f"job{kills + lane}"
                    d.mkdir()
                    files = {k: str(d / k) for k in ("path", "marker", "unknown")}
                    job_id = (await client.submit("journaled", {**files, "before_s": BEFORE_S, "after_s": AFTER_S})).job.id
                    runs.append((job_id, d))
                await asyncio.gather(*(_kill_in_step_two(pool, d / "marker") for _, d in runs))
                kills += lane_count
                for job_id, d in runs:
                    job = await eventually(lambda j=job_id: _terminal(client, j), 60, f"job {job_id}\n{pool.logs()}")
                    assert job.state is JobState.SUCCEEDED, (job, pool.logs())
                    assert job.result == {"steps": ["one", "two", "three"]}
                    # The kill cost one attempt: requeued, not lost (the history says what cost any other).
                    history = [(e.type, e.epoch, e.payload) for e in await client.events(job_id)]
                    assert job.attempts == 2, (job, history, pool.logs())
                    assert await _read(d / "path") == ["one", "two", "three"], d  # each step ran exactly once
                    (unknown,) = await _read(d / "unknown")  # the next attempt was told, once
                    key, started_at, outcome = unknown.split()
                    outcomes[outcome] = outcomes.get(outcome, 0) + 1
                    steps = {s.key: s for s in await client.store.read_steps(job_id)}
                    assert key == "two" and float(started_at) == pytest.approx(steps["two"].started_at)
                    assert [(k, s.state, s.epoch) for k, s in steps.items()] == [
                        ("one", "done", 1),
                        ("two", "resolved", 1),
                        ("three", "done", 2),
                    ]
    finally:
        pool.stop()
    print(f"\n{database_url.split(':')[0]}: {kills} kills in {time.monotonic() - began:.1f}s; step two was {outcomes}")
    assert kills >= KILLS


async def _terminal(client: LocalClient, job_id: str) -> object:
    job = await client.job(job_id)
    return job if job.state.terminal else None


async def _expire_claim(database_url: str, job_id: str) -> None:
    """Make the job's claim expired now (as if the frozen owner's heartbeats had stopped for a TTL)."""
    if database_url.startswith("sqlite"):

        def run() -> None:
            db = sqlite3.connect(database_url.removeprefix("sqlite:///"))
            db.execute("UPDATE jobs SET claim_expires_at = 0 WHERE id = ?", (job_id,))
            db.commit()
            db.close()

        await asyncio.to_thread(run)
        return
    schema = parse_qs(urlparse(database_url).query)["search_path"][0]
    conn = await asyncpg.connect(PG_BASE, server_settings={"search_path": schema})
    try:
        await conn.execute("UPDATE jobs SET claim_expires_at = now() - interval '1 s' WHERE id = $1::uuid", job_id)
    finally:
        await conn.close()


async def test_a_frozen_worker_resumed_after_its_job_was_reclaimed_writes_no_record_or_step(
    database_url: str, tmp_path: Path
) -> None:
    # Long heartbeats: the frozen worker does not notice its loss before its handler's writes reach the store.
    slow = {"TENURE_HEARTBEAT_S": "10", "TENURE_CLAIM_TTL_S": "30"}
    files = {k: str(tmp_path / k) for k in ("ready", "go", "effects")}
    frozen = WorkerProc(database_url, tmp_path, "frozen", app=APP, env=slow)
    rescuer: WorkerProc | None = None
    try:
        async with connect(app, database_url) as client:
            job_id = (await client.submit("frozen", files)).job.id
            await eventually(lambda: _read(Path(files["ready"])), 30, f"the first writes\n{frozen.log()}")
            frozen.signal(signal.SIGSTOP)
            await _expire_claim(database_url, job_id)
            # The sweep, here rather than by the rescuer: the frozen worker may hold the sweeper duty's lease.
            assert (await client.store.sweep(60)).requeued == [job_id]  # retry-safe: requeued, not lost
            rescuer = WorkerProc(database_url, tmp_path, "rescuer", app=APP)
            job = await eventually(lambda: _terminal(client, job_id), 60, f"the rescue\n{rescuer.log()}")
            assert job.state is JobState.SUCCEEDED and job.result == {"attempt": 2}, job  # type: ignore[attr-defined]
            Path(files["go"]).touch()
            frozen.signal(signal.SIGCONT)

            async def said_lost() -> bool:
                return "no longer owned" in frozen.log() or "ownership lost" in frozen.log()

            await eventually(said_lost, 30, f"the resumed worker to find its job lost\n{frozen.log()}")
            await asyncio.sleep(0.5)  # anything it still had queued has had its round trip
            records = await client.store.read_audit(job_id, None, 100)
            assert [(r.epoch, r.kind, r.name) for r in records] == [(1, "tool_call", "early"), (1, "evidence", "early")]
            steps = await client.store.read_steps(job_id)
            assert [(s.key, s.state, s.epoch) for s in steps] == [("early", "done", 1)]
            assert await client.store.audit_usage(job_id) == {}  # the late usage report matched no row
            assert await _read(Path(files["effects"])) == ["early"]  # the late step's function never ran
            assert (await client.job(job_id)).result == {"attempt": 2}
    finally:
        frozen.stop()
        if rescuer is not None:
            rescuer.stop()
