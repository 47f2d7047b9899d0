"""A job waiting for a human holds no quota lease (seed 003: pause / resume): another job takes the slot
meanwhile, and the first takes it back before it continues. The worker's /metrics shows the quota, and the
blocks a fail-open quota let through without a lease while its backend was down."""

from __future__ import annotations

import json
from pathlib import Path

from tenure.contracts.states import JobState
from tenure.local import connect
from tests.integration.procs import WorkerProc, eventually
from tests.integration.test_observability import Samples, metrics_url, scrape, value

APP = "tests.apps.quota_pause_app:app"


async def test_approval_releases_the_quota_lease_and_takes_it_back(sqlite_database_url: str, tmp_path: Path) -> None:
    worker = WorkerProc(
        sqlite_database_url,
        tmp_path,
        "w",
        concurrency=4,
        app=APP,
        env={"TENURE_QUOTAS": "k=1"},
        args=("--metrics-port", "0"),
    )
    try:
        async with connect(APP, sqlite_database_url) as client:
            holder = (await client.submit("hold_and_ask", {})).job.id

            async def waiting() -> bool:
                return (await client.job(holder)).state is JobState.WAITING

            await eventually(waiting, 30, "the holder to wait for its approval")
            taker = (await client.submit("take", {})).job.id
            took = await client.wait(taker, timeout_s=30)
            assert took.state is JobState.SUCCEEDED, (took.error_code, took.error_message, worker.log())
            outcome = await client.store.send_command(holder, None, "approve", json.dumps({"approved": True}))
            assert outcome.value == "requested"
            done = await client.wait(holder, timeout_s=30)
            assert done.state is JobState.SUCCEEDED and done.result == {"approved": True}, worker.log()
            types = [e.type for e in await client.events(holder)]
            assert types == ["execution.started", "holding", "job.waiting", "job.resumed", "resumed", "job.succeeded"]
        url = await metrics_url(worker)

        async def quota_exported() -> Samples | None:  # the gauges are written at each quota heartbeat
            samples = await scrape(url)
            return samples if value(samples, "tenure_quota_limit", key="k") == 1 else None

        samples = await eventually(quota_exported, 10, "the quota gauges on /metrics")
        assert ("tenure_quota_in_use", frozenset({("key", "k")})) in samples
    finally:
        worker.stop()


async def test_a_fail_open_quota_counts_blocks_run_without_a_lease_on_metrics(
    sqlite_database_url: str, tmp_path: Path
) -> None:
    # Nothing listens on port 1: every lease call fails at once, so the fail-open key lets the block through.
    worker = WorkerProc(
        sqlite_database_url,
        tmp_path,
        "w",
        concurrency=2,
        app=APP,
        env={"TENURE_QUOTAS": "k=1/fail-open", "TENURE_REDIS_URL": "redis://127.0.0.1:1/0"},
        args=("--metrics-port", "0"),
    )
    try:
        async with connect(APP, sqlite_database_url) as client:
            for _ in range(2):
                job = await client.wait((await client.submit("take", {})).job.id, timeout_s=30)
                assert job.state is JobState.SUCCEEDED and job.result == {"took": True}, worker.log()
        url = await metrics_url(worker)

        async def fail_open_exported() -> Samples | None:  # counted at each quota heartbeat
            samples = await scrape(url)
            return samples if value(samples, "tenure_quota_fail_open_total", key="k") == 2 else None

        samples = await eventually(fail_open_exported, 10, "tenure_quota_fail_open_total on /metrics")
        assert value(samples, "tenure_quota_rejected_total", key="k") == 0
    finally:
        worker.stop()
