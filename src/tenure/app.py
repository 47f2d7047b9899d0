"""The composition root: builds backends from URLs and wires the layers together.

`connect()` is the Python API for submitting and inspecting jobs directly against the store:

    async with tenure.connect(app, "postgresql://...") as client:
        admitted = await client.submit("summarize", {"text": "..."}, idempotency_key="req-42")
        job = await client.wait(admitted.job)
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
from typing import TYPE_CHECKING, Any

from tenure.backends.after_commit import AfterCommit
from tenure.backends.postgres import PostgresChannel, PostgresLeases, PostgresSignals, PostgresStore
from tenure.backends.postgres.insights import PostgresInsights
from tenure.backends.redis import RedisChannel, RedisLeases, RedisReadyIndex
from tenure.backends.signals import ChannelSignals
from tenure.backends.sqlite import SqliteLeases, SqliteSignals, SqliteStore
from tenure.backends.sqlite.insights import SqliteInsights
from tenure.contracts.channel import Channel
from tenure.contracts.errors import ConfigError, NotFound
from tenure.contracts.insights import Insights
from tenure.contracts.states import JobState
from tenure.contracts.store import Backends, JobStore, Leases, Signals
from tenure.contracts.types import DEFAULT_TENANT, ControlOutcome, Event, Job, JobFilter, WorkerInfo, parse_cursor
from tenure.control.admission import Admission, AdmissionLimits, Admitted, JobRequest
from tenure.control.gate import GateConfig
from tenure.control.jobs import JobRef, JobsClient, JobsService, ref_id
from tenure.control.quotas import QuotaManager, quota_topic
from tenure.kernel.registry import Tenure
from tenure.settings import Settings, load_quota_file


def load_app(spec: str) -> Tenure:
    """Import `module:attribute` and check that it is a Tenure app."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"--app {spec!r}: expected module:attribute, e.g. tenure.demos.examples:app")
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


async def open_backends(settings: Settings, *, migrate: bool = True) -> Backends:
    """Open the job store named by `settings.database_url` with its signals and leases, applying migrations
    unless told not to; `close()` the answer once. The three share the store's connections: SQLite's one
    connection thread, PostgreSQL's pool (the signals LISTEN on connections of their own). With
    `TENURE_REDIS_URL` set, the live hints (events appended, control commands) travel over Redis pub/sub
    (backends/signals.py) instead of NOTIFY or polling; the jobs wake-up stays the database's."""
    url = settings.database_url
    channel = None
    if settings.redis_url:
        channel = RedisChannel(settings.redis_url, prefix=settings.redis_prefix + "chan:")
    store: JobStore
    signals: Signals
    leases: Leases
    try:
        if url.startswith("sqlite:"):
            sqlite = await SqliteStore.connect(url, synchronous=settings.sqlite_synchronous)
            try:
                signals = await SqliteSignals.open(sqlite.connection)
            except BaseException:
                await sqlite.close()
                raise
            store, leases = sqlite, SqliteLeases(sqlite.connection)
        else:
            # NOTIFY for live hints only when no channel carries them (see postgres/signals.py).
            postgres = await PostgresStore.connect(url, notify=channel is None)
            store, signals, leases = postgres, PostgresSignals(url), PostgresLeases(postgres.pool)
    except BaseException:
        if channel is not None:
            await channel.close()
        raise
    if channel is not None:
        signals = ChannelSignals(channel, signals)
    backends = Backends(AfterCommit(store, signals), signals, leases)
    if migrate:
        try:
            await backends.jobs.migrate()
        except BaseException:
            await backends.close()
            raise
    return backends


async def open_insights(settings: Settings) -> Insights:
    """The dashboard's read side (contracts/insights.py) on the store named by `settings.database_url`, on
    connections of its own. The schema must be migrated."""
    if settings.database_url.startswith("sqlite:"):
        return await SqliteInsights.connect(settings.database_url)
    return await PostgresInsights.connect(settings.database_url)


class LocalClient:
    """Submit and inspect jobs directly against the store (no gateway in between), through the same admission
    door as the gateway (caps and circuits included). A `JobsClient`: `tenure.client.Client` answers alike."""

    def __init__(self, store: JobStore, admission: Admission) -> None:
        self.store = store
        self.admission = admission
        self.service = JobsService(store, admission)

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
        tenant: str = DEFAULT_TENANT,
    ) -> Admitted:
        """Admit one job: the job as admitted (the original one when the idempotency key was seen, `created`
        False). Over a queue cap raises `QueueFull`, while the agent's circuit is open `CircuitOpen`."""
        req = JobRequest(agent, input, priority, requires, deadline_s, max_attempts, idempotency_key, tenant)
        return await self.service.submit(req)

    async def submit_many(self, requests: Sequence[JobRequest]) -> list[str]:
        """Admit a batch in one round trip and return the job ids; all are validated, and the caps checked for
        the whole batch, before any is written."""
        return [a.job.id for a in await self.service.submit_many(requests)]

    async def job(self, job_id: JobRef, tenant: str | None = None) -> Job:
        """One job, or `NotFound`."""
        return await self.service.job(ref_id(job_id), tenant)

    async def jobs(
        self,
        *,
        state: JobState | str | None = None,
        agent: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
        before: str | None = None,
        tenant: str | None = None,
    ) -> list[Job]:
        """Jobs, newest first; `cursor` (or its older name `before`) is the id of the last job of the previous
        page."""
        state = JobState(state) if isinstance(state, str) else state
        return await self.service.jobs(JobFilter(tenant, state, agent, cursor or before, limit))

    async def events(self, job_id: JobRef, after: str | None = None, limit: int = 1000) -> list[Event]:
        """One page of the job's history after the cursor `after` (`EPOCH-SEQ`)."""
        return await self.service.events(ref_id(job_id), None, parse_cursor(after) if after else None, limit)

    async def cancel(self, job_id: JobRef, *, wait: float | None = None) -> ControlOutcome:
        """Cancel: `requested`, `accepted` or `already_finished` (`NotFound` for no such job)."""
        return _known(job_id, await self.service.cancel(ref_id(job_id), None, wait or 0.0))

    async def send_input(self, job_id: JobRef, input: Any) -> ControlOutcome:
        """Persist an input for the job's `ctx.next_input()` (`NotFound` for no such job)."""
        return _known(job_id, await self.service.send_input(ref_id(job_id), {"input": input}))

    async def approve(self, job_id: JobRef, approved: bool = True, comment: str | None = None) -> ControlOutcome:
        """Persist an approval for the job's `ctx.approval(prompt)` (`NotFound` for no such job)."""
        body = {"approved": approved, "comment": comment}
        return _known(job_id, await self.service.approve(ref_id(job_id), body))

    async def requeue(self, job_id: JobRef) -> Job:
        """Put a finished job back in the queue (an operator's command)."""
        return await self.service.requeue(ref_id(job_id))

    async def workers(self, include_gone: bool = False) -> list[WorkerInfo]:
        """The registry."""
        return await self.service.workers(include_gone)

    async def wait(self, job_id: JobRef, timeout_s: float | None = None, poll_s: float = 0.05) -> Job:
        """Poll until the job reaches a terminal state (or raise TimeoutError)."""
        async with asyncio.timeout(timeout_s):
            while True:
                job = await self.job(job_id)
                if job.state.terminal:
                    return job
                await asyncio.sleep(poll_s)


if TYPE_CHECKING:  # mypy holds LocalClient to the one client shape

    def _is_a_jobs_client(client: LocalClient) -> JobsClient:
        return client


def _known(job_id: JobRef, outcome: ControlOutcome) -> ControlOutcome:
    if outcome is ControlOutcome.UNKNOWN:
        raise NotFound(f"no job {ref_id(job_id)}")
    return outcome


def admission_limits(settings: Settings) -> AdmissionLimits:
    """The admission's bounds, from the process settings."""
    return AdmissionLimits(max_input_bytes=settings.max_input_bytes, default_deadline_s=settings.default_deadline_s)


def gate_config(settings: Settings) -> GateConfig:
    """The caps and circuit breakers every admission is held to, from the process settings."""
    return GateConfig(
        max_queued=settings.max_queued,
        max_queued_per_tenant=settings.max_queued_per_tenant,
        breaker_threshold=settings.breaker_threshold,
        breaker_window_s=settings.breaker_window_s,
        breaker_open_s=settings.breaker_open_s,
    )


@asynccontextmanager
async def connect(
    app: Tenure | str | None = None, database_url: str | None = None, settings: Settings | None = None
) -> AsyncIterator[LocalClient]:
    """Open a `LocalClient` on the configured store. `app` (or `TENURE_APP`) defines the admissible agents; the
    caps and circuit breakers are those of the settings (`TENURE_MAX_QUEUED`, `TENURE_BREAKER_*`), as at the
    gateway."""
    settings = settings or Settings.from_env()
    if database_url is not None:
        settings = settings.replace(database_url=database_url)
    if app is None or isinstance(app, str):
        app = load_app(app or settings.app)
    backends = await open_backends(settings)
    ready = open_ready_index(settings)
    try:
        admission = Admission(backends.jobs, app.specs(), admission_limits(settings), ready, gate=gate_config(settings))
        yield LocalClient(backends.jobs, admission)
    finally:
        if ready is not None:
            await ready.close()
        await backends.close()


# -- the gateway ----------------------------------------------------------------------------------------------------
_LOOPBACK = ("127.", "::1", "localhost")


def gateway_config(settings: Settings) -> Any:
    """The gateway's settings, from the process settings."""
    from tenure.gateway.app import GatewayConfig
    from tenure.gateway.cors import parse_origins

    return GatewayConfig(
        cors_origins=parse_origins(settings.extra.get("cors_origins")),
        limits=admission_limits(settings),
        gate=gate_config(settings),
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
    backends = await open_backends(settings)
    stop = asyncio.Event()
    worker_task: asyncio.Task[None] | None = None
    inline_resources = contextlib.AsyncExitStack()

    async def on_start() -> None:
        nonlocal worker_task
        if inline:
            from tenure.worker import Worker

            config = worker_config(settings)
            quotas = await inline_resources.enter_async_context(open_quotas(settings, backends, config.claim_ttl_s))
            ready = open_ready_index(settings, config.claim_ttl_s)
            if ready is not None:
                inline_resources.push_async_callback(ready.close)
            worker = Worker(backends, app, config, quotas=quotas, ready_index=ready)
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
        backends, app.specs(), auth, gateway_config(settings), on_start=on_start, on_stop=on_stop, ready_index=ready_hints
    )
    if _switch(settings, "ui"):
        inline_resources.push_async_callback(await mount_dashboard(gateway, settings, backends))
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
        await backends.close()


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


async def mount_dashboard(gateway: Any, settings: Settings, backends: Backends) -> Callable[[], Awaitable[None]]:
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
    leases: Leases = backends.leases
    redis_leases: RedisLeases | None = None
    if settings.redis_url:
        redis_leases = RedisLeases(settings.redis_url, prefix=settings.redis_prefix + "lease:")
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
async def open_quotas(settings: Settings, backends: Backends, ttl_s: float) -> AsyncIterator[QuotaManager]:
    """The quota manager of one worker process: limits from tenure.toml (working directory) overridden by
    TENURE_QUOTAS; leases on Redis when `TENURE_REDIS_URL` is set (with pub/sub wake-ups), else the store's
    `leases` table (`backends.leases`; waiters woken by NOTIFY on PostgreSQL, polling on SQLite)."""
    specs = dict(await asyncio.to_thread(load_quota_file, "tenure.toml"))
    specs.update(settings.quotas)
    own_leases: RedisLeases | None = None
    leases: Leases = backends.leases
    channel: Channel | None = None
    if settings.redis_url:
        # Leases and channel on one Redis: a release publishes its hand-overs from inside its own script.
        chan_prefix = settings.redis_prefix + "chan:"
        leases = own_leases = RedisLeases(
            settings.redis_url, prefix=settings.redis_prefix + "lease:", announce_prefix=chan_prefix + quota_topic("")
        )
        channel = RedisChannel(settings.redis_url, prefix=chan_prefix)
    elif backends.jobs.dialect == "postgres":
        # Leases in the store; a release wakes waiters of other processes with a NOTIFY.
        channel = PostgresChannel(settings.database_url)
    try:
        yield QuotaManager(
            leases,
            specs,
            ttl_s=ttl_s,
            channel=channel,
            # The floor also finds a slot that came free by expiry (a dead holder's): at most one heartbeat late,
            # so a leaked slot is taken up again within one TTL plus one heartbeat of its holder's death.
            poll_s=min(0.25 if channel is None else 1.0, settings.heartbeat_s),
            leases_announce=own_leases is not None,
        )
    finally:
        if channel is not None:
            await channel.close()
        if own_leases is not None:
            await own_leases.close()


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
