"""Operating `tenure up`: admission caps and the circuit breaker (counted in the store), supervision, and the
CLI's client commands through the gateway."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.acceptance.test_gateway_api import IMPOSSIBLE, is_problem, wait_state
from tests.acceptance.up import KEYS, Up, descendants
from tests.conftest import PYTHON, ROOT

pytestmark = pytest.mark.slow


async def test_queue_caps_and_the_circuit_breaker_answer_429_and_503(tmp_path: Path) -> None:
    up = Up(
        f"sqlite:///{tmp_path}/t.db",
        tmp_path,
        workers=1,
        env={"TENURE_MAX_QUEUED": "3", "TENURE_MAX_QUEUED_PER_TENANT": "2", "TENURE_BREAKER_THRESHOLD": "2"},
    )
    try:
        async with (
            httpx.AsyncClient(base_url=up.url, headers=up.headers("tenant-a")) as a,
            httpx.AsyncClient(base_url=up.url, headers=up.headers("tenant-b")) as b,
        ):
            parked = {"agent": "echo", "requires": IMPOSSIBLE}
            first = (await a.post("/v1/jobs", json=parked)).json()
            keyed = await a.post("/v1/jobs", json=parked, headers={"Idempotency-Key": "kept"})
            assert keyed.status_code == 201
            r = await a.post("/v1/jobs", json=parked)
            assert "tenant-a" in is_problem(r, 429)["detail"] and int(r.headers["retry-after"]) >= 1
            replay = await a.post("/v1/jobs", json=parked, headers={"Idempotency-Key": "kept"})
            assert (replay.status_code, replay.json()["id"]) == (200, keyed.json()["id"])  # over the cap too
            changed = {**parked, "input": 2}
            is_problem(await a.post("/v1/jobs", json=changed, headers={"Idempotency-Key": "kept"}), 409)
            assert (await b.post("/v1/jobs", json=parked)).status_code == 201  # 3 waiting in all
            assert "limit is 3" in is_problem(await b.post("/v1/jobs", json=parked), 429)["detail"]
            assert (await a.post(f"/v1/jobs/{first['id']}/cancel")).json()["outcome"] == "accepted"
            assert (await b.post("/v1/jobs", json=parked)).status_code == 201  # room again

            for _ in range(2):
                await a.post(f"/v1/jobs/{first['id']}/cancel")  # keep the caps out of the way
            for j in (await a.get("/v1/jobs", params={"state": "queued"})).json()["jobs"]:
                await a.post(f"/v1/jobs/{j['id']}/cancel")
            for j in (await b.get("/v1/jobs", params={"state": "queued"})).json()["jobs"]:
                await b.post(f"/v1/jobs/{j['id']}/cancel")
            for _ in range(2):
                hung = (await a.post("/v1/jobs", json={"agent": "hang"})).json()
                done = await wait_state(a, hung["id"], {"dead", "failed", "succeeded"})
                assert done["error_code"] == "timeout"
            r = await b.post("/v1/jobs", json={"agent": "hang"})  # the window is per agent, for every tenant
            body = is_problem(r, 503)
            assert "timed out 2 times" in body["detail"] and int(r.headers["retry-after"]) > 1
            assert (await b.post("/v1/jobs", json={"agent": "echo"})).status_code == 201  # other agents flow
    finally:
        assert up.stop() == 0, up.log()


async def test_up_restarts_a_dead_worker_and_stops_everything_on_sigterm(tmp_path: Path) -> None:
    up = Up(f"sqlite:///{tmp_path}/t.db", tmp_path, workers=2)
    try:
        async with httpx.AsyncClient(base_url=up.url, headers=up.headers(None)) as admin:
            pids = {w["pid"] for w in (await admin.get("/v1/workers")).json()["workers"]}
            victim = sorted(pids)[0]
            os.kill(victim, signal.SIGKILL)
            async with asyncio.timeout(30):
                while True:
                    now = {w["pid"] for w in (await admin.get("/v1/workers")).json()["workers"]}
                    if now - pids:
                        break
                    await asyncio.sleep(0.2)
            assert "restarting" in up.log()
        kids = descendants(up.proc.pid)
        assert len(kids) >= 3
    finally:
        assert up.stop() == 0, up.log()
    alive = [p for p in kids if _state(p) != "Z"]
    assert alive == [], up.log()
    assert "tenure up: stopped" in up.log()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


async def cli(up: Up, *args: str) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
    env.update({"TENURE_URL": up.url, "TENURE_API_KEY": KEYS["tenant-a"], "PYTHONPATH": str(ROOT)})
    proc = await asyncio.create_subprocess_exec(
        PYTHON,
        "-m",
        "tenure.cli",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    assert "Traceback" not in err.decode(), err.decode()
    return proc.returncode, out.decode()


async def test_cli_client_commands_go_through_the_gateway(tmp_path: Path) -> None:
    up = Up(f"sqlite:///{tmp_path}/t.db", tmp_path, workers=1)
    try:
        code, out = await cli(up, "submit", "sleep", "--input", '{"seconds": 0.2, "every": 0.05}', "--follow")
        assert code == 0, out
        assert (
            "execution.started" in out
            and "progress" in out
            and out.rstrip().splitlines()[-1].split()[2] == ("job.succeeded")
        )
        code, out = await cli(up, "submit", "echo", "--input", "{}", "--json")
        job_id = json.loads(out)["id"]
        code, out = await cli(up, "tail", job_id, "--json")
        assert code == 0 and json.loads(out.splitlines()[-1])["type"] == "job.succeeded"
        code, out = await cli(up, "cancel", job_id)
        assert (code, out.strip()) == (0, "already_finished")
        code, out = await cli(up, "submit", "publish", "--input", '{"title": "x"}')
        pub = out.strip()
        async with httpx.AsyncClient(base_url=up.url, headers=up.headers()) as a:
            await wait_state(a, pub, {"waiting"})
            code, out = await cli(up, "approve", pub, "--reject")
            assert (code, out.strip()) == (0, "requested")
            done: dict[str, Any] = await wait_state(a, pub, {"succeeded"})
            assert done["result"]["reason"] == "rejected"
        code, out = await cli(up, "cancel", "00000000-0000-7000-8000-000000000000")
        assert (code, out.strip()) == (1, "unknown")
    finally:
        assert up.stop() == 0, up.log()


async def test_a_cancel_reaches_the_owner_before_its_next_heartbeat(database_url: str, tmp_path: Path) -> None:
    # Heartbeats every 10 s: a cancel accepted within 5 s came through the control channel (NOTIFY on
    # Postgres, polling on SQLite), not through the heartbeat reply, which stays the floor.
    slow = {"TENURE_HEARTBEAT_S": "10", "TENURE_CLAIM_TTL_S": "30"}
    up = Up(database_url, tmp_path, workers=1, env=slow)
    try:
        async with httpx.AsyncClient(base_url=up.url, headers=up.headers(), timeout=30) as a:
            job = (await a.post("/v1/jobs", json={"agent": "sleep", "input": {"seconds": 60}})).json()
            await wait_state(a, job["id"], {"running"})
            r = await a.post(f"/v1/jobs/{job['id']}/cancel", params={"wait": 5})
            assert r.json()["outcome"] == "accepted", up.log()
    finally:
        assert up.stop() == 0, up.log()
