"""`GET /v1/jobs/{id}/audit` and `tenure audit ID` as a user drives them: `tenure up` on SQLite with the audit
test app and a price table; a job retried twice, read back over HTTP (paged, tenant-checked) and in the CLI."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.acceptance.test_cli import tenure
from tests.acceptance.test_gateway_api import is_problem
from tests.acceptance.up import Up

pytestmark = pytest.mark.slow
PRICES = {"gpt-test": {"input": 0.5, "output": 2.0}}
TENANT_BUDGETS = {"tenant-b": {"tokens": 100}}  # one researcher attempt reports 110


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    d = tmp_path_factory.mktemp("audit")
    server = Up(f"sqlite:///{d}/tenure.db", d, workers=1, app="tests.apps.audit_app:app",
                env={"TENURE_PRICES": json.dumps(PRICES), "TENURE_TENANT_BUDGETS": json.dumps(TENANT_BUDGETS)})  # fmt: skip
    server.db = f"sqlite:///{d}/tenure.db"  # type: ignore[attr-defined]
    yield server
    assert server.stop() == 0, server.log()


async def test_the_audit_of_a_job_retried_twice_over_http_and_in_the_cli(up: Up, tmp_path: Path) -> None:
    async with (
        httpx.AsyncClient(base_url=up.url, headers=up.headers("tenant-a"), timeout=30) as a,
        httpx.AsyncClient(base_url=up.url, headers=up.headers("tenant-b"), timeout=30) as b,
    ):
        r = await a.post("/v1/jobs", json={"agent": "researcher", "input": {"succeed_on": 3}})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        async with asyncio.timeout(60):
            while (await a.get(f"/v1/jobs/{job_id}")).json()["state"] != "succeeded":
                await asyncio.sleep(0.1)
        audit = (await a.get(f"/v1/jobs/{job_id}/audit")).json()
        assert [(e["attempt"], e["outcome"]) for e in audit["executions"]] == [
            (1, "failed"),
            (2, "failed"),
            (3, "succeeded"),
        ]
        assert [e["content"]["attempt"] for e in audit["evidence"]] == [1, 2, 3]
        assert len(audit["tool_calls"]) == 6 and audit["next_cursor"] is None
        expected = sum((100 * n * 0.5 + 10 * 2.0) / 1000 for n in (1, 2, 3))
        assert audit["usage_totals"]["input_tokens"] == 600
        assert audit["usage_totals"]["cost_usd"] == pytest.approx(expected)
        # paged: two records a page, the cursor walks all twelve in order
        seen, cursor = [], ""
        while cursor is not None:
            page = (await a.get(f"/v1/jobs/{job_id}/audit", params={"limit": 2, "cursor": cursor})).json()
            seen += [(r["epoch"], r["seq"]) for k in ("tool_calls", "evidence", "usage") for r in page[k]]
            cursor = page["next_cursor"]
        assert seen == sorted(seen) and len(seen) == 12
        # another tenant sees nothing; bad parameters are 400, never a 500
        is_problem(await b.get(f"/v1/jobs/{job_id}/audit"), 404)
        is_problem(await a.get("/v1/jobs/not-a-job/audit"), 404)
        is_problem(await a.get(f"/v1/jobs/{job_id}/audit", params={"cursor": "x"}), 400)
        is_problem(await a.get(f"/v1/jobs/{job_id}/audit", params={"limit": 0}), 400)
    db = up.db  # type: ignore[attr-defined]
    shown = tenure(db, "audit", job_id, "--app", "tests.apps.audit_app:app")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith(f"job {job_id}  researcher  succeeded")
    assert sum(line.startswith("attempt ") for line in lines) == 3
    assert any("tool      fetch" in line and "✗ ConnectionError: refused" in line for line in lines)
    assert lines[-1].startswith("usage totals: ") and "input_tokens=600" in lines[-1]
    as_json = tenure(db, "audit", job_id, "--json", "--app", "tests.apps.audit_app:app")
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["usage_totals"] == audit["usage_totals"]
    missing = tenure(db, "audit", "0190d5a0-0000-7000-8000-000000000000")
    assert missing.returncode == 1 and "no job" in missing.stderr


async def test_a_budget_on_submit_over_http_stops_a_runaway_and_a_bad_one_is_refused(up: Up) -> None:
    async with httpx.AsyncClient(base_url=up.url, headers=up.headers("tenant-a"), timeout=30) as a:
        r = await a.post("/v1/jobs", json={"agent": "runaway", "budget": {"tool_calls": 3}})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        async with asyncio.timeout(30):
            while (job := (await a.get(f"/v1/jobs/{job_id}")).json())["state"] != "failed":
                await asyncio.sleep(0.1)
        assert job["error_code"] == "budget_exhausted" and "tool_calls" in job["error_message"]
        assert len((await a.get(f"/v1/jobs/{job_id}/audit")).json()["tool_calls"]) == 3
        for bad in ({"tool_calls": 0}, {"cost": "x"}, {"walls": 1}, []):
            body = is_problem(await a.post("/v1/jobs", json={"agent": "runaway", "budget": bad}), 422)
            assert "budget" in body["detail"] or "limit" in body["detail"], body


async def test_a_dead_job_requeued_over_http_with_an_edited_input_runs_again_its_audit_attached(up: Up) -> None:
    async with (
        httpx.AsyncClient(base_url=up.url, headers=up.headers("tenant-a"), timeout=30) as a,
        httpx.AsyncClient(base_url=up.url, headers=up.headers("tenant-b"), timeout=30) as b,
    ):
        job_id = (await a.post("/v1/jobs", json={"agent": "researcher", "input": {"succeed_on": 9}})).json()["id"]
        async with asyncio.timeout(60):
            while (await a.get(f"/v1/jobs/{job_id}")).json()["state"] != "dead":
                await asyncio.sleep(0.1)
        assert job_id in [j["id"] for j in (await a.get("/v1/jobs", params={"state": "dead"})).json()["jobs"]]
        is_problem(await b.post(f"/v1/jobs/{job_id}/requeue", json={"input": {}}), 404)
        is_problem(await a.post(f"/v1/jobs/{job_id}/requeue", json={"inputs": 1}), 422)
        r = await a.post(f"/v1/jobs/{job_id}/requeue", json={"input": {"succeed_on": 1}})
        assert r.status_code == 200 and r.json()["state"] == "queued" and r.json()["input"] == {"succeed_on": 1}
        async with asyncio.timeout(30):
            while (await a.get(f"/v1/jobs/{job_id}")).json()["state"] != "succeeded":
                await asyncio.sleep(0.1)
        is_problem(await a.post(f"/v1/jobs/{job_id}/requeue"), 409)  # it succeeded
        audit = (await a.get(f"/v1/jobs/{job_id}/audit")).json()
        assert [e["outcome"] for e in audit["executions"]] == ["failed", "failed", "dead", "succeeded"]
        assert [e["content"]["attempt"] for e in audit["evidence"]] == [1, 2, 3, 1]  # attempts count afresh
        (edit,) = audit["edits"]
        assert (edit["epoch"], edit["previous_input"], edit["input"]) == (3, {"succeed_on": 9}, {"succeed_on": 1})
    # the same from the CLI: a dead job, requeued with --input
    db = up.db  # type: ignore[attr-defined]
    async with httpx.AsyncClient(base_url=up.url, headers=up.headers("tenant-a"), timeout=30) as a:
        other = (await a.post("/v1/jobs", json={"agent": "researcher", "input": {"succeed_on": 9}})).json()["id"]
        async with asyncio.timeout(60):
            while (await a.get(f"/v1/jobs/{other}")).json()["state"] != "dead":
                await asyncio.sleep(0.1)
    done = tenure(db, "requeue", other, "--input", '{"succeed_on": 1}', "--json", "--app", "tests.apps.audit_app:app")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["input"] == {"succeed_on": 1}
    shown = tenure(db, "audit", other, "--app", "tests.apps.audit_app:app")
    assert shown.returncode == 0, shown.stderr
    assert any('requeued  input {"succeed_on":9} → {"succeed_on":1}' in line for line in shown.stdout.splitlines())


async def test_usage_over_http_is_the_callers_own_and_the_cli_sums_it_per_model(up: Up) -> None:
    async with (
        httpx.AsyncClient(base_url=up.url, headers=up.headers("tenant-b"), timeout=30) as b,
        httpx.AsyncClient(base_url=up.url, headers=up.headers(None), timeout=30) as admin,
    ):
        job_id = (await b.post("/v1/jobs", json={"agent": "researcher", "input": {}})).json()["id"]
        async with asyncio.timeout(30):
            while (await b.get(f"/v1/jobs/{job_id}")).json()["state"] != "succeeded":
                await asyncio.sleep(0.1)
        mine = (await b.get("/v1/usage")).json()
        assert [(g["key"], g["reports"], g["input_tokens"]) for g in mine["groups"]] == [("tenant-b", 1, 100)]
        assert mine["total"]["cost_usd"] == pytest.approx((100 * 0.5 + 10 * 2.0) / 1000)
        everyone = (await admin.get("/v1/usage", params={"group_by": "model"})).json()
        assert [g["key"] for g in everyone["groups"]] == ["gpt-test"] and everyone["total"]["reports"] >= 1
        assert (await b.get("/v1/usage", params={"from": 4e10})).json()["groups"] == []
        is_problem(await b.get("/v1/usage", params={"group_by": "day"}), 422)
        is_problem(await b.get("/v1/usage", params={"from": "yesterday"}), 400)
        # tenant-b is now over its token budget (TENURE_TENANT_BUDGETS): refused at admission, with the reason
        over = await b.post("/v1/jobs", json={"agent": "researcher", "input": {}})
        body = is_problem(over, 429)
        assert "tenant 'tenant-b' is over its tokens budget: 110 used of 100" in body["detail"], body
        assert over.headers["retry-after"]
    db = up.db  # type: ignore[attr-defined]
    shown = tenure(db, "usage", "--group-by", "model", "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["groups"][0]["key"] == "gpt-test"
    table = tenure(db, "usage")
    assert table.returncode == 0 and "tenant-b" in table.stdout and table.stdout.splitlines()[-1].startswith("total")
