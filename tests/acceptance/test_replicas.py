"""Two gateways on one PostgreSQL (seed 004's multi-replica honesty): an idempotency key, the caps and the
streams give the same answers whichever gateway a request lands on."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.acceptance.test_gateway_api import IMPOSSIBLE, is_problem
from tests.acceptance.up import ADMIN_KEY, KEYS, Up, free_port
from tests.conftest import PYTHON, ROOT

pytestmark = pytest.mark.slow

CAPS = {"TENURE_MAX_QUEUED": "3", "TENURE_MAX_QUEUED_PER_TENANT": "3", "TENURE_BREAKER_THRESHOLD": "2"}


@pytest.fixture
def two_gateways(pg_database_url: str, tmp_path: Path) -> Iterator[tuple[Up, str]]:
    up = Up(pg_database_url, tmp_path, workers=1, env=CAPS)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENURE_")}
    env.update(CAPS)
    env.update(
        {
            "TENURE_DATABASE_URL": pg_database_url,
            "PYTHONPATH": str(ROOT),
            "TENURE_API_KEYS": ",".join(f"{t}:{k}" for t, k in KEYS.items()),
            "TENURE_ADMIN_KEY": ADMIN_KEY,
        }
    )
    log = open(tmp_path / "gateway-b.log", "wb")  # closed below
    second = subprocess.Popen(
        [PYTHON, "-m", "tenure.cli", "gateway", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield up, url
    finally:
        second.terminate()
        second.wait(20)
        log.close()
        assert up.stop() == 0, up.log()


async def test_two_gateways_share_idempotency_caps_and_streams(two_gateways: tuple[Up, str]) -> None:
    up, url_b = two_gateways
    h = up.headers("tenant-a")
    async with (
        httpx.AsyncClient(base_url=up.url, headers=h, timeout=30) as a,
        httpx.AsyncClient(base_url=url_b, headers=h, timeout=30) as b,
    ):
        body = {"agent": "echo", "input": {"replica": True}}
        key = {"Idempotency-Key": "across"}
        rs = await asyncio.gather(*(c.post("/v1/jobs", json=body, headers=key) for c in [a, b] * 20))
        assert {r.json()["id"] for r in rs} == {rs[0].json()["id"]}  # one job, whichever gateway answered
        assert sorted(r.status_code for r in rs) == [200] * 39 + [201]
        is_problem(await b.post("/v1/jobs", json={**body, "input": 2}, headers=key), 409)

        # Streams: a job admitted on gateway A, streamed from gateway B.
        job = (await a.post("/v1/jobs", json={"agent": "sleep", "input": {"seconds": 0.3, "every": 0.1}})).json()
        types = []
        async with b.stream("GET", f"/v1/jobs/{job['id']}/events") as r:
            async for line in r.aiter_lines():
                if line.startswith("data:"):
                    types.append(json.loads(line[5:])["type"])
        assert types[0] == "execution.started" and types[-1] == "job.succeeded"

        # Caps: counted in the store, so A and B together admit 3 waiting jobs, not 3 each.
        parked = {"agent": "echo", "requires": IMPOSSIBLE}
        assert (await a.post("/v1/jobs", json=parked)).status_code == 201
        assert (await b.post("/v1/jobs", json=parked)).status_code == 201
        assert (await a.post("/v1/jobs", json=parked)).status_code == 201
        is_problem(await b.post("/v1/jobs", json=parked), 429)
        is_problem(await a.post("/v1/jobs", json=parked), 429)


async def test_two_gateways_share_the_circuit_breaker_and_keep_tenants_apart(two_gateways: tuple[Up, str]) -> None:
    """On PostgreSQL with two gateways: timeouts counted through one gateway open the circuit on the other (the
    window is a table, not a counter in one process), and a tenant sees nothing of another's jobs on either."""
    up, url_b = two_gateways
    async with (
        httpx.AsyncClient(base_url=up.url, headers=up.headers("tenant-a"), timeout=30) as a,
        httpx.AsyncClient(base_url=url_b, headers=up.headers("tenant-b"), timeout=30) as b,
        httpx.AsyncClient(base_url=url_b, headers=up.headers("tenant-a"), timeout=30) as a_on_b,
    ):
        # Tenant isolation across gateways.
        mine = (await a.post("/v1/jobs", json={"agent": "echo", "input": 1}, headers={"Idempotency-Key": "k"})).json()
        assert (await a_on_b.get(f"/v1/jobs/{mine['id']}")).status_code == 200
        for path in (f"/v1/jobs/{mine['id']}", f"/v1/jobs/{mine['id']}/events?format=json"):
            is_problem(await b.get(path), 404)
        is_problem(await b.post(f"/v1/jobs/{mine['id']}/cancel"), 404)
        assert mine["id"] not in {j["id"] for j in (await b.get("/v1/jobs")).json()["jobs"]}
        theirs = await b.post("/v1/jobs", json={"agent": "echo", "input": 1}, headers={"Idempotency-Key": "k"})
        assert theirs.status_code == 201 and theirs.json()["id"] != mine["id"]  # a key never crosses tenants

        # The circuit: two timeouts admitted through A, refused through B (and A), for every tenant.
        for _ in range(2):
            hung = (await a.post("/v1/jobs", json={"agent": "hang"})).json()
            done = await _until_terminal(a, hung["id"])
            assert done["error_code"] == "timeout", done
        for client in (b, a_on_b, a):
            r = await client.post("/v1/jobs", json={"agent": "hang"})
            assert "timed out 2 times" in is_problem(r, 503)["detail"] and int(r.headers["retry-after"]) > 1
        assert (await b.post("/v1/jobs", json={"agent": "echo"})).status_code == 201  # other agents flow


async def _until_terminal(client: httpx.AsyncClient, job_id: str) -> dict[str, object]:
    for _ in range(300):
        job = (await client.get(f"/v1/jobs/{job_id}")).json()
        if job["state"] in ("succeeded", "failed", "dead", "lost", "cancelled", "expired"):
            return dict(job)
        await asyncio.sleep(0.1)
    raise AssertionError(f"job {job_id} did not finish")
