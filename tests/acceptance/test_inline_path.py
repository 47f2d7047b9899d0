"""The local fast path (seed 000; docs/routing.md): `tenure up --inline` starts the jobs its gateway admits on its
own in-process worker while that worker has room, through the same claim CAS, whatever the other workers do."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tests.acceptance.up import Up

pytestmark = pytest.mark.slow


def _is_gateway(pid: int) -> bool:
    return b"gateway" in Path(f"/proc/{pid}/cmdline").read_bytes()


async def test_sequential_submits_all_start_on_the_inline_worker(database_url: str, tmp_path: Path) -> None:
    server = Up(database_url, tmp_path, workers=2, inline=True, env={"TENURE_CONCURRENCY": "2"})
    try:
        async with httpx.AsyncClient(base_url=server.url, headers=server.headers(), timeout=30) as c:
            workers = (await c.get("/v1/workers", headers=server.headers(None))).json()["workers"]
            inline = [w["id"] for w in workers if _is_gateway(w["pid"])]
            assert len(inline) == 1 and len(workers) == 3, workers
            claimed: list[str] = []
            for i in range(50):
                job = (await c.post("/v1/jobs", json={"agent": "echo", "input": {"i": i}})).json()
                for _ in range(300):  # the next submit comes when this one ended: the inline worker has room
                    got = (await c.get(f"/v1/jobs/{job['id']}")).json()
                    if got["state"] == "succeeded":
                        break
                    await asyncio.sleep(0.02)
                assert got["state"] == "succeeded", got
                route = got["route"]
                assert route["reason"] == "local" and route["preferred_worker"] == inline[0], route
                assert route["why"].startswith("local fast path"), route
                claimed.append(route["claimed_by"])
        assert claimed == inline * 50  # every one started on the gateway's own worker, none on the two others
    finally:
        assert server.stop() == 0, server.log()
