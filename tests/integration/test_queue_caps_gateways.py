"""Per-agent queue caps across two gateways (issue 13's must-show, PostgreSQL): 30 concurrent submissions of a
capped agent, spread over two `tenure gateway` processes with no worker running, admit exactly `max_queued`
jobs of the agent and `max_queued` of its fallback (each degraded job says so in `GET /v1/jobs/{id}`), and answer
every other one `429` with `Retry-After`; `tenure_degraded_total` counts the degraded ones over both gateways."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest

from tenure.app import open_backends
from tenure.settings import Settings
from tests.conftest import drop_pg_schema, new_pg_schema, pg_url
from tests.integration.procs import TenureProc, eventually
from tests.integration.redisproc import free_port

APP = "tests.apps.keys_app:app"


async def _ready(http: httpx.AsyncClient, urls: list[str]) -> bool:
    try:
        codes = [(await http.get(u + "/readyz")).status_code for u in urls]
    except httpx.HTTPError:
        return False
    return all(c == 200 for c in codes)


@pytest.mark.timeout(120)
async def test_caps_hold_across_two_gateways_degrade_then_refuse(tmp_path: Path) -> None:
    schema = await new_pg_schema()
    url = pg_url(schema)
    gateways: list[TenureProc] = []
    try:
        await (await open_backends(Settings.of(database_url=url))).close()
        ports = [free_port(), free_port()]
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        env = {"KEYS_TEST_LOG": str(tmp_path / "turns.jsonl")}
        gateways = [
            TenureProc(url, tmp_path, f"gateway-{i}", ["gateway", "--app", APP, "--port", str(p)], env=env)
            for i, p in enumerate(ports)
        ]
        async with httpx.AsyncClient(timeout=15) as http:
            await eventually(lambda: _ready(http, urls), 60, "both gateways ready")
            answers = await asyncio.gather(
                *(http.post(urls[i % 2] + "/v1/jobs", json={"agent": "deep", "input": {"n": i}}) for i in range(30))
            )
            created = [r.json() for r in answers if r.status_code == 201]
            refused = [r for r in answers if r.status_code == 429]
            assert len(created) == 10 and len(refused) == 20, [r.status_code for r in answers]
            assert all(int(r.headers["Retry-After"]) >= 1 for r in refused)
            assert all("max_queued" in r.json()["detail"] for r in refused)
            by_agent = {a: [j for j in created if j["agent"] == a] for a in ("deep", "fast")}
            assert len(by_agent["deep"]) == 5 and len(by_agent["fast"]) == 5
            one = (await http.get(f"{urls[1]}/v1/jobs/{by_agent['fast'][0]['id']}")).json()
            assert (one["mode_requested"], one["mode_effective"], one["degraded_reason"]) == ("deep", "fast", "queue_full")
            assert one["waiting_reason"]["kind"] == "no_capable_worker"  # no worker runs: nothing can take it
            plain = (await http.get(f"{urls[0]}/v1/jobs/{by_agent['deep'][0]['id']}")).json()
            assert plain["degraded_reason"] is None and plain["mode_effective"] is None
            total = 0.0
            for u in urls:
                text = (await http.get(u + "/metrics")).text
                for m in re.finditer(r"^tenure_degraded_total\{([^}]*)\} ([0-9.e+]+)$", text, re.M):
                    assert 'agent="deep"' in m[1] and 'reason="queue_full"' in m[1]
                    total += float(m[2])
            assert total == 5
    finally:
        for g in gateways:
            g.stop()
        await drop_pg_schema(schema)
