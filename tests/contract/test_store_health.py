"""`JobStore.health()` on every backend, and what `tenure doctor` makes of it: an open transaction elsewhere
holds back vacuum, and the dead versions of claimed and finished jobs pile up behind it."""

from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg
import pytest

from tenure import doctor
from tenure.contracts.states import JobState
from tenure.contracts.store import JobStore
from tenure.contracts.types import Finish, NewJob, Start, new_id


def _job() -> NewJob:
    return NewJob(new_id(), "acme", "echo", "{}", 0, (), 3, None, False, None, None, b"fp")


async def _churn(store: JobStore, n: int) -> None:
    """Enqueue, claim, start and finish `n` jobs: each leaves dead row versions behind on PostgreSQL."""
    await store.enqueue([_job() for _ in range(n)])
    claims = await store.claim("w1", ["echo"], [], n, 30.0)
    started = await store.start("w1", [Start(c.fence, new_id()) for c in claims])
    await store.finish("w1", [Finish(s.fence, s.execution_id, s.started_at, JobState.SUCCEEDED, 2, "null") for s in started])


async def test_health_reports_the_tables_sizes_and_no_old_horizon_when_nothing_holds_one(store: JobStore) -> None:
    await _churn(store, 5)
    health = await store.health()
    assert sum(health.table_bytes.values()) > 0
    if store.dialect == "sqlite":
        assert health.oldest_xmin_age_s is None and health.dead_tuples == {}
        assert health.table_bytes["(file)"] >= health.table_bytes["(free)"]
    else:
        assert {"jobs", "events", "executions"} <= set(health.table_bytes)
        assert health.oldest_xmin_age_s is not None and health.oldest_xmin_age_s >= 0.0


async def test_an_open_transaction_elsewhere_is_the_horizon_and_doctor_names_it(
    pg_database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tenure.app import open_backends
    from tenure.settings import Settings

    backends = await open_backends(Settings.of(database_url=pg_database_url))
    name = f"forgotten-{uuid.uuid4().hex[:8]}"
    holder = await asyncpg.connect(pg_database_url, server_settings={"application_name": name})
    try:
        store = backends.jobs
        await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await holder.fetchval("SELECT count(*) FROM jobs")  # a snapshot: backend_xmin is set and stays
        opened = time.monotonic()
        await _churn(store, 50)
        await asyncio.sleep(1.2)
        health = await store.health()
        assert health.oldest_xmin_age_s is not None
        assert health.oldest_xmin_age_s >= time.monotonic() - opened - 0.1  # ours, or an older one (other runs)
        # The dead versions the churn left: statistics reach the view within a few seconds (PostgreSQL flushes
        # each backend's counts at most once a second, and idle ones within 10 s).
        deadline = time.monotonic() + 20
        while (await store.health()).dead_tuples.get("jobs", 0) < 50 and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        assert (await store.health()).dead_tuples["jobs"] >= 50

        report = doctor.Report()
        monkeypatch.setattr(doctor, "XMIN_WARN_S", 0.5)
        await doctor._check_vacuum(report, store)
        check = report.checks[-1]
        assert check.name == "vacuum" and check.status == "warn", check
        if check.data["holder"] and name in check.data["holder"]:
            assert name in check.detail

        await holder.execute("COMMIT")  # the horizon moves on
        await asyncio.sleep(0.1)
        after = await store.health()
        assert after.oldest_xmin_holder is None or name not in after.oldest_xmin_holder
    finally:
        await holder.close()
        await backends.close()
