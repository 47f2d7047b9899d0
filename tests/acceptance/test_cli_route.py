"""`tenure route AGENT`, `tenure submit --prefers/--strict` and `tenure job`'s route, as a user drives them against
the store (no gateway, no worker processes: the registry rows are written through the store's registry API)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tenure.app import open_backends
from tenure.contracts.profile import WorkerRecord, specs_json
from tenure.contracts.states import WorkerState
from tenure.contracts.types import AgentSpec, WorkerInfo
from tenure.control.admission import Admission, AdmissionLimits, JobRequest
from tenure.control.scoring import FEATURE_BONUS, score
from tenure.settings import Settings
from tests.acceptance.test_cli import tenure

SPECS = specs_json({"summarize": AgentSpec("summarize", timeout_s=4.0, route_weights=(0.2, 0.5, 0.3))})


async def registry(url: str) -> None:
    b = await open_backends(Settings.of(database_url=url))
    try:
        for wid, features, record in [
            ("w-fast", ("gpu",), WorkerRecord(0.6, 400.0)),
            ("w-sure", (), WorkerRecord(1.0, 3000.0)),
            ("w-new", (), None),
        ]:
            await b.jobs.register_worker(WorkerInfo(wid, "h", 1, 2, ("summarize",), features=features, agent_specs=SPECS))
            await b.jobs.heartbeat(wid, WorkerState.ACTIVE, 1 if wid == "w-sure" else 0, [], 30.0, record)
        # Routing counts the jobs a worker runs from the store (registry_agents), not the heartbeat's figure:
        # w-sure runs one.
        admission = Admission(b.jobs, {"summarize": AgentSpec("summarize")}, AdmissionLimits(route_grace_ms=0))
        await admission.admit(JobRequest("summarize", {}))
        assert len(await b.jobs.claim_and_start("w-sure", ["summarize"], [], 1, 30.0)) == 1
    finally:
        await b.close()


async def test_tenure_route_prints_every_candidate_by_factor_through_the_agents_weights(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    await registry(url)
    shown = tenure(url, "route", "summarize", "--prefers", "gpu", "--json")
    assert shown.returncode == 0, shown.stderr
    route = json.loads(shown.stdout)
    assert route["weights"] == [0.2, 0.5, 0.3] and route["limit_ms"] == 4000.0  # the agent's timeout
    got = {c["worker_id"]: c for c in route["candidates"]}
    assert got["w-fast"]["score"] == pytest.approx(score(0.0, 0.6, 400.0, 1, (0.2, 0.5, 0.3), 4000.0), abs=1e-6)
    assert got["w-sure"]["score"] == pytest.approx(score(0.5, 1.0, 3000.0, 0, (0.2, 0.5, 0.3), 4000.0), abs=1e-6)
    assert got["w-new"]["recorded_success_rate"] is None and got["w-new"]["latency_factor"] == 1.0
    assert got["w-fast"]["features"] == ["gpu"] and FEATURE_BONUS > 0
    best = max(route["candidates"], key=lambda c: (c["score"], [-ord(ch) for ch in c["worker_id"]]))
    assert route["preferred_worker"] == best["worker_id"] == "w-new"  # no record yet: the prior, and no load
    human = tenure(url, "route", "summarize")
    assert human.returncode == 0 and "preferred: w-new" in human.stdout and "1.000*" in human.stdout
    strict = json.loads(tenure(url, "route", "summarize", "--prefers", "gpu", "--strict", "--json").stdout)
    assert [c["worker_id"] for c in strict["candidates"]] == ["w-fast"] and strict["reason"] == "only_candidate"


async def test_a_strict_submit_requires_the_feature_and_tenure_job_shows_the_route(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    await registry(url)
    sub = tenure(url, "submit", "summarize", "--prefers", "gpu", "--strict")
    assert sub.returncode == 0, sub.stderr
    job = json.loads(tenure(url, "job", sub.stdout.strip(), "--json").stdout)
    assert "feature:gpu" in job["requires"]
    assert job["route"]["reason"] == "only_candidate" and job["route"]["strict"] is True
    loose = tenure(url, "submit", "summarize", "--prefers", "gpu")
    shown = tenure(url, "job", loose.stdout.strip())
    assert "route      waiting for preferred worker w-new" in shown.stdout or "route      grace for" in shown.stdout
