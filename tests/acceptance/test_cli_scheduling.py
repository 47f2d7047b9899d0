"""`tenure submit --concurrency-key/--multitask/--mode` and `tenure job` as a user drives them against the store
(no gateway): a `reject` job of a busy key exits 1 naming the running job, a waiting job says why it waits, a
degraded job says how."""

from __future__ import annotations

import json
from pathlib import Path

from tenure.app import open_backends
from tenure.contracts.types import AgentSpec, WorkerInfo
from tenure.control.admission import Admission, JobRequest
from tenure.settings import Settings
from tests.acceptance.test_cli import tenure

APP = {"TENURE_APP": "tests.apps.keys_app:app", "KEYS_TEST_LOG": "/dev/null"}


async def test_submit_with_a_key_job_says_why_it_waits_and_reject_exits_1(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    await (await open_backends(Settings.of(database_url=url))).close()
    first = tenure(url, "submit", "turn", "--input", '{"key": "k"}', "--concurrency-key", "k", env=APP)
    assert first.returncode == 0, first.stderr
    second = tenure(url, "submit", "turn", "--input", '{"key": "k"}', "--concurrency-key", "k", env=APP)
    first_id, second_id = first.stdout.strip(), second.stdout.strip()
    shown = tenure(url, "job", second_id, env=APP)
    assert shown.returncode == 0, shown.stderr
    assert "key        k  (waiting for its turn)" in shown.stdout
    assert f"waiting    concurrency_key: waiting for the turn of concurrency key 'k', held by {first_id}" in shown.stdout
    data = json.loads(tenure(url, "job", second_id, "--json", env=APP).stdout)
    assert data["waiting_reason"]["running_job_ids"] == [first_id] and data["key_wait"] is True
    refused = tenure(url, "submit", "turn", "--input", "{}", "--concurrency-key", "k", "--multitask", "reject", env=APP)
    assert refused.returncode == 1
    assert f"tenure: key_busy: concurrency key 'k' is busy: job {first_id} holds it" in refused.stderr
    bad = tenure(url, "submit", "turn", "--multitask", "sideways", env=APP)
    assert bad.returncode == 2 and "invalid choice: 'sideways'" in bad.stderr


async def test_a_full_queue_degrades_and_tenure_job_says_so(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    await (await open_backends(Settings.of(database_url=url))).close()
    ids = [tenure(url, "submit", "deep", env=APP).stdout.strip() for _ in range(6)]
    shown = tenure(url, "job", ids[-1], env=APP)
    assert "agent      fast" in shown.stdout and "degraded   deep → fast (queue_full)" in shown.stdout, shown.stdout
    assert "waiting    no_capable_worker: no live worker serves agent 'fast'" in shown.stdout


async def test_tenure_job_says_a_queue_is_at_its_cap_and_a_job_waits_for_its_tenants_turn(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    backends = await open_backends(Settings.of(database_url=url))
    try:  # a live worker for every agent: the job waits for nothing but its queue and its turn
        await backends.jobs.register_worker(WorkerInfo("w1", "h", 1, 4, ("turn", "deep", "fast")))
    finally:
        await backends.close()
    fast = [tenure(url, "submit", "fast", env=APP).stdout.strip() for _ in range(5)]  # fast: 5 of max_queued 5
    shown = tenure(url, "job", fast[1], env=APP)
    full = "waiting    queue_cap: in a full queue: agent 'fast' has 5 jobs waiting to start, its limit (max_queued) is 5"
    assert full in shown.stdout, shown.stdout
    data = json.loads(tenure(url, "job", fast[1], "--json", env=APP).stdout)["waiting_reason"]
    assert (data["kind"], data["queued"], data["max_queued"], data["jobs_ahead"]) == ("queue_cap", 5, 5, 1)
    backends = await open_backends(Settings.of(database_url=url))
    try:  # tenant b's job (the CLI submits as the default tenant): turn 0, claimed right after fast[0]
        other = (await Admission(backends.jobs, {"turn": AgentSpec("turn")}).admit(JobRequest("turn", tenant="b"))).id
    finally:
        await backends.close()
    shown = tenure(url, "job", other, env=APP)
    assert "waiting    tenant_turn: waiting for its tenant's turn: 1 jobs of other tenants" in shown.stdout, shown.stdout
