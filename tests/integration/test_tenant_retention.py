"""Per-tenant retention (TENURE_TENANT_RETENTION_DAYS, docs/retention.md), on SQLite and PostgreSQL: one sweep of
the sweeper duty deletes the jobs (with their events, audit records and artifacts, in a directory or a bucket)
finished longer ago than their own tenant's retention, and nothing else; a job that is not terminal survives
whatever its finished_at.

Ages are set by backdating finished_at in the test's database directly (what the store never does)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from tenure.app import open_backends
from tenure.backends.sqlite._connection import sqlite_path
from tenure.contracts.errors import ConfigError
from tenure.contracts.store import Backends
from tenure.contracts.types import NewEvent
from tenure.settings import Settings
from tenure.worker import WorkerConfig
from tenure.worker.config import parse_tenant_retention
from tenure.worker.duties import SweeperDuty
from tenure.worker.observe import WorkerObserver
from tests.contract.test_audit import record
from tests.contract.test_store import claim_one, finish, start_one, submit

DAY = 86400.0
OWN = {"acme": 7.0, "heavy": 365.0}  # every other tenant: TENURE_RETENTION_DAYS (30)


@pytest.fixture(params=["directory", "s3"])
async def backends(request: pytest.FixtureRequest, database_url: str, tmp_path: Path) -> AsyncIterator[Backends]:
    """The backend under test with an artifact store: a directory (on PostgreSQL too), or an S3-compatible bucket
    on a real server process (moto's emulator, tests/s3server.py)."""
    if request.param == "s3":
        where = {"artifacts_url": request.getfixturevalue("s3_bucket").url}
    else:
        where = {"artifacts_dir": str(tmp_path / "artifacts")}
    b = await open_backends(Settings.of(database_url=database_url, **where))
    try:
        yield b
    finally:
        await b.close()


async def backdate(database_url: str, job_id: str, days: float) -> None:
    """Set the job's finished_at `days` before now, on the database's clock."""
    if database_url.startswith("sqlite"):

        def update() -> None:
            db = sqlite3.connect(sqlite_path(database_url), isolation_level=None, timeout=30)
            try:
                now = "((julianday('now') - 2440587.5) * 86400.0)"
                db.execute(f"UPDATE jobs SET finished_at = {now} - ? WHERE id = ?", (days * DAY, job_id))
            finally:
                db.close()

        await asyncio.to_thread(update)
        return
    conn = await asyncpg.connect(database_url)
    try:
        sql = "UPDATE jobs SET finished_at = now() - make_interval(secs => $2) WHERE id = $1::uuid"
        await conn.execute(sql, job_id, days * DAY)
    finally:
        await conn.close()


async def finished_job(b: Backends, tenant: str, age_days: float, database_url: str) -> str:
    """A job of `tenant` that succeeded `age_days` ago, with an audit record, an event and an artifact."""
    store = b.jobs
    job_id = await submit(store, "echo", tenant=tenant)
    claim = await claim_one(store)
    x = await start_one(store, claim)
    assert await store.append_audit([record(claim.fence, x, 1)], [NewEvent(claim.fence, x, 2, "e", "{}")]) == set()
    assert b.artifacts is not None
    await b.artifacts.put(job_id, f"result of {tenant}".encode())
    assert await store.finish("worker-1", [finish(claim.fence, x, seq=3)]) == [job_id]
    await backdate(database_url, job_id, age_days)
    return job_id


def sweeper(b: Backends, config: WorkerConfig) -> SweeperDuty:
    obs = WorkerObserver("sweeper-test", heartbeat_s=1.0, lag_interval_s=0.05, stall_threshold_s=0.25,
                         degraded_lag_s=0.5, degraded_for_s=2.0)  # fmt: skip
    return SweeperDuty(b.jobs, None, "sweeper-test", config, obs, None, b.artifacts)


async def has_artifact(b: Backends, job_id: str, tenant: str) -> bool:
    assert b.artifacts is not None
    blob = await b.artifacts.open(job_id, hashlib.sha256(f"result of {tenant}".encode()).hexdigest())
    if blob is None:
        return False
    await blob.close()
    return True


async def test_one_sweep_deletes_only_the_jobs_older_than_their_own_tenants_retention(
    backends: Backends, database_url: str
) -> None:
    b = backends
    ages = {  # (tenant, age in days) -> deleted by the sweep?
        ("acme", 8): True, ("acme", 6): False,  # 7 days of its own
        ("heavy", 400): True, ("heavy", 40): False,  # 365 days of its own: longer than the default
        ("other", 31): True, ("other", 29): False,  # the default, 30 days
    }  # fmt: skip
    jobs = {key: await finished_job(b, key[0], key[1], database_url) for key in ages}
    # A job of acme still running, with a stale finished_at far past every retention: only its state keeps it.
    running = await submit(b.jobs, "safe", tenant="acme")
    claim = await claim_one(b.jobs, agents=("safe",))
    rx = await start_one(b.jobs, claim)
    assert await b.jobs.append_audit([record(claim.fence, rx, 1)], []) == set()
    await backdate(database_url, running, 1000)
    queued = await submit(b.jobs, "echo", tenant="acme")

    config = WorkerConfig(retention_days=30.0, tenant_retention_days=OWN)
    await sweeper(b, config).sweep_once()

    for key, deleted in ages.items():
        job_id = jobs[key]
        assert (await b.jobs.get_job(job_id) is None) is deleted, key
        assert (await b.jobs.read_audit(job_id, None, 10) == []) is deleted, key
        assert (await b.jobs.read_events(job_id, None, 10) == []) is deleted, key
        assert (not await has_artifact(b, job_id, key[0])) is deleted, key
    for job_id in (running, queued):
        assert await b.jobs.get_job(job_id) is not None
    assert len(await b.jobs.read_audit(running, None, 10)) == 1


async def test_a_batch_is_bounded_across_tenants_and_takes_the_oldest_first(backends: Backends, database_url: str) -> None:
    b = backends
    oldest = await finished_job(b, "heavy", 400, database_url)
    middle = await finished_job(b, "other", 50, database_url)
    young = await finished_job(b, "acme", 10, database_url)
    kept = await finished_job(b, "heavy", 100, database_url)
    by_tenant = {t: d * DAY for t, d in OWN.items()}
    assert sorted(await b.jobs.purge_finished(30 * DAY, 2, by_tenant)) == sorted([oldest, middle])
    assert await b.jobs.purge_finished(30 * DAY, 2, by_tenant) == [young]
    assert await b.jobs.purge_finished(30 * DAY, 2, by_tenant) == []
    assert await b.jobs.get_job(kept) is not None


def test_tenant_retention_days_is_read_and_validated_at_start_up() -> None:
    env = {"TENURE_TENANT_RETENTION_DAYS": '{"acme": 7, "audit-heavy": 365.5}'}
    assert Settings.from_env(env).worker.tenant_retention_days == {"acme": 7.0, "audit-heavy": 365.5}
    assert Settings.from_env({}).worker.tenant_retention_days == {}
    assert dataclasses.replace(WorkerConfig(), tenant_retention_days={"a": 1}).retention_s() == (30 * DAY, {"a": DAY})
    for bad, said in (
        ("[7]", "TENURE_TENANT_RETENTION_DAYS must be a JSON object"),
        ("{", "TENURE_TENANT_RETENTION_DAYS is not JSON"),
        ('{"acme": 0}', "TENURE_TENANT_RETENTION_DAYS: 'acme' needs a positive number of days"),
        ('{"acme": true}', "'acme' needs a positive number of days"),
        ('{"acme": "7"}', "'acme' needs a positive number of days"),
    ):
        with pytest.raises(ConfigError, match=said.replace("[", r"\[")):
            parse_tenant_retention(bad)
