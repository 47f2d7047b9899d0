"""One call to watch a process's event loop: the lag sampler, its metrics, and optionally `/metrics`.

Composition root (like `app.py`): it joins the kernel's `LagSampler` to `tenure.observability`. The gateway
package may not import the kernel (layers), so the process that runs the gateway calls this, e.g. in the
ASGI lifespan it builds:

    async with observe_event_loop("gateway", gateway_id):
        yield                      # serve; the sampler is a child task of this block

The worker does the same through `tenure.worker.observe.WorkerObserver` (its sampler is a child of the
worker's own task group). See docs/observability.md.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from tenure.kernel.lag import LagSampler
from tenure.observability import metrics
from tenure.observability.exposition import MetricsServer

__all__ = ["observe_event_loop"]

log = logging.getLogger("tenure.monitoring")


@asynccontextmanager
async def observe_event_loop(
    role: str,
    name: str,
    *,
    interval_s: float = 0.05,
    stall_threshold_s: float = 0.25,
    window_s: float = 10.0,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
) -> AsyncIterator[LagSampler]:
    """Sample this loop's lag as `event_loop_lag_seconds{role, worker=name}` (and the max gauge and stall
    counter; stalls over `stall_threshold_s` are logged with the blocking task's stack) for the duration of
    the block. With `metrics_port`, also serve `/metrics` from a thread (0 picks a free port)."""
    sampler = LagSampler(
        interval_s=interval_s,
        threshold_s=stall_threshold_s,
        window_s=window_s,
        on_sample=metrics.lag_sample_recorder(role, name),
        on_stall=metrics.stall_recorder(role, name),
    )
    unwatch = metrics.watch_lag(sampler, role, name)
    # Multiprocess mode (`tenure up`): the scrape happens elsewhere, so copy watched numbers every second.
    stop_refresher = metrics.start_refresher() if os.environ.get("PROMETHEUS_MULTIPROC_DIR") else None
    server: MetricsServer | None = None
    try:
        if metrics_port is not None:
            server = MetricsServer(metrics_host, metrics_port)
            port = await asyncio.to_thread(server.start)
            log.info("metrics on http://%s:%d/metrics", metrics_host, port)
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(sampler.run(), name=f"lag-sampler-{role}")
            try:
                yield sampler
            finally:
                task.cancel()
    finally:
        if stop_refresher is not None:
            stop_refresher()
        unwatch()
        if server is not None:
            await asyncio.to_thread(server.stop)
