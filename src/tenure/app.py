"""The composition root: builds backends from the settings and wires the layers together, once per process.

    async with Runtime.open(settings, app) as runtime:     # store + signals + leases, the ready index
        worker = await runtime.worker(faults=faults)        # `tenure worker`, the gateway's inline worker
        client = runtime.client()                           # `tenure.connect`, `tenure submit` without --url
        admission = runtime.admission()                     # the gateway's door (gateway/serve: serve_gateway)

Everything a process shares is opened here, exactly once, and closed when the block ends: the `Backends` (the
job store with its signals and leases), the Redis ready index when `TENURE_REDIS_URL` is set, and — for a process
that runs a worker — the quota manager with its channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from tenure.backends.after_commit import AfterCommit
from tenure.backends.artifacts import open_artifacts
from tenure.backends.postgres import PostgresChannel, PostgresLeases, PostgresSignals, PostgresStore
from tenure.backends.postgres.insights import PostgresInsights
from tenure.backends.redis import RedisChannel, RedisLeases, RedisReadyIndex
from tenure.backends.signals import ChannelSignals
from tenure.backends.sqlite import SqliteLeases, SqliteSignals, SqliteStore
from tenure.backends.sqlite.insights import SqliteInsights
from tenure.contracts.channel import Channel
from tenure.contracts.errors import ConfigError
from tenure.contracts.insights import Insights
from tenure.contracts.store import Backends, JobStore, Leases, Signals
from tenure.control.admission import Admission
from tenure.control.gate import GateObserver
from tenure.control.quotas import QuotaManager, quota_topic
from tenure.kernel.registry import Tenure
from tenure.settings import Settings, load_quota_file

if TYPE_CHECKING:
    from tenure.local import LocalClient
    from tenure.worker import Worker
    from tenure.worker.faults import Faults


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


class Runtime:
    """What one process opens once (see the module docstring). Build it with `Runtime.open`."""

    def __init__(
        self, settings: Settings, app: Tenure, backends: Backends, ready_index: RedisReadyIndex | None,
        stack: contextlib.AsyncExitStack,
    ) -> None:  # fmt: skip
        self.settings = settings
        self.app = app
        self.backends = backends
        self.ready_index = ready_index
        self._stack = stack
        self._quotas: QuotaManager | None = None

    @classmethod
    @asynccontextmanager
    async def open(
        cls, settings: Settings, app: Tenure | str | None = None, *, migrate: bool = True
    ) -> AsyncIterator[Runtime]:
        """Open the backends (migrating unless told not to) and the ready index for `app` (a Tenure app, a
        `module:attribute`, or None for `settings.app`); close everything when the block ends."""
        if app is None or isinstance(app, str):
            app = load_app(app or settings.app)
        async with contextlib.AsyncExitStack() as stack:
            backends = await open_backends(settings, migrate=migrate)
            stack.push_async_callback(backends.close)
            ready = open_ready_index(settings)
            if ready is not None:
                stack.push_async_callback(ready.close)
            yield cls(settings, app, backends, ready, stack)

    @property
    def jobs(self) -> JobStore:
        """The job store (every write signalled after its commit)."""
        return self.backends.jobs

    def admission(self, on_gate: GateObserver | None = None) -> Admission:
        """The one admission door, with this process's limits, caps, circuit breakers and ready index."""
        s = self.settings
        return Admission(
            self.jobs, self.app.specs(), s.limits, self.ready_index, gate=s.gate, on_gate=on_gate,
            on_degraded=count_degraded,
        )  # fmt: skip

    def client(self) -> LocalClient:
        """A client of the store itself, through the admission door (`tenure.connect`)."""
        from tenure.local import LocalClient

        return LocalClient(self.jobs, self.admission(), self.backends.artifacts)

    async def quotas(self) -> QuotaManager:
        """The quota manager of this process (opened on first use, closed with the runtime)."""
        if self._quotas is None:
            self._quotas = await self._stack.enter_async_context(open_quotas(self.settings, self.backends))
        return self._quotas

    async def worker(self, *, faults: Faults | None = None, worker_id: str | None = None) -> Worker:
        """A worker of this process: the app's agents, the worker settings, the quotas and the ready index. A
        `stop` fault freezes the process between two store transactions (JobStore.run_between_transactions), so
        it never freezes holding SQLite's write lock."""
        from tenure.worker import Worker
        from tenure.worker.faults import Faults, stop_self

        faults = faults or Faults()
        jobs = self.jobs

        async def freeze() -> None:
            await jobs.run_between_transactions(stop_self)

        faults.freeze = freeze
        return Worker(
            self.backends, self.app, self.settings.worker, faults=faults, quotas=await self.quotas(),
            ready_index=self.ready_index, worker_id=worker_id, admission=self.admission(),
        )  # fmt: skip


async def open_backends(settings: Settings, *, migrate: bool = True) -> Backends:
    """Open the job store named by `settings.store.database_url` with its signals and leases, applying migrations
    unless told not to; `close()` the answer once. The three share the store's connections: SQLite's one
    connection thread, PostgreSQL's pool (the signals LISTEN on connections of their own). With
    `TENURE_REDIS_URL` set, the live hints (events appended, control commands) travel over Redis pub/sub
    (backends/signals.py) instead of NOTIFY or polling; the jobs wake-up stays the database's."""
    url = settings.store.database_url
    channel = None
    if settings.redis.url:
        channel = RedisChannel(settings.redis.url, prefix=settings.redis.prefix + "chan:")
    store: JobStore
    signals: Signals
    leases: Leases
    try:
        if url.startswith("sqlite:"):
            sqlite = await SqliteStore.connect(url, synchronous=settings.store.sqlite_synchronous)
            try:
                signals = await SqliteSignals.open(sqlite.connection)
            except BaseException:
                await sqlite.close()
                raise
            store, leases = sqlite, SqliteLeases(sqlite.connection)
        else:
            # NOTIFY for live hints only when no channel carries them (see postgres/signals.py).
            postgres = await PostgresStore.connect(
                url, notify=channel is None, command_timeout_s=settings.store.pg_command_timeout_s
            )
            store, signals, leases = postgres, PostgresSignals(url), PostgresLeases(postgres.pool)
    except BaseException:
        if channel is not None:
            await channel.close()
        raise
    if channel is not None:
        signals = ChannelSignals(channel, signals)
    artifacts = open_artifacts(settings.store.artifacts_dir, url, settings.store.artifacts_url)  # docs/artifacts.md
    backends = Backends(AfterCommit(store, signals), signals, leases, artifacts)
    if migrate:
        try:
            await backends.jobs.migrate()
        except BaseException:
            await backends.close()
            raise
    return backends


async def open_insights(settings: Settings) -> Insights:
    """The dashboard's read side (contracts/insights.py) on the store named by `settings.store.database_url`, on
    connections of its own. The schema must be migrated."""
    if settings.store.database_url.startswith("sqlite:"):
        return await SqliteInsights.connect(settings.store.database_url)
    return await PostgresInsights.connect(settings.store.database_url)


@asynccontextmanager
async def open_quotas(settings: Settings, backends: Backends) -> AsyncIterator[QuotaManager]:
    """The quota manager of one worker process: limits from tenure.toml (working directory) overridden by
    TENURE_QUOTAS; leases on Redis when `TENURE_REDIS_URL` is set (with pub/sub wake-ups), else the store's
    `leases` table (`backends.leases`; waiters woken by NOTIFY on PostgreSQL, polling on SQLite). Leases live
    one claim TTL and are renewed by every heartbeat."""
    specs = dict(await asyncio.to_thread(load_quota_file, "tenure.toml"))
    specs.update(settings.quotas)
    own_leases: RedisLeases | None = None
    leases: Leases = backends.leases
    channel: Channel | None = None
    if settings.redis.url:
        # Leases and channel on one Redis: a release publishes its hand-overs from inside its own script.
        chan_prefix = settings.redis.prefix + "chan:"
        leases = own_leases = RedisLeases(
            settings.redis.url, prefix=settings.redis.prefix + "lease:", announce_prefix=chan_prefix + quota_topic("")
        )
        channel = RedisChannel(settings.redis.url, prefix=chan_prefix)
    elif backends.jobs.dialect == "postgres":
        # Leases in the store; a release wakes waiters of other processes with a NOTIFY.
        channel = PostgresChannel(settings.store.database_url)
    try:
        yield QuotaManager(
            leases,
            specs,
            ttl_s=settings.worker.claim_ttl_s,
            channel=channel,
            # The floor also finds a slot that came free by expiry (a dead holder's): at most one heartbeat late,
            # so a leaked slot is taken up again within one TTL plus one heartbeat of its holder's death.
            poll_s=min(0.25 if channel is None else 1.0, settings.worker.heartbeat_s),
            leases_announce=own_leases is not None,
        )
    finally:
        if channel is not None:
            await channel.close()
        if own_leases is not None:
            await own_leases.close()


def open_ready_index(settings: Settings) -> RedisReadyIndex | None:
    """The Redis Streams ready index when `TENURE_REDIS_URL` is set (connections open lazily), else None. A
    delivery may stay unacknowledged for one claim TTL before another worker takes it over."""
    if not settings.redis.url:
        return None
    return RedisReadyIndex(
        settings.redis.url,
        prefix=settings.redis.prefix,
        stale_s=settings.worker.claim_ttl_s,
        max_block_s=max(settings.worker.poll_s, 0.05),
    )


def count_degraded(agent: str, reason: str) -> None:
    """A job of `agent` was admitted degraded: counted in `tenure_degraded_total{agent,reason}`."""
    from tenure.observability import metrics

    metrics.DEGRADED.labels(agent, reason).inc()
