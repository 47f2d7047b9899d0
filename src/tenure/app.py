"""The composition root: builds backends from URLs and wires the layers together.

`connect()` is the Python API for submitting and inspecting jobs directly against the store:

    async with tenure.connect(app, "postgresql://...") as client:
        job_id = await client.submit("summarize", {"text": "..."}, idempotency_key="req-42")
        job = await client.wait(job_id)
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from tenure.backends.postgres import PostgresChannel, PostgresStore
from tenure.backends.postgres.insights import PostgresInsights
from tenure.backends.redis import RedisChannel, RedisLeases, RedisReadyIndex
from tenure.backends.sqlite import SqliteStore
from tenure.backends.sqlite.insights import SqliteInsights
from tenure.contracts.channel import Channel
from tenure.contracts.errors import ConfigError, NotFound
from tenure.contracts.insights import Insights
from tenure.contracts.states import JobState
from tenure.contracts.store import Leases, Store
from tenure.contracts.types import Event, Job, JobFilter, WorkerInfo, parse_cursor
from tenure.control.admission import Admission, AdmissionLimits, JobRequest
from tenure.control.quotas import QuotaManager, quota_topic
from tenure.kernel.registry import Tenure
from tenure.settings import Settings, load_quota_file


def load_app(spec: str) -> Tenure:
    """Import `module:attribute` and check that it is a Tenure app."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"--app {spec!r}: expected module:attribute, e.g. tenure.examples:app")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # like `python -m`: apps in the working directory are importable
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--app {spec!r}: cannot import {module_name}: {exc}") from exc
    app = getattr(module, attr, None)
    if not isinstance(app, Tenure):
        raise ConfigError(f"--app {spec!r}: {module_name}.{attr} is not a tenure.Tenure app")
    return app


async def open_store(settings: Settings, *, migrate: bool = True) -> Store:
    """Open the store named by `settings.database_url`, applying migrations unless told not to. With
    `TENURE_REDIS_URL` set, its live hints (events appended, control commands) travel over Redis pub/sub
    (backends/signals.py) instead of NOTIFY or polling."""
    url = settings.database_url
    channel = None
    if settings.redis_url:
        channel = RedisChannel(settings.redis_url, prefix=settings.redis_prefix + "chan:")
    store: Store
    try:
        if url.startswith("sqlite:"):
            store = await SqliteStore.connect(url, synchronous=settings.sqlite_synchronous, channel=channel)
        else:
            store = await PostgresStore.connect(url, channel=channel)
    except BaseException:
        if channel is not None:
            await channel.close()
        raise
    if migrate:
        try:
            await store.migrate()
        except BaseException:
            await store.close()
            raise
    return store


async def open_insights(settings: Settings) -> Insights:
    """The dashboard's read side (contracts/insights.py) on the store named by `settings.database_url`, on
    connections of its own. The schema must be migrated."""
    if settings.database_url.startswith("sqlite:"):
        return await SqliteInsights.connect(settings.database_url)
    return await PostgresInsights.connect(settings.database_url)


class LocalClient:
    """Submit and inspect jobs directly against the store (no gateway in between)."""

    def __init__(self, store: Store, admission: Admission) -> None:
        self.store = store
        self.admission = admission

    async def submit(
        self,
        agent: str,
        input: Any = None,
        *,
        idempotency_key: str | None = None,
        priority: int | None = None,
        requires: Sequence[str] = (),
        deadline_s: float | None = None,
        max_attempts: int | None = None,
        tenant: str = "default",
    ) -> str:
        """Admit one job and return its id (the original job's id when the idempotency key was seen)."""
        req = JobRequest(agent, input, priority, requires, deadline_s, max_attempts, idempotency_key, tenant)
        return (await self.admission.submit(req)).job_id

    async def submit_many(self, requests: Sequence[JobRequest]) -> list[str]:
        """Admit a batch in one round trip; all are validated before any is written."""
        return [e.job_id for e in await self.admission.submit_many(requests)]

    async def job(self, job_id: str, tenant: str | None = None) -> Job:
        job = await self.store.get_job(_job_id(job_id), tenant)
        if job is None:
            raise NotFound(f"no job {job_id}")
        return job

    async def jobs(
        self,
        *,
        state: JobState | None = None,
        agent: str | None = None,
        limit: int = 50,
        before: str | None = None,
        tenant: str | None = None,
    ) -> list[Job]:
        return await self.store.list_jobs(JobFilter(tenant, state, agent, before, limit))

    async def events(self, job_id: str, after: str | None = None, limit: int = 1000) -> list[Event]:
        await self.job(job_id)
        return await self.store.read_events(_job_id(job_id), parse_cursor(after) if after else None, limit)

    async def requeue(self, job_id: str) -> Job:
        return await self.store.requeue(_job_id(job_id))

    async def workers(self, include_gone: bool = False) -> list[WorkerInfo]:
        return await self.store.list_workers(include_gone)

    async def wait(self, job_id: str, timeout_s: float | None = None, poll_s: float = 0.05) -> Job:
        """Poll until the job reaches a terminal state (or raise TimeoutError)."""
        async with asyncio.timeout(timeout_s):
            while True:
                job = await self.job(job_id)
                if job.state.terminal:
                    return job
                await asyncio.sleep(poll_s)


def _job_id(text: str) -> str:
    import uuid

    try:
        return str(uuid.UUID(text))
    except (ValueError, AttributeError, TypeError):
        raise NotFound(f"no job {text!r} (job ids are UUIDs)") from None


@asynccontextmanager
async def connect(
    app: Tenure | str | None = None, database_url: str | None = None, settings: Settings | None = None
) -> AsyncIterator[LocalClient]:
    """Open a `LocalClient` on the configured store. `app` (or `TENURE_APP`) defines the admissible agents."""
    settings = settings or Settings.from_env()
    if database_url is not None:
        settings = settings.replace(database_url=database_url)
    if app is None or isinstance(app, str):
        app = load_app(app or settings.app)
    store = await open_store(settings)
    limits = AdmissionLimits(max_input_bytes=settings.max_input_bytes, default_deadline_s=settings.default_deadline_s)
    ready = open_ready_index(settings)
    try:
        yield LocalClient(store, Admission(store, app.specs(), limits, ready_index=ready))
    finally:
        if ready is not None:
            await ready.close()
        await store.close()


# -- the gateway ----------------------------------------------------------------------------------------------------
_LOOPBACK = ("127.", "::1", "localhost")


def gateway_config(settings: Settings) -> Any:
    """The gateway's settings, from the process settings."""
    from tenure.control.gate import GateConfig
    from tenure.gateway.app import GatewayConfig
    from tenure.gateway.cors import parse_origins

    return GatewayConfig(
        cors_origins=parse_origins(settings.extra.get("cors_origins")),
        limits=AdmissionLimits(max_input_bytes=settings.max_input_bytes, default_deadline_s=settings.default_deadline_s),
        gate=GateConfig(
            max_queued=settings.max_queued,
            max_queued_per_tenant=settings.max_queued_per_tenant,
            breaker_threshold=settings.breaker_threshold,
            breaker_window_s=settings.breaker_window_s,
            breaker_open_s=settings.breaker_open_s,
        ),
    )


async def serve_gateway(settings: Settings, host: str, port: int, *, inline: bool = False) -> None:
    """Run one gateway process until SIGINT / SIGTERM. With `inline`, a worker runs inside it: a new job is
    claimed by it at once while it has a free slot (the store wakes it; the claim CAS decides), else it waits
    in the shared queue for any worker."""
    import logging

    import uvicorn

    from tenure.gateway.app import Gateway
    from tenure.gateway.auth import Auth
    from tenure.monitoring import observe_event_loop
    from tenure.observability.logs import set_process_log_fields

    log = logging.getLogger("tenure.gateway")
    auth = Auth.from_settings(settings.extra)
    if not auth.enabled:
        if not host.startswith(_LOOPBACK):
            raise ConfigError(
                f"no API keys are configured (TENURE_API_KEYS, TENURE_API_KEYS_FILE, TENURE_ADMIN_KEY), so the "
                f"gateway only binds to a loopback address, not {host!r}"
            )
        log.warning("no API keys configured: the gateway is open to local clients only (%s), as tenant 'default'", host)
    app = load_app(settings.app)
    store = await open_store(settings)
    stop = asyncio.Event()
    worker_task: asyncio.Task[None] | None = None
    inline_resources = contextlib.AsyncExitStack()

    async def on_start() -> None:
        nonlocal worker_task
        if inline:
            from tenure.worker import Worker

            config = worker_config(settings)
            quotas = await inline_resources.enter_async_context(open_quotas(settings, store, config.claim_ttl_s))
            ready = open_ready_index(settings, config.claim_ttl_s)
            if ready is not None:
                inline_resources.push_async_callback(ready.close)
            worker = Worker(store, app, config, quotas=quotas, ready_index=ready)
            worker_task = asyncio.create_task(worker.run(stop), name="inline-worker")

    async def on_stop() -> None:
        stop.set()
        if worker_task is not None:
            await worker_task
        await inline_resources.aclose()

    ready_hints = open_ready_index(settings)
    if ready_hints is not None:
        inline_resources.push_async_callback(ready_hints.close)
    gateway = Gateway(
        store, app.specs(), auth, gateway_config(settings), on_start=on_start, on_stop=on_stop, ready_index=ready_hints
    )
    if _switch(settings, "ui"):
        inline_resources.push_async_callback(await mount_dashboard(gateway, settings, store))
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
        settings.database_url.split("?")[0],
        ", inline worker" if inline else "",
    )
    gateway_id = f"gateway:{socket.gethostname()}:{os.getpid()}"
    set_process_log_fields(role="gateway", worker_id=gateway_id)
    try:
        # The gateway's loop is watched like a worker's: event_loop_lag_seconds{role="gateway"}, stall logs.
        async with observe_event_loop(
            "gateway", gateway_id, interval_s=settings.lag_interval_s, stall_threshold_s=settings.stall_threshold_s
        ):
            await server.serve()
    finally:
        await store.close()


def _switch(settings: Settings, name: str, default: bool = True) -> bool:
    """An on/off setting of the gateway layer (`TENURE_UI`, `TENURE_UI_LABS`)."""
    text = settings.extra.get(name, "").strip().lower()
    if not text:
        return default
    if text in ("on", "1", "true", "yes"):
        return True
    if text in ("off", "0", "false", "no"):
        return False
    raise ConfigError(f"TENURE_{name.upper()} must be on or off, not {text!r}")


async def mount_dashboard(gateway: Any, settings: Settings, store: Store) -> Callable[[], Awaitable[None]]:
    """Serve the dashboard (gateway/ui) from `gateway`: its read side on connections of its own, the quotas and
    their lease backend, the loop lag of `tenure up`'s workers, the labs. Returns what closes it all."""
    from tenure.gateway.ui.labs import LabRunner
    from tenure.gateway.ui.routes import Dashboard, DashboardConfig
    from tenure.gateway.ui.sessions import Sessions, parse_secret, parse_session_s
    from tenure.observability.multiprocess import loop_lag_by_worker

    sessions = Sessions(
        gateway.auth, parse_secret(settings.extra.get("ui_secret")), parse_session_s(settings.extra.get("ui_session_s"))
    )
    labs = LabRunner() if _switch(settings, "ui_labs") else None
    quotas = dict(await asyncio.to_thread(load_quota_file, "tenure.toml"))
    quotas.update(settings.quotas)
    leases: Leases | None = None
    redis_leases: RedisLeases | None = None
    if settings.redis_url:
        redis_leases = RedisLeases(settings.redis_url, prefix=settings.redis_prefix + "lease:")
        leases = redis_leases
    elif isinstance(store, Leases):
        leases = store
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


def worker_config(settings: Settings) -> Any:
    """The worker's settings, from the process settings."""
    from tenure.worker import WorkerConfig

    return WorkerConfig(
        concurrency=settings.concurrency,
        heartbeat_s=settings.heartbeat_s,
        claim_ttl_s=settings.claim_ttl_s,
        sweep_interval_s=settings.sweep_interval_s,
        drain_timeout_s=settings.drain_timeout_s,
        poll_s=settings.poll_s,
        capabilities=settings.capabilities,
        claim_mode=settings.claim_mode,
        lag_interval_s=settings.lag_interval_s,
        stall_threshold_s=settings.stall_threshold_s,
        degraded_lag_s=settings.degraded_lag_s,
        degraded_for_s=settings.degraded_for_s,
    )


# -- global quotas ----------------------------------------------------------------------------------------------------
@asynccontextmanager
async def open_quotas(settings: Settings, store: Store, ttl_s: float) -> AsyncIterator[QuotaManager]:
    """The quota manager of one worker process: limits from tenure.toml (working directory) overridden by
    TENURE_QUOTAS; leases on Redis when `TENURE_REDIS_URL` is set (with pub/sub wake-ups), else on the store's
    `leases` table (waiters woken by NOTIFY on PostgreSQL, polling on SQLite)."""
    specs = dict(await asyncio.to_thread(load_quota_file, "tenure.toml"))
    specs.update(settings.quotas)
    if settings.redis_url:
        # Leases and channel on one Redis: a release publishes its hand-overs from inside its own script.
        chan_prefix = settings.redis_prefix + "chan:"
        leases: Leases = RedisLeases(
            settings.redis_url, prefix=settings.redis_prefix + "lease:", announce_prefix=chan_prefix + quota_topic("")
        )
        channel: Channel | None = RedisChannel(settings.redis_url, prefix=chan_prefix)
    elif isinstance(store, PostgresStore):
        # Leases in the store; a release wakes waiters of other processes with a NOTIFY.
        leases, channel = store, PostgresChannel(settings.database_url)
    elif isinstance(store, Leases):
        leases, channel = store, None
    else:
        raise ConfigError("quotas need a lease backend: set TENURE_REDIS_URL or use a SQL store")
    try:
        yield QuotaManager(
            leases,
            specs,
            ttl_s=ttl_s,
            channel=channel,
            # The floor also finds a slot that came free by expiry (a dead holder's): at most one heartbeat late,
            # so a leaked slot is taken up again within one TTL plus one heartbeat of its holder's death.
            poll_s=min(0.25 if channel is None else 1.0, settings.heartbeat_s),
            leases_announce=isinstance(leases, RedisLeases),
        )
    finally:
        if channel is not None:
            await channel.close()
        if isinstance(leases, RedisLeases):
            await leases.close()


def open_ready_index(settings: Settings, stale_s: float | None = None) -> RedisReadyIndex | None:
    """The Redis Streams ready index when `TENURE_REDIS_URL` is set (connections open lazily), else None.
    `stale_s` (default: the claim TTL) is how long a delivery may stay unacknowledged before another worker
    takes it over."""
    if not settings.redis_url:
        return None
    return RedisReadyIndex(
        settings.redis_url,
        prefix=settings.redis_prefix,
        stale_s=stale_s or settings.claim_ttl_s,
        max_block_s=max(settings.poll_s, 0.05),
    )
