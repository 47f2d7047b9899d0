"""`tenure gateway`: one gateway process (HTTP, SSE, WebSocket, the dashboard), optionally with a worker inside.

Part of the composition root: it opens one `Runtime` and hands the gateway what it needs from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from tenure.app import Runtime, open_insights
from tenure.backends.redis import RedisLeases
from tenure.contracts.errors import ConfigError
from tenure.contracts.store import Leases
from tenure.control.routing import LocalPath
from tenure.settings import Settings, load_quota_file

if TYPE_CHECKING:
    from tenure.gateway.app import Gateway, GatewayConfig

log = logging.getLogger("tenure.gateway")
_LOOPBACK = ("127.", "::1", "localhost")


def gateway_config(settings: Settings) -> GatewayConfig:
    """The gateway's settings, from the process settings."""
    from tenure.gateway.app import GatewayConfig

    return GatewayConfig(limits=settings.limits, gate=settings.gate, cors_origins=settings.gateway.cors_origins)


async def serve_gateway(settings: Settings, host: str, port: int, *, inline: bool = False) -> None:
    """Run one gateway process until SIGINT / SIGTERM. With `inline`, a worker runs inside it: a new job is
    claimed by it at once while it has a free slot (the store wakes it; the claim CAS decides), else it waits
    in the shared queue for any worker."""
    import uvicorn

    from tenure.gateway.app import Gateway
    from tenure.gateway.auth import Auth
    from tenure.monitoring import observe_event_loop
    from tenure.observability.logs import set_process_log_fields

    a = settings.auth
    auth = Auth.from_settings({"api_keys": a.api_keys or "", "api_keys_file": a.api_keys_file or "",
                               "admin_key": a.admin_key or ""})  # fmt: skip
    if not auth.enabled:
        if not host.startswith(_LOOPBACK):
            raise ConfigError(
                f"no API keys are configured (TENURE_API_KEYS, TENURE_API_KEYS_FILE, TENURE_ADMIN_KEY), so the "
                f"gateway only binds to a loopback address, not {host!r}"
            )
        log.warning("no API keys configured: the gateway is open to local clients only (%s), as tenant 'default'", host)
    async with Runtime.open(settings) as runtime, contextlib.AsyncExitStack() as resources:
        stop = asyncio.Event()
        worker_task: asyncio.Task[None] | None = None

        async def on_start() -> None:
            nonlocal worker_task
            if inline:
                worker = await runtime.worker()
                # The local fast path (docs/routing.md): a job this gateway admits while its worker has room is
                # preferred to that worker, so it starts here without a round trip through any other worker.
                local = gateway.admission.chooser.local = LocalPath(worker, worker.config.concurrency)
                worker.on_claimed = local.claimed
                worker_task = asyncio.create_task(worker.run(stop), name="inline-worker")

        async def on_stop() -> None:
            stop.set()
            if worker_task is not None:
                await worker_task

        gateway = Gateway(
            runtime.backends, runtime.app.specs(), auth, gateway_config(settings), on_start=on_start, on_stop=on_stop,
            ready_index=runtime.ready_index,
        )  # fmt: skip
        if settings.gateway.ui:
            resources.push_async_callback(await mount_dashboard(gateway, settings, runtime))
            log.info("dashboard on http://%s:%d/ui", host, port)
        config = uvicorn.Config(
            gateway.asgi,
            host=host,
            port=port,
            log_level="warning",
            lifespan="on",
            ws_max_size=2 * 1024 * 1024,
            timeout_graceful_shutdown=5,
            access_log=False,
        )
        server = uvicorn.Server(config)
        log.info(
            "gateway on http://%s:%d (app %s, store %s%s)",
            host,
            port,
            settings.app,
            settings.store.database_url.split("?")[0],
            ", inline worker" if inline else "",
        )
        gateway_id = f"gateway:{socket.gethostname()}:{os.getpid()}"
        set_process_log_fields(role="gateway", worker_id=gateway_id)
        w = settings.worker
        # The gateway's loop is watched like a worker's: event_loop_lag_seconds{role="gateway"}, stall logs.
        async with observe_event_loop(
            "gateway", gateway_id, interval_s=w.lag_interval_s, stall_threshold_s=w.stall_threshold_s
        ):
            await server.serve()


async def mount_dashboard(gateway: Gateway, settings: Settings, runtime: Runtime) -> Callable[[], Awaitable[None]]:
    """Serve the dashboard (gateway/ui) from `gateway`: its read side on connections of its own, the quotas and
    their lease backend, the loop lag of `tenure up`'s workers, the labs. Returns what closes it all."""
    from tenure.gateway.ui.base import DashboardConfig
    from tenure.gateway.ui.labs import LabRunner
    from tenure.gateway.ui.routes import Dashboard
    from tenure.gateway.ui.sessions import Sessions, parse_secret
    from tenure.observability.multiprocess import loop_lag_by_worker

    ui = settings.gateway
    sessions = Sessions(gateway.auth, parse_secret(ui.ui_secret), ui.ui_session_s)
    labs = LabRunner() if ui.ui_labs else None
    quotas = dict(await asyncio.to_thread(load_quota_file, "tenure.toml"))
    quotas.update(settings.quotas)
    leases: Leases = runtime.backends.leases
    redis_leases: RedisLeases | None = None
    if settings.redis.url:
        redis_leases = RedisLeases(settings.redis.url, prefix=settings.redis.prefix + "lease:")
        leases = redis_leases
    insights = await open_insights(settings)

    async def loop_lags() -> dict[str, float]:
        return await asyncio.to_thread(loop_lag_by_worker)

    config = DashboardConfig(
        quotas=quotas, leases=leases, loop_lags=loop_lags if os.environ.get("PROMETHEUS_MULTIPROC_DIR") else None, labs=labs
    )
    dashboard = Dashboard(gateway, insights, sessions, config)
    await asyncio.to_thread(dashboard.preload)
    gateway.mount_ui(dashboard.routes(), sessions)

    async def close() -> None:
        if labs is not None:
            await labs.close()
        await insights.close()
        if redis_leases is not None:
            await redis_leases.close()

    return close
