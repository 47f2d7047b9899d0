"""The worker's observability code on the test's own event loop, under the blockbuster guard (conftest):
the lag sampler, liveness, heartbeat lateness, interval metrics and the gateway's `/metrics` ASGI app must
not make a single blocking call on the loop."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tenure.app import open_backends
from tenure.contracts.states import JobState, WorkerState
from tenure.local import connect
from tenure.observability import metrics
from tenure.observability.exposition import metrics_asgi_app
from tenure.settings import Settings
from tenure.worker import Worker, WorkerConfig
from tests.apps.obs_app import app
from tests.integration.procs import eventually


async def test_an_in_process_worker_and_the_metrics_asgi_app_never_block_the_loop(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    backends = await open_backends(Settings.of(database_url=url))
    config = WorkerConfig(
        concurrency=4,
        heartbeat_s=0.1,
        claim_ttl_s=0.6,
        sweep_interval_s=0.1,
        poll_s=0.1,
        lag_interval_s=0.02,
        degraded_lag_s=0.5,
        degraded_for_s=1.0,
    )
    worker = Worker(backends, app, config)
    offload = backends.jobs.offload
    assert offload is not None  # SQLite's connection thread
    unwatch = metrics.watch_adapter(offload, "worker", worker.id)
    stop = asyncio.Event()
    run = asyncio.create_task(worker.run(stop))
    try:
        async with connect(app, url) as client:
            ids = [
                (await client.submit("model_call", {})).job.id,
                (await client.submit("block_in_thread", {"seconds": 0.05})).job.id,
            ]

            async def done() -> bool:
                jobs = [await client.job(i) for i in ids]
                return all(j.state is JobState.SUCCEEDED for j in jobs)

            await eventually(done, 20, "the jobs to succeed")
        assert worker.state is WorkerState.ACTIVE
    finally:
        stop.set()
        await asyncio.wait_for(run, 20)
        unwatch()
        await backends.close()
    # Scraped once the worker stopped: prometheus_client's per-value locks are shared with the render
    # thread, and a (microseconds long) contended acquire on the loop would trip the blocking guard.
    transport = httpx.ASGITransport(app=metrics_asgi_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
        response = await http.get("/metrics")
    assert response.status_code == 200
    names = {
        s.name: s
        for f in text_string_to_metric_families(response.text)
        for s in f.samples
        if s.labels.get("worker") == worker.id
    }
    assert "event_loop_lag_max_seconds" in names and "tenure_blocking_in_flight" in names
    assert json.dumps(worker.info().to_dict())  # the registry view stays serialisable
