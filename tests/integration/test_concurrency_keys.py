"""Concurrency keys across processes (issue 13's must-show): 200 jobs on 20 conversation keys submitted through
two `tenure gateway` processes, run by four `tenure worker` processes while workers are SIGKILLed at random and
restarted. The agent (tests/apps/keys_app.py) appends the start and the end of every execution to a file; a
killed execution has no end line, and its end is when the sweeper declared it lost (its process was dead by
then). No two intervals of one key may overlap, and every job must end terminal. Then, on the same fleet:
`reject` answers 409 with the running job's id (over HTTP, and `tenure submit` exits 1 saying so), and
`interrupt` cancels the running job and starts after its cancellation was accepted (it ended)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tenure.app import open_backends
from tenure.contracts.states import JobState
from tenure.contracts.types import JobFilter
from tenure.settings import Settings
from tests.conftest import PYTHON, REDIS_URL, ROOT, drop_pg_schema, new_pg_schema, pg_url
from tests.integration.procs import TenureProc, WorkerProc, eventually
from tests.integration.redisproc import free_port

APP = "tests.apps.keys_app:app"
JOBS, KEYS, WORKERS, GATEWAYS = 200, 20, 4, 2


class Fleet:
    def __init__(self, database_url: str, tmp: Path, env: dict[str, str] | None = None) -> None:
        self.database_url = database_url
        self.tmp = tmp
        self.log = tmp / "turns.jsonl"
        self.env = {"KEYS_TEST_LOG": str(self.log), "TENURE_MAX_QUEUED": "1000", "TENURE_MAX_QUEUED_PER_TENANT": "1000"}
        self.env.update(env or {})
        self.ports = [free_port() for _ in range(GATEWAYS)]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.gateways = [
            TenureProc(database_url, tmp, f"gateway-{i}", ["gateway", "--app", APP, "--port", str(p)], env=self.env)
            for i, p in enumerate(self.ports)
        ]
        self.started = 0
        self.workers = [self._worker() for _ in range(WORKERS)]

    def _worker(self) -> WorkerProc:
        self.started += 1
        return WorkerProc(self.database_url, self.tmp, f"worker-{self.started}", concurrency=4, app=APP, env=self.env)

    def kill_one(self, rng: random.Random) -> None:
        i = rng.randrange(len(self.workers))
        self.workers[i].signal(signal.SIGKILL)
        self.workers[i].stop()
        self.workers[i] = self._worker()

    def stop(self) -> None:
        for p in [*self.gateways, *self.workers]:
            p.stop()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.log()[-2000:]}" for p in [*self.gateways, *self.workers])

    def turns(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]


async def _ready(http: httpx.AsyncClient, urls: list[str]) -> bool:
    for u in urls:
        try:
            if (await http.get(u + "/readyz")).status_code != 200:
                return False
        except httpx.HTTPError:
            return False
    return True


async def _submit(http: httpx.AsyncClient, url: str, body: dict[str, Any]) -> httpx.Response:
    for _ in range(50):
        try:
            r = await http.post(url + "/v1/jobs", json=body)
        except httpx.HTTPError:
            await asyncio.sleep(0.1)
            continue
        if r.status_code < 500:
            return r
        await asyncio.sleep(0.1)
    raise AssertionError(f"could not submit {body}")


def _overlaps(turns: list[dict[str, Any]], lost_end: dict[str, float]) -> list[str]:
    """Pairs of executions of one key whose intervals overlap."""
    spans: dict[str, dict[str, list[float]]] = {}
    for t in turns:
        span = spans.setdefault(t["key"], {}).setdefault(t["job"], [0.0, 0.0])
        span[0 if t["what"] == "start" else 1] = t["t"]
    bad = []
    for key, jobs in spans.items():
        intervals = []
        for job, (start, end) in jobs.items():
            end = end or lost_end.get(job, float("inf"))  # killed: it ended when the sweeper declared it lost
            intervals.append((start, end, job))
        intervals.sort()
        for (_, e1, j1), (s2, _, j2) in itertools.pairwise(intervals):
            if s2 < e1:
                bad.append(f"key {key}: {j2} started {e1 - s2:.3f}s before {j1} ended")
    return bad


async def _many_turns(fleet: Fleet, backends: Any, http: httpx.AsyncClient) -> None:
    """The 200 jobs on 20 keys through both gateways while workers are killed: no overlap, every job terminal."""
    rng = random.Random(13)
    await eventually(lambda: _ready(http, fleet.urls), 60, "both gateways ready")
    sem = asyncio.Semaphore(16)

    async def one(i: int) -> str:
        key = f"conversation-{i % KEYS}"
        body = {"agent": "turn", "input": {"key": key, "seconds": rng.uniform(0.05, 0.35)}, "concurrency_key": key}
        async with sem:
            r = await _submit(http, fleet.urls[i % GATEWAYS], body)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    submitting = asyncio.gather(*(one(i) for i in range(JOBS)))
    kills = 0
    deadline = time.monotonic() + 150
    ids: list[str] = []
    while time.monotonic() < deadline:
        await asyncio.sleep(rng.uniform(0.5, 1.0))
        if kills < 6:
            fleet.kill_one(rng)
            kills += 1
        if submitting.done():
            ids = submitting.result()
            jobs = [await backends.jobs.get_job(j) for j in ids]
            if all(j is not None and j.state.terminal for j in jobs):
                break
    else:
        pytest.fail(f"not every job ended within the deadline\n{fleet.logs()}")
    jobs = [j for j in (await backends.jobs.list_jobs(JobFilter(limit=1000))) if j.id in set(ids)]
    assert len(jobs) == JOBS and all(j.state.terminal for j in jobs)
    lost = {j.id: float(j.finished_at or 0) for j in jobs if j.state is JobState.LOST}
    turns = fleet.turns()
    assert len({t["job"] for t in turns if t["what"] == "start"}) >= JOBS - len(lost)
    assert _overlaps(turns, lost) == [], fleet.logs()
    assert kills >= 3
    print(f"{len(jobs)} jobs, {kills} kills, {len(lost)} lost, {len(turns)} records")


@pytest.mark.timeout(240)
async def test_no_two_jobs_of_one_key_run_at_once_across_gateways_workers_and_kills(
    database_url: str, tmp_path: Path
) -> None:
    await (await open_backends(Settings.of(database_url=database_url))).close()  # migrated before they start
    fleet = Fleet(database_url, tmp_path)
    backends = await open_backends(Settings.of(database_url=database_url))
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            await _many_turns(fleet, backends, http)

            # reject: 409 with the running job's id, and `tenure submit` exits 1 saying so.
            long = {"agent": "turn", "input": {"key": "r", "seconds": 30}, "concurrency_key": "r"}
            first = (await _submit(http, fleet.urls[0], long)).json()["id"]
            await eventually(lambda: _state(backends, first, JobState.RUNNING), 30, "the long job running")
            r = await _submit(http, fleet.urls[1], {**long, "multitask": "reject"})
            assert r.status_code == 409 and r.json()["running_job_id"] == first, r.text
            cli = await asyncio.create_subprocess_exec(
                PYTHON, "-m", "tenure.cli", "submit", "turn", "--input", '{"key": "r"}', "--concurrency-key", "r",
                "--multitask", "reject", "--url", fleet.urls[0],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "TENURE_APP": APP},
            )  # fmt: skip
            _, err = await asyncio.wait_for(cli.communicate(), 60)
            stderr = err.decode()
            assert cli.returncode == 1 and "409" in stderr and first in stderr, stderr

            # interrupt: the running one is cancelled, and the new one starts after it ended.
            r = await _submit(http, fleet.urls[1], {**long, "input": {"key": "r", "seconds": 0.1}, "multitask": "interrupt"})
            assert r.status_code == 201, r.text
            second = r.json()["id"]
            done = await eventually(lambda: _state(backends, second, JobState.SUCCEEDED), 60, "the interrupting job")
            assert done
            old = await backends.jobs.get_job(first)
            assert old is not None and old.state is JobState.CANCELLED
            spans = {(t["job"], t["what"]): t["t"] for t in fleet.turns()}
            assert spans[(second, "start")] >= spans[(first, "end")]
            assert spans[(second, "start")] >= (old.finished_at or 0) - 0.05  # its cancellation was accepted first
    finally:
        await backends.close()
        fleet.stop()


@pytest.mark.timeout(240)
async def test_the_key_rule_holds_when_the_redis_ready_index_hints_the_claims(tmp_path: Path) -> None:
    """With TENURE_REDIS_URL the workers wait on the ready index's hints; the store's claim still decides."""
    schema = await new_pg_schema()
    url = pg_url(schema)
    try:
        await (await open_backends(Settings.of(database_url=url))).close()
        fleet = Fleet(url, tmp_path, {"TENURE_REDIS_URL": REDIS_URL, "TENURE_REDIS_PREFIX": f"keys-{schema}:"})
        backends = await open_backends(Settings.of(database_url=url))
        try:
            async with httpx.AsyncClient(timeout=10) as http:
                await _many_turns(fleet, backends, http)
        finally:
            await backends.close()
            fleet.stop()
    finally:
        await drop_pg_schema(schema)


async def _state(backends: Any, job_id: str, state: JobState) -> bool:
    job = await backends.jobs.get_job(job_id)
    return job is not None and job.state is state
