"""The worker: claim only with a free slot, start with the start CAS, run, finish with the finish CAS.

    claim loop ── claim(free slots) + start CAS (batch), one transaction ── spawn executions
                  (claim, then start, in two round trips while an after_claim fault is armed or with worker quotas)
    executions ── handler(ctx, input) ── events → writer ── finish → writer
    writer     ── one batch of fenced event appends, then one batch of finish CAS, per round trip (lingering a
                  few ms when nobody waits, so that more finishes share a commit)
    heartbeat  ── one round trip per interval renews every held claim; learns of cancels and losses
    sweeper    ── only while holding the `duty:sweeper` lease: release, lose, expire, reschedule

Every write an execution makes carries its fence (job, epoch, token). When a write matches no row, or a
heartbeat does not renew a claim, or no heartbeat got through for a whole claim TTL, the execution is stopped
(its task is cancelled and every later call raises `OwnershipLost`) and writes nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

from tenure.contracts.errors import (
    ConfigError,
    HandlerAborted,
    JobCancelled,
    OwnershipLost,
    PermanentError,
    QuotaExhausted,
    QuotaUnavailable,
    StoreUnavailable,
    TenureError,
)
from tenure.contracts.ready import Delivery, ReadyHint, ReadyIndex
from tenure.contracts.states import JobState, WorkerState
from tenure.contracts.store import Backends, LeaseRef, Leases, Store
from tenure.contracts.types import (
    Claim,
    Command,
    Fence,
    Finish,
    JobFilter,
    NewEvent,
    Start,
    Started,
    WorkerInfo,
    describe_error,
    dumps,
    new_id,
)
from tenure.control.quotas import ExecutionQuotas, QuotaManager
from tenure.control.retry import backoff_s
from tenure.kernel.blocking import BlockingAdapter, ProcessAdapter
from tenure.kernel.context import Context
from tenure.kernel.registry import Agent, Tenure
from tenure.observability.logs import bind_log_context
from tenure.worker.faults import Faults
from tenure.worker.observe import WorkerObserver

log = logging.getLogger("tenure.worker")
T = TypeVar("T")

SWEEPER_DUTY = "duty:sweeper"
MAX_RESULT_BYTES = 1024 * 1024
# A waiting execution polls the store for its commands (persisted by the gateway before delivery).
_COMMAND_POLL_MIN_S = 0.05
_COMMAND_POLL_MAX_S = 1.0
# A stopped handler (ownership lost, cancelled, timed out, drained) gets this long to end before it is abandoned.
_CANCEL_GRACE_S = 5.0


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """How one worker process behaves. See docs/configuration.md for the matching TENURE_* variables."""

    concurrency: int = 10
    heartbeat_s: float = 5.0
    claim_ttl_s: float = 15.0
    sweep_interval_s: float = 1.0
    drain_timeout_s: float = 30.0
    poll_s: float = 1.0
    capabilities: tuple[str, ...] = ()
    event_buffer: int = 1000
    blocking_max_in_flight: int = 32
    blocking_max_queued: int = 1000
    blocking_queue_timeout_s: float = 60.0
    retry_base_s: float = 1.0
    retry_cap_s: float = 300.0
    # The writer waits this long before a round trip nobody is waiting on (finishes, unflushed events), so
    # that more of them share its commit. 0 writes at once.
    write_linger_s: float = 0.003
    # Observability (docs/observability.md): the lag sampler, its stall log, and lag-aware liveness.
    lag_interval_s: float = 0.05
    stall_threshold_s: float = 0.25
    degraded_lag_s: float = 0.5
    degraded_for_s: float = 2.0

    def __post_init__(self) -> None:
        # The same rule as settings.py, for workers built from Python: a heartbeat that is late once (a
        # busy loop, a slow round trip) must not cost the claims. The tolerance absorbs 3 * 0.1 != 0.3.
        if self.claim_ttl_s < 3 * self.heartbeat_s - 1e-9:
            raise ConfigError(f"claim_ttl_s ({self.claim_ttl_s:g}) must be at least 3 heartbeats (3 x {self.heartbeat_s:g})")

    @property
    def worker_ttl_s(self) -> float:
        """A worker silent this long is marked gone in the registry."""
        return self.claim_ttl_s * 2


class _Writer:
    """Group commit for one worker: whatever events and finishes are pending when a round trip can start go
    together — events first (so a job's history is complete before its finish), then finishes."""

    def __init__(
        self,
        store: Store,
        worker_id: str,
        on_rejected: Callable[[str], None],
        linger_s: float = 0.0,
        full: int = 1,
        busy: Callable[[], bool] = lambda: True,
    ) -> None:
        self._store = store
        self._linger_s = linger_s
        self._full = full  # this many pending finishes make a batch worth sending without lingering
        self._busy = busy  # are other jobs still running (whose finishes could join a lingering write)?
        self._worker_id = worker_id
        self._on_rejected = on_rejected
        self._events: list[NewEvent] = []
        self._flushes: list[asyncio.Future[None]] = []
        self._finishes: list[tuple[Finish, asyncio.Future[bool]]] = []
        self._events_in_flight = False  # an append_events round trip is out: no finish may overtake it
        self._wake = asyncio.Event()
        self._closing = False

    def append(self, event: NewEvent) -> None:
        self._events.append(event)
        self._wake.set()

    def flush(self) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._flushes.append(fut)
        self._wake.set()
        return fut

    def finish(self, finish: Finish) -> asyncio.Future[bool]:
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._finishes.append((finish, fut))
        self._wake.set()
        return fut

    def idle(self) -> bool:
        return not (self._events or self._flushes or self._finishes)

    def take_finishes(self) -> list[tuple[Finish, asyncio.Future[bool]]]:
        """Hand the pending finishes to a caller that writes them in its own transaction (the claim loop, on a
        store where that saves a commit) and then calls `settle` or `give_back`. Nothing is handed over while
        events are pending or being written: a job's events are written before its finish."""
        if self._events or self._events_in_flight or self._flushes or self._closing or not self._finishes:
            return []
        taken, self._finishes = self._finishes, []
        return taken

    @staticmethod
    def settle(taken: list[tuple[Finish, asyncio.Future[bool]]], done: Iterable[str]) -> None:
        matched = set(done)
        for f, fut in taken:
            if not fut.done():
                fut.set_result(f.fence.job_id in matched)

    def give_back(self, taken: list[tuple[Finish, asyncio.Future[bool]]]) -> None:
        """The caller's transaction did not commit: the writer writes these itself (a finish is idempotent)."""
        self._finishes[:0] = taken
        self._wake.set()

    async def run(self) -> None:
        retry_delay = 0.05
        while True:
            if self.idle():
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            if (
                self._linger_s > 0
                and not (self._flushes or self._closing)
                and len(self._finishes) < self._full
                and self._busy()
            ):
                # Nobody waits on this write: let the finishes of jobs ending in the next moments share its
                # round trip and commit (batches of ~6 grow to ~15 in a drain; a result shows up that much later).
                # With no other job running there is nothing to wait for: an idle worker writes at once, so its
                # commit does not land on the pickup of the next job.
                await asyncio.sleep(self._linger_s)
            events, flushes, finishes = self._events, self._flushes, self._finishes
            self._events, self._flushes, self._finishes = [], [], []
            try:
                if events:
                    self._events_in_flight = True
                    try:
                        for job_id in await self._store.append_events(events):
                            self._on_rejected(job_id)
                    finally:
                        self._events_in_flight = False
                for flushed in flushes:
                    if not flushed.done():
                        flushed.set_result(None)
                if finishes:
                    self.settle(finishes, await self._store.finish(self._worker_id, [f for f, _ in finishes]))
                retry_delay = 0.05
            except Exception as exc:
                # Keep everything and try again: appends are idempotent (ON CONFLICT DO NOTHING), and a finish
                # that committed before the error is recognised by the caller. Values no store accepts never get
                # here (`dumps`, `clean_text` refuse them in the execution that made them).
                if isinstance(exc, StoreUnavailable):
                    log.warning("store unavailable while writing, retrying in %.2fs: %s", retry_delay, exc)
                else:
                    log.exception("writing events and finishes failed, retrying in %.2fs", retry_delay)
                self._events[:0], self._flushes[:0], self._finishes[:0] = events, flushes, finishes
                await asyncio.sleep(retry_delay)
                retry_delay = min(retry_delay * 2, 2.0)

    async def close(self) -> None:
        self._closing = True
        self._wake.set()


class _Execution:
    """One started execution: its fence, its event sequence, and the port its Context writes through."""

    __slots__ = (
        "agent",
        "attempt",
        "cancel_requested",
        "claim",
        "closed",
        "command_seq",
        "commands",
        "commands_ready",
        "execution_id",
        "fence",
        "finishing",
        "handler",
        "lost",
        "quotas",
        "seq",
        "started_at",
        "task",
        "unwritten",
        "usage",
        "worker",
    )

    def __init__(self, worker: Worker, claim: Claim, started: Started, agent: Agent) -> None:
        self.worker = worker
        self.claim = claim
        self.agent = agent
        self.fence = started.fence
        self.execution_id = started.execution_id
        self.started_at = started.started_at
        self.attempt = started.attempt
        self.seq = 1  # seq 1 is execution.started, written by the start CAS
        self.lost = False
        self.finishing = False
        self.closed = False  # the execution ended (or abandoned its handler): its port writes nothing more
        self.handler: asyncio.Task[Any] | None = None  # the handler's own task (see Worker._run_handler)
        self.cancel_requested = False
        self.unwritten = 0
        self.usage: dict[str, float] = {}
        self.task: asyncio.Task[None] | None = None
        self.command_seq = 0  # the last command read from the store
        self.commands: list[Command] = []  # read, not yet consumed (another kind than the one awaited)
        self.commands_ready = asyncio.Event()  # set by the control loop when a new command is persisted
        self.quotas: ExecutionQuotas | None = (
            worker.quotas.for_execution(self.execution_id) if worker.quotas is not None else None
        )

    # -- ExecutionPort -------------------------------------------------------------------------------------------
    def check(self) -> None:
        if self.lost or self.closed:
            raise OwnershipLost(f"job {self.fence.job_id} is no longer owned by epoch {self.fence.epoch}")
        if self.cancel_requested:
            raise JobCancelled(f"job {self.fence.job_id} was cancelled")

    async def emit(self, type: str, payload_json: str) -> None:
        if self.lost or self.closed:
            self.check()
        if self.seq == 1:
            self.worker._obs.first_event(self.fence.job_id, self.agent.spec.name)
        self.seq += 1
        self.worker._writer.append(NewEvent(self.fence, self.execution_id, self.seq, type, payload_json))
        self.unwritten += 1
        if self.unwritten >= self.worker.config.event_buffer:
            await self.flush()

    async def flush(self) -> None:
        self.unwritten = 0
        await self.worker._writer.flush()
        if self.lost:
            self.check()

    async def to_thread(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        return await self.worker._adapter.run(fn, *args, **kwargs)

    async def to_process(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        return await self.worker._run_in_process(fn, *args, **kwargs)

    def record_usage(self, counts: dict[str, float]) -> None:
        for k, v in counts.items():
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ValueError(f"usage counts are finite numbers, not {k}={v!r}")
        for k, v in counts.items():
            self.usage[k] = self.usage.get(k, 0) + v

    def record_external(self, kind: str, seconds: float) -> None:
        self.worker._obs.external(self.agent.spec.name, kind, seconds)

    # -- pause and resume (ctx.next_input, ctx.approval) ---------------------------------------------------------------
    def _take_command(self, kind: str) -> Command | None:
        for i, c in enumerate(self.commands):
            if c.kind == kind:
                return self.commands.pop(i)
        return None

    async def _read_commands(self) -> None:
        new = await self.worker.store.read_commands(self.fence.job_id, self.command_seq)
        if new:
            self.command_seq = new[-1].seq
            self.commands.extend(new)

    async def _set_waiting(self, waiting: bool, payload: dict[str, Any]) -> None:
        await self.flush()  # the history stays in order: everything emitted before goes first
        self.seq += 1
        event = NewEvent(
            self.fence, self.execution_id, self.seq, "job.waiting" if waiting else "job.resumed", dumps(payload)
        )
        if not await self.worker.store.set_waiting(event, waiting):
            self.worker._lose(self.fence.job_id)
            self.check()
            raise OwnershipLost(f"job {self.fence.job_id} is no longer owned by epoch {self.fence.epoch}")

    async def wait_command(self, kind: str, prompt: Any) -> Any:
        self.check()
        await self._read_commands()
        command = self._take_command(kind)
        if command is None:
            await self._set_waiting(True, {"for": kind, "prompt": prompt})
            await self.pause_quotas()  # waiting holds no quota lease either (seed 003: pause / resume)
            self.worker._free_slot()  # waiting holds no worker slot
            try:
                delay = _COMMAND_POLL_MIN_S
                while command is None:
                    # Woken by the control loop (NOTIFY / polling hint); the growing poll is the floor.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.commands_ready.wait(), delay)
                    self.commands_ready.clear()
                    self.check()
                    try:
                        await self._read_commands()
                    except StoreUnavailable as exc:
                        log.warning("reading commands of job %s failed: %s", self.fence.job_id, exc)
                    command = self._take_command(kind)
                    delay = min(delay * 1.5, _COMMAND_POLL_MAX_S)
            finally:
                self.worker._busy += 1  # take a slot back (briefly over the limit at worst: no new claims)
            await self.resume_quotas()  # the leases are taken back before the handler continues
            await self._set_waiting(False, {"command": kind, "seq": command.seq})
        return command.payload

    def quota(self, key: str, wait: bool, timeout_s: float | None) -> AbstractAsyncContextManager[object]:
        if self.quotas is None:
            raise ConfigError(f"quota {key!r} requested, but this worker has no quota backend")
        return self.quotas.quota(key, wait=wait, timeout_s=timeout_s)

    async def pause_quotas(self) -> None:
        if self.quotas is not None:
            await self.quotas.pause()

    async def resume_quotas(self) -> None:
        if self.quotas is not None:
            await self.quotas.resume()


class Worker:
    """One worker incarnation. `await Worker(backends, app, config).run(stop_event)`."""

    def __init__(
        self,
        backends: Backends,
        app: Tenure,
        config: WorkerConfig | None = None,
        *,
        leases: Leases | None = None,
        faults: Faults | None = None,
        worker_id: str | None = None,
        quotas: QuotaManager | None = None,
        ready_index: ReadyIndex | None = None,
    ) -> None:
        store = backends.jobs
        self.store = store
        self.signals = backends.signals
        self.app = app
        self.config = config or WorkerConfig()
        # The sweeper duty lives in the store's leases table unless other leases are given.
        self.leases: Leases = leases or backends.leases
        self.faults = faults or Faults()
        # Global quotas (control/quotas.py): renewed by the heartbeat, one round trip per lease backend. Without
        # a configured manager, quotas live on the store's leases table and no key is configured.
        self.quotas: QuotaManager | None = quotas or QuotaManager(backends.leases, {}, ttl_s=self.config.claim_ttl_s)
        # The ready index (Redis Streams) only wakes this worker and hints candidates; claims stay the store's
        # conditional UPDATE, and the store is polled whenever the index is down or silent.
        self.ready_index = ready_index
        self._index_down_until = 0.0
        # Agents declaring a global worker quota are claimed only with a slot of it already held.
        self._quota_agents: dict[str, list[str]] = {}
        for name, agent in sorted(app.agents.items()):
            if agent.spec.worker_quota is not None:
                self._quota_agents.setdefault(agent.spec.worker_quota, []).append(name)
        self._plain_agents = [a for a in sorted(app.agents) if app.agents[a].spec.worker_quota is None]
        self._worker_slots: dict[str, LeaseRef] = {}  # job id → the worker-quota slot held for it
        self._worker_slot_seq = 0
        for key in self._quota_agents:
            if self.quotas is None:
                raise ConfigError(f"worker quota {key!r} needs a quota backend")
            self.quotas.spec(key)  # an unconfigured worker quota is a start-up error
        self.host = socket.gethostname()
        self.id = worker_id or f"{self.host}:{os.getpid()}:{new_id()[-8:]}"
        self.agents = sorted(app.agents)
        self.state = WorkerState.ACTIVE  # what the registry is told (see _check_liveness)
        self._lag_state = WorkerState.ACTIVE  # the loop-lag half of it
        self._claim_failures = 0  # claim round trips failed in a row
        self._claim_failure_logged = 0.0
        self._claimed: dict[str, Claim] = {}  # claimed, not started
        self._running: dict[str, _Execution] = {}  # started, not finished
        self._busy = 0  # slots in use: claimed + running handlers
        self._slot_freed = asyncio.Event()
        self._stopping = asyncio.Event()
        self._shutting_down = False
        self._writer = _Writer(
            store,
            self.id,
            self._lose,
            self.config.write_linger_s,
            max(1, self.config.concurrency),
            busy=lambda: self._busy > 0,
        )
        self._adapter = BlockingAdapter(
            "worker",
            self.config.blocking_max_in_flight,
            self.config.blocking_max_queued,
            self.config.blocking_queue_timeout_s,
        )
        self._process_adapter: ProcessAdapter | None = None
        # Handlers that ignored their cancellation and run on after their execution ended (see _stop_handler).
        self.abandoned: set[asyncio.Task[Any]] = set()
        self._last_renewed = time.monotonic()
        self._executions: asyncio.TaskGroup | None = None
        self.finished = 0
        self._obs = WorkerObserver(
            self.id,
            heartbeat_s=self.config.heartbeat_s,
            lag_interval_s=self.config.lag_interval_s,
            stall_threshold_s=self.config.stall_threshold_s,
            degraded_lag_s=self.config.degraded_lag_s,
            degraded_for_s=self.config.degraded_for_s,
        )
        self._obs.watch_adapter(self._adapter)
        self._registry_exported_at = 0.0

    # -- public -----------------------------------------------------------------------------------------------------
    def info(self) -> WorkerInfo:
        return WorkerInfo(
            id=self.id,
            host=self.host,
            pid=os.getpid(),
            concurrency=self.config.concurrency,
            agents=tuple(self.agents),
            capabilities=tuple(self.config.capabilities),
            state=self.state,
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set, then drain: release unstarted claims at once, let running executions
        finish (up to the drain timeout), and leave the registry."""
        await self.store.register_worker(self.info())
        log.info("worker %s up: %d slots, agents %s", self.id, self.config.concurrency, ", ".join(self.agents))
        async with asyncio.TaskGroup() as loops:
            writer = loops.create_task(_keep_running("writer", self._writer.run), name="writer")
            heartbeat = loops.create_task(_keep_running("heartbeat", self._heartbeat_loop), name="heartbeat")
            sweeper = loops.create_task(_keep_running("sweeper", self._sweeper_loop), name="sweeper")
            lag_sampler = loops.create_task(self._obs.sampler.run(), name="lag-sampler")
            control = loops.create_task(_keep_running("control", self._control_loop), name="control")
            quota_wakeups = loops.create_task(_keep_running("quota", self._quota_wakeups), name="quota-wakeups")
            async with asyncio.TaskGroup() as executions:
                self._executions = executions
                claim_loop = self._claim_loop if self.ready_index is None else self._claim_loop_indexed
                claimer = executions.create_task(_keep_running("claim", claim_loop), name="claim-loop")
                await stop.wait()
                await self._drain(claimer)
            self._executions = None
            sweeper.cancel()
            control.cancel()
            quota_wakeups.cancel()
            await self._writer.close()
            await writer
            heartbeat.cancel()
            lag_sampler.cancel()
        await self._leave()

    # -- claiming -----------------------------------------------------------------------------------------------------
    async def _claim_loop(self) -> None:
        cfg = self.config
        while not self._stopping.is_set():
            self._check_liveness()
            free = cfg.concurrency - self._busy
            if free <= 0 or not self._may_claim():
                self._slot_freed.clear()
                await self._wait_any(self._slot_freed.wait(), cfg.poll_s)
                continue
            # Claim and start in one store transaction (one round trip), unless a worker quota must be held
            # per claim or a fault is to be injected between the two conditional updates.
            together = not self._quota_agents and not self.faults.armed("after_claim")
            try:
                if together:
                    pairs = await self._claim_and_start(free)
                    claims = [c for c, _ in pairs]
                else:
                    claims = await self._claim(free)
            except StoreUnavailable as exc:
                # A claim_and_start that committed before the error left running jobs nobody renews: the
                # sweeper marks them lost after the claim TTL, as after a failed start.
                await self._claim_failed(exc)
                continue
            self._claim_worked()
            if not claims:
                await self._wait_any(self.signals.wait_for_jobs(cfg.poll_s), cfg.poll_s)
                continue
            self._busy += len(claims)
            self._obs.claimed(claims)
            if together:
                self._launch(pairs, claimed=False)
                await self.faults.hit("after_start", {c.agent for c in claims})
                # Let the handlers just spawned take their first step before the next claim is sent: they
                # start now, not after another round trip has been prepared and written. (The next claim may
                # not wait for a wake-up instead: a claim returns fewer jobs than asked whenever a concurrent
                # claim held or had just updated some of its candidates, with more still queued.)
                await asyncio.sleep(0)
                continue
            for c in claims:
                self._claimed[c.fence.job_id] = c
            await self.faults.hit("after_claim", {c.agent for c in claims}, self._stopping)
            if self._stopping.is_set():
                return  # draining: these claims stay unstarted and are released by _drain
            await self._start(claims)
            await self._settle_worker_slots()

    async def _claim_and_start(self, free: int) -> list[tuple[Claim, Started]]:
        """Claim and start up to `free` jobs. Where the store writes finishes and a claim in one commit, the
        finishes waiting in the writer go along (their futures are settled here)."""
        cfg = self.config
        taken = self._writer.take_finishes() if self.store.claim_carries_finishes else []
        if not taken:
            return await self.store.claim_and_start(self.id, self.agents, cfg.capabilities, free, cfg.claim_ttl_s)
        try:
            done, pairs = await self.store.finish_and_claim(
                self.id, [f for f, _ in taken], self.agents, cfg.capabilities, free, cfg.claim_ttl_s
            )
        except BaseException:
            self._writer.give_back(taken)
            raise
        self._writer.settle(taken, done)
        return pairs

    async def _claim_loop_indexed(self) -> None:
        """The claim loop with a ready index (seed 003's rule): reserve capacity first, then read at most that
        many hints, then claim in the store; acknowledge a hint once its claim succeeded or proved the job gone.
        The store claim also runs without hints, so a job the index never heard of is still found."""
        cfg = self.config
        index = self.ready_index
        assert index is not None
        loop = asyncio.get_running_loop()
        while not self._stopping.is_set():
            free = cfg.concurrency - self._busy
            if free <= 0 or not self._may_claim():
                self._slot_freed.clear()
                await self._wait_any(self._slot_freed.wait(), cfg.poll_s)
                continue
            deliveries: list[Delivery] = []
            index_up = loop.time() >= self._index_down_until
            if index_up:
                try:
                    if index.rebuild_needed:
                        await self._rebuild_ready_index()
                    deliveries = await index.take(self.id, self.agents, free, cfg.poll_s)
                except StoreUnavailable as exc:
                    log.warning("ready index unavailable, polling the store: %s", exc)
                    self._index_down_until = loop.time() + max(1.0, cfg.poll_s)
                    index_up = False
            if self._stopping.is_set():
                return  # hints taken now stay pending and are handed over after the claim TTL
            try:
                claims = await self._claim(free)
            except StoreUnavailable as exc:
                await self._claim_failed(exc)
                continue
            self._claim_worked()
            await self._ack_hints(deliveries, {c.fence.job_id for c in claims})
            if not claims:
                if not index_up:
                    await self._wait_any(self.signals.wait_for_jobs(cfg.poll_s), cfg.poll_s)
                continue
            self._busy += len(claims)
            for c in claims:
                self._claimed[c.fence.job_id] = c
            await self.faults.hit("after_claim", {c.agent for c in claims}, self._stopping)
            if self._stopping.is_set():
                return
            await self._start(claims)
            await self._settle_worker_slots()

    async def _claim(self, free: int) -> list[Claim]:
        """Claim up to `free` jobs. Jobs of agents with a worker quota are claimed only for slots of it taken
        first (wait=False: a worker never claims and then waits for a slot)."""
        cfg = self.config
        if not self._quota_agents:
            return await self.store.claim(self.id, self.agents, cfg.capabilities, free, cfg.claim_ttl_s)
        claims: list[Claim] = []
        if self._plain_agents:
            claims = await self.store.claim(self.id, self._plain_agents, cfg.capabilities, free, cfg.claim_ttl_s)
        for key, agents in self._quota_agents.items():
            left = free - len(claims)
            if left <= 0:
                break
            slots = await self._reserve_worker_slots(key, left)
            if not slots:
                continue
            got: list[Claim] = []
            try:
                got = await self.store.claim(self.id, agents, cfg.capabilities, len(slots), cfg.claim_ttl_s)
            except StoreUnavailable as exc:
                if not claims:
                    raise
                log.warning("claim failed: %s", exc)  # keep the claims already made
            finally:
                for ref in slots[len(got) :]:
                    await self._release_worker_slot(ref)
            for c, ref in zip(got, slots, strict=False):
                self._worker_slots[c.fence.job_id] = ref
                self._track_worker_slot(c.fence.job_id, ref)
            claims.extend(got)
        return claims

    async def _reserve_worker_slots(self, key: str, count: int) -> list[LeaseRef]:
        quotas = self.quotas
        assert quotas is not None
        spec = quotas.spec(key)
        slots: list[LeaseRef] = []
        for _ in range(count):
            self._worker_slot_seq += 1
            ref = LeaseRef(key, f"{self.id}:slot:{self._worker_slot_seq}")
            try:
                leased = await quotas.acquire(spec, ref.holder, wait=False, timeout_s=None)
            except (QuotaExhausted, QuotaUnavailable):
                break
            if leased:
                slots.append(ref)
            else:  # fail-open: the backend is down; proceed unleased for this one claim
                slots.append(LeaseRef(key, ""))
                break
        return slots

    def _track_worker_slot(self, job_id: str, ref: LeaseRef) -> None:
        if ref.holder and self.quotas is not None:
            # A worker slot lost at renewal stops its execution, like a lost claim.
            self.quotas._track(ref, lambda: self._lose(job_id))

    async def _release_worker_slot(self, ref: LeaseRef) -> None:
        if ref.holder and self.quotas is not None:
            await self.quotas.release(ref)

    async def _settle_worker_slots(self) -> None:
        """Give back the worker-quota slots of jobs this worker no longer holds (start failed, ended)."""
        for job_id in [j for j in self._worker_slots if j not in self._claimed and j not in self._running]:
            await self._release_worker_slot(self._worker_slots.pop(job_id))

    async def _ack_hints(self, deliveries: list[Delivery], claimed: set[str]) -> None:
        """Acknowledge the hints whose job this worker claimed, or which no longer name a claimable job. A
        hint of a job still claimable (claimed by nobody yet) stays pending for another consumer."""
        if not deliveries or self.ready_index is None:
            return
        done = []
        for d in deliveries:
            if d.job_id in claimed:
                done.append(d)
                continue
            try:
                job = await self.store.get_job(d.job_id)
            except StoreUnavailable:
                continue
            if job is None or job.state is not JobState.QUEUED or job.owner is not None:
                done.append(d)
        with contextlib.suppress(StoreUnavailable):
            await self.ready_index.ack(done)

    async def _hint_ready(self, job_ids: list[str]) -> None:
        """Tell the ready index about jobs that became claimable (released, requeued, due)."""
        if self.ready_index is None or not job_ids:
            return
        hints = []
        for job_id in job_ids:
            with contextlib.suppress(StoreUnavailable):
                job = await self.store.get_job(job_id)
                if job is not None and job.state is JobState.QUEUED:
                    hints.append(ReadyHint(job.id, job.agent, job.priority))
        with contextlib.suppress(StoreUnavailable):
            await self.ready_index.publish(hints)

    async def _rebuild_ready_index(self) -> None:
        """The index was lost (or is new): re-publish every queued, unowned job of this worker's agents from
        the store, the truth. Duplicates are harmless: a hint of a job already claimed is acknowledged."""
        index = self.ready_index
        assert index is not None
        index.rebuild_needed = False
        hints: list[ReadyHint] = []
        before = None
        while True:
            page = await self.store.list_jobs(JobFilter(state=JobState.QUEUED, before=before, limit=500))
            hints += [ReadyHint(j.id, j.agent, j.priority) for j in page if j.owner is None and j.agent in self.agents]
            if len(page) < 500:
                break
            before = page[-1].id
        # Pages come newest first; publish oldest first, the order in which the store claim takes them.
        hints.reverse()
        for i in range(0, len(hints), 500):
            await index.publish(hints[i : i + 500])
        log.info("ready index rebuilt from the store: %d hints", len(hints))

    async def _wait_any(self, aw: Any, wait_s: float) -> None:
        """Wait for `aw` or for stop, at most `wait_s` seconds."""
        waiter = asyncio.ensure_future(aw)
        stopper = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({waiter, stopper}, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (waiter, stopper):
                t.cancel()
            await asyncio.gather(waiter, stopper, return_exceptions=True)

    async def _start(self, claims: list[Claim]) -> None:
        starts = [Start(c.fence, new_id()) for c in claims]
        try:
            started = await self.store.start(self.id, starts)
        except StoreUnavailable as exc:
            # Unknown whether the start committed: treat these claims as lost to us. If they did start, the
            # sweeper will find them unrenewed and mark them lost; if not, it releases them.
            log.warning("start failed, giving up %d claims: %s", len(claims), exc)
            started = []
        by_job = {s.fence.job_id: s for s in started}
        self._launch([(c, by_job.get(c.fence.job_id)) for c in claims], claimed=True)
        if started:
            await self.faults.hit("after_start", {c.agent for c in claims})

    def _launch(self, pairs: Sequence[tuple[Claim, Started | None]], claimed: bool) -> None:
        """Spawn the execution of every claim whose start matched; free the slots of the others. `claimed`:
        the claims were held in `_claimed` (claimed and started in two steps) until now."""
        for c, s in pairs:
            # A claim given up meanwhile (heartbeat said lost, or self-fencing) already freed its slot.
            still_held = self._claimed.pop(c.fence.job_id, None) is not None if claimed else True
            agent = self.app.get(c.agent)
            self._obs.started(c, s)
            if s is None or agent is None:
                if s is None:
                    log.warning(
                        "start CAS for job %s (epoch %d) matched no row: the claim was lost before it started",
                        c.fence.job_id,
                        c.fence.epoch,
                    )
                if still_held:
                    self._free_slot()
                continue
            if not still_held:
                self._busy += 1  # given up too early: the start CAS matched, so the job is ours after all
            ex = _Execution(self, c, s, agent)
            self._running[c.fence.job_id] = ex
            assert self._executions is not None
            ex.task = self._executions.create_task(self._execute(ex), name=f"job-{c.fence.job_id}")

    def _free_slot(self) -> None:
        self._busy -= 1
        self._slot_freed.set()

    # -- executing ---------------------------------------------------------------------------------------------------
    async def _execute(self, ex: _Execution) -> None:
        """Run one execution to its finish CAS. Never raises (but for the cancellation of the worker's task
        group): whatever its handler does ends this execution only, never the worker or another execution."""
        claim = ex.claim
        began = time.monotonic()
        bind_log_context(  # this task's own context: every line logged for this job names it
            job_id=claim.fence.job_id,
            execution_id=ex.execution_id,
            worker_id=self.id,
            agent=claim.agent,
            epoch=claim.fence.epoch,
        )
        ctx = Context(
            ex,
            job_id=claim.fence.job_id,
            execution_id=ex.execution_id,
            epoch=claim.fence.epoch,
            attempt=ex.attempt,
            agent=claim.agent,
            tenant=claim.tenant,
            worker_id=self.id,
        )
        slot_held = True
        try:
            try:
                result = await self._run_handler(ex, ctx)
                try:
                    result_json = dumps(result)
                except (TypeError, ValueError, RecursionError) as exc:
                    raise PermanentError(f"the result cannot be stored: {describe_error(exc)}") from exc
                if len(result_json) > MAX_RESULT_BYTES:
                    raise PermanentError(f"result is {len(result_json)} bytes; the limit is {MAX_RESULT_BYTES}")
                finish = self._finish(ex, JobState.SUCCEEDED, result_json=result_json)
            except asyncio.CancelledError:
                # Stopped from outside: ownership lost, a cancel request, or the drain timed out. Anything else
                # is the cancellation of the worker's own task group, which must go on.
                if not (ex.lost or ex.cancel_requested or self._shutting_down):
                    raise
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
                if ex.lost:
                    return
                if ex.cancel_requested:
                    finish = self._finish(ex, JobState.CANCELLED, error_code="cancelled", error="cancelled")
                else:
                    finish = self._failure(ex, "worker_shutdown", "the worker shut down before the job finished")
            except Exception as exc:
                outcome = self._outcome(ex, exc)
                if outcome is None:
                    return
                finish = outcome
            # The slot is execution capacity: free it now, while the finish waits for its round trip. A handler
            # that ignored its cancellation keeps its slot until it ends (fail closed, like the blocking adapter).
            if ex.handler is None or ex.handler.done():
                self._free_slot()
                slot_held = False
            if ex.lost:
                return
            # From here the finish CAS is the fence: a heartbeat that races it and no longer finds the claim
            # (because the finish just committed) must not cancel us.
            ex.finishing = True
            await self.faults.hit("before_finish", {claim.agent})
            matched = await self._writer.finish(finish)
            self._obs.finished(claim, ex.execution_id, finish.state, finish.error_code, time.monotonic() - began, matched)
            if not matched and not ex.lost:
                log.warning("finish of job %s matched no row: ownership was lost", claim.fence.job_id)
            self.finished += 1
        except asyncio.CancelledError:
            raise
        except BaseException:  # the last line: a defect of the worker's own, never the task group's end
            log.exception("execution of job %s failed inside the worker", claim.fence.job_id)
        finally:
            ex.closed = True
            if slot_held:
                if ex.handler is None or ex.handler.done():
                    self._free_slot()
                else:
                    ex.handler.add_done_callback(lambda _: self._free_slot())
            self._running.pop(claim.fence.job_id, None)
            if ex.quotas is not None and ex.quotas.blocks:
                with contextlib.suppress(Exception):
                    await ex.quotas.release_all()
            worker_slot = self._worker_slots.pop(claim.fence.job_id, None)
            if worker_slot is not None:
                with contextlib.suppress(Exception):
                    await self._release_worker_slot(worker_slot)

    async def _run_handler(self, ex: _Execution, ctx: Context) -> Any:
        """Run the handler in a task of its own and return its result, or raise its error (`_call_handler` makes
        every error an `Exception`), or `_HandlerTimeout`. When this execution is stopped (CancelledError) or
        times out, the handler is cancelled and given `_CANCEL_GRACE_S` to end; one that ignores cancellation
        is abandoned (`self.abandoned`), so it cannot hold its execution, its finish or a drain hostage."""
        payload = json.loads(ex.claim.input_json)
        handler = asyncio.get_running_loop().create_task(
            _call_handler(ex.agent, ctx, payload, self._adapter), name=f"handler-{ex.fence.job_id}"
        )
        ex.handler = handler
        try:
            done, _ = await asyncio.wait({handler}, timeout=ex.claim.timeout_s)
        except asyncio.CancelledError:
            await self._stop_handler(ex, handler)
            raise
        if not done:
            stopped = await self._stop_handler(ex, handler)
            raise _HandlerTimeout(ex.claim.timeout_s, stopped)
        return handler.result()

    async def _stop_handler(self, ex: _Execution, handler: asyncio.Task[Any]) -> bool:
        """Cancel the handler (again every second: cleanup code may swallow one cancellation) until it ends or
        `_CANCEL_GRACE_S` passed. False: it ignored every cancellation and runs on, abandoned."""
        deadline = time.monotonic() + _CANCEL_GRACE_S
        while not handler.done():
            left = deadline - time.monotonic()
            if left <= 0:
                self.abandoned.add(handler)
                handler.add_done_callback(self.abandoned.discard)
                log.error(
                    "job %s: the handler ignored its cancellation for %.0f s; abandoned (it keeps its slot until it "
                    "ends, and writes nothing more)",
                    ex.fence.job_id,
                    _CANCEL_GRACE_S,
                )
                ex.closed = True  # its port refuses every later write
                return False
            handler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({handler}, timeout=min(1.0, left))
        if not handler.cancelled():
            handler.exception()  # retrieved: the outcome is the stop, not what the handler raised meanwhile
        return True

    def _outcome(self, ex: _Execution, exc: Exception) -> Finish | None:
        """The finish of an execution whose handler raised `exc` (None: nothing is written, ownership is gone)."""
        if isinstance(exc, OwnershipLost):
            return None
        if isinstance(exc, JobCancelled):
            return self._finish(ex, JobState.CANCELLED, error_code="cancelled", error="cancelled")
        if isinstance(exc, _HandlerTimeout):
            return self._failure(ex, "timeout", str(exc))
        if isinstance(exc, PermanentError):
            return self._finish(ex, JobState.FAILED, error_code=exc.code, error=describe_error(exc).partition(": ")[2])
        if isinstance(exc, TenureError):
            return self._failure(ex, exc.code, describe_error(exc))
        text = describe_error(exc)
        log.info("job %s attempt %d raised %s", ex.fence.job_id, ex.attempt, text)
        return self._failure(ex, "error", text)

    def _finish(
        self,
        ex: _Execution,
        state: JobState,
        *,
        result_json: str | None = None,
        error_code: str | None = None,
        error: str | None = None,
        retry_delay_s: float = 0.0,
    ) -> Finish:
        ex.seq += 1
        return Finish(
            ex.fence,
            ex.execution_id,
            ex.started_at,
            state,
            ex.seq,
            result_json,
            error_code,
            error,
            retry_delay_s,
            dumps(ex.usage) if ex.usage else None,
        )

    def _failure(self, ex: _Execution, code: str, message: str) -> Finish:
        """A retryable failure: back to the queue after a backoff while attempts remain, else dead."""
        if ex.attempt < ex.claim.max_attempts:
            delay = backoff_s(ex.attempt, self.config.retry_base_s, self.config.retry_cap_s)
            return self._finish(ex, JobState.SCHEDULED, error_code=code, error=message, retry_delay_s=delay)
        return self._finish(ex, JobState.DEAD, error_code=code, error=f"{message} (after {ex.attempt} attempts)")

    def _lose(self, job_id: str) -> None:
        """This worker no longer owns `job_id`: stop its execution and write nothing more for it."""
        if self._claimed.pop(job_id, None) is not None:
            self._free_slot()
            log.warning("claim of job %s was lost before it started", job_id)
            return
        ex = self._running.get(job_id)
        if ex is None or ex.lost or ex.finishing:
            return
        ex.lost = True
        log.warning(
            "job %s: ownership lost (epoch %d); stopping its execution",
            job_id,
            ex.fence.epoch,
            extra={
                "state": JobState.LOST.value,
                "error_code": "owner_lost",
                "job_id": job_id,
                "execution_id": ex.execution_id,
                "epoch": ex.fence.epoch,
                "agent": ex.claim.agent,
            },
        )
        if ex.task is not None and ex.task is not asyncio.current_task():
            ex.task.cancel(f"OwnershipLost: job {job_id} epoch {ex.fence.epoch}")

    def _cancel(self, job_id: str) -> None:
        ex = self._running.get(job_id)
        if ex is None or ex.cancel_requested or ex.lost:
            return
        ex.cancel_requested = True
        if ex.task is not None:
            ex.task.cancel(f"JobCancelled: job {job_id}")

    async def _run_in_process(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        if self._process_adapter is None:
            self._process_adapter = ProcessAdapter(
                "worker-process",
                max(1, (os.cpu_count() or 2) - 1),
                self.config.blocking_max_queued,
                self.config.blocking_queue_timeout_s,
            )
            self._obs.watch_adapter(self._process_adapter)  # tenure_blocking_*{adapter="worker-process"}
        return await self._process_adapter.run(fn, *args, **kwargs)

    # -- heartbeat -----------------------------------------------------------------------------------------------------
    def _held_fences(self) -> list[Fence]:
        return [c.fence for c in self._claimed.values()] + [e.fence for e in self._running.values()]

    async def _heartbeat_loop(self) -> None:
        cfg = self.config
        loop = asyncio.get_running_loop()
        while True:
            # Sent from the loop, never from a thread, so a frozen loop cannot fake being alive; and it
            # measures how late the loop let it go (expected vs actual send time).
            due = loop.time() + cfg.heartbeat_s
            await asyncio.sleep(cfg.heartbeat_s)
            self._obs.heartbeat_sent(max(0.0, loop.time() - due), len(self._claimed) + len(self._running))
            await self.heartbeat_once()

    def _check_liveness(self) -> None:
        """Liveness: `degraded` while the loop lags (it claims nothing new) or while its claims fail (it keeps
        trying); `active` otherwise. Draining and gone are left alone. Reported by every heartbeat and by
        `tenure_worker_state`: a worker that cannot claim must not look healthy."""
        if self.state in (WorkerState.ACTIVE, WorkerState.DEGRADED):
            self._lag_state = self._obs.liveness(self._lag_state)
            healthy = self._lag_state is WorkerState.ACTIVE and not self._claim_failures
            self.state = WorkerState.ACTIVE if healthy else WorkerState.DEGRADED
        self._obs.show_state(self.state)

    def _may_claim(self) -> bool:
        """Claim now? Not while the loop lags, draining or gone; a worker degraded by failing claims tries."""
        return self._lag_state is WorkerState.ACTIVE and self.state in (WorkerState.ACTIVE, WorkerState.DEGRADED)

    async def _claim_failed(self, exc: StoreUnavailable) -> None:
        """A claim round trip failed: count it, be `degraded` until one works again, and wait before the next
        one (the poll interval, doubling to 5 s: the store's connection comes back with its own backoff)."""
        self._claim_failures += 1
        self._obs.claim_failed()
        now = time.monotonic()
        if self._claim_failures == 1 or now - self._claim_failure_logged > 10.0:
            self._claim_failure_logged = now
            log.warning("claim failed (%d in a row; degraded until a claim works): %s", self._claim_failures, exc)
        self._check_liveness()
        delay = min(self.config.poll_s * 2 ** min(self._claim_failures - 1, 10), max(self.config.poll_s, 5.0))
        await self._wait_any(self._stopping.wait(), delay)

    def _claim_worked(self) -> None:
        if self._claim_failures:
            log.info("claims work again after %d failures", self._claim_failures)
            self._claim_failures = 0
            self._check_liveness()

    async def renew_quotas(self) -> None:
        """Renew every quota lease of this process in one round trip; a lost one cancels its holding block."""
        if self.quotas is not None:
            await self.quotas.renew()

    async def _quota_wakeups(self) -> None:
        if self.quotas is not None:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.quotas.run(), name="quota-listener")
                tg.create_task(self._quota_heartbeat_loop(), name="quota-heartbeat")

    async def _export_quotas(self) -> None:
        """tenure_quota_in_use / _limit / _rejected_total / _fail_open_total for every configured quota (one read
        per key)."""
        q = self.quotas
        if q is None:
            return
        in_use: dict[str, int] = {}
        for key in q.specs:
            try:
                in_use[key] = len(await q.leases.holders(key))
            except StoreUnavailable:  # LeasesUnavailable too: the gauge keeps its last value
                continue
        self._obs.quotas_seen(in_use, {k: spec.limit for k, spec in q.specs.items()}, q.rejections, q.fail_open_admitted)

    async def _quota_heartbeat_loop(self) -> None:
        """The heartbeat's quota half, on the same interval but its own task, so a slow store round trip never
        delays the renewal of quota leases (a lease renewed late is lost, and its slot handed to another)."""
        while True:
            await asyncio.sleep(self.config.heartbeat_s)
            await self.renew_quotas()
            await self._export_quotas()
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # A cancellation absorbed by the Redis driver mid-renewal must still stop this loop.
                raise asyncio.CancelledError

    async def heartbeat_once(self) -> None:
        """One heartbeat round trip: renew every held claim, learn of losses and cancel requests."""
        cfg = self.config
        self._check_liveness()
        held = self._held_fences()
        sent = time.monotonic()
        try:
            reply = await self.store.heartbeat(self.id, self.state, len(self._running), held, cfg.claim_ttl_s)
        except StoreUnavailable as exc:
            log.warning("heartbeat failed: %s", exc)
            if time.monotonic() - self._last_renewed > cfg.claim_ttl_s:
                # No renewal for a whole TTL: others may already own our jobs. Stop everything (self-fencing).
                for f in held:
                    self._lose(f.job_id)
            return
        self._last_renewed = sent
        for f in reply.lost(held):
            current = self._running.get(f.job_id) or self._claimed.get(f.job_id)
            if current is not None and current.fence == f:
                self._lose(f.job_id)
        for job_id in reply.cancel_requested:
            self._cancel(job_id)

    # -- control commands: the fast path to the owner ------------------------------------------------------------------
    async def _control_loop(self) -> None:
        """Act on cancel requests and new commands as soon as the store hints at them (NOTIFY on Postgres,
        polling on SQLite). The heartbeat reply still carries the cancel flags: this loop only makes it fast."""
        while True:
            try:
                hint = await self.signals.wait_for_control(self.config.poll_s)
                if hint is not None and not hint:
                    continue
                ids = [j for j in self._running if hint is None or j in hint]
                if not ids:
                    continue
                cancels, seqs = await self.store.control_state(ids)
            except StoreUnavailable as exc:
                log.warning("control hints unavailable, heartbeats deliver commands meanwhile: %s", exc)
                await asyncio.sleep(self.config.poll_s)
                continue
            for job_id in cancels:
                self._cancel(job_id)
            for job_id, seq in seqs.items():
                ex = self._running.get(job_id)
                if ex is not None and seq > ex.command_seq:
                    ex.commands_ready.set()

    # -- sweeper duty ---------------------------------------------------------------------------------------------------
    async def _sweeper_loop(self) -> None:
        cfg = self.config
        while True:
            try:
                if await self.leases.acquire(SWEEPER_DUTY, self.id, 1, cfg.claim_ttl_s):
                    report = await self.store.sweep(cfg.worker_ttl_s)
                    await self._hint_ready(report.released + report.requeued + report.due)
                    if report.total():
                        log.info("sweep: %s", {k: len(v) for k, v in report.as_dict().items() if v})
                    self._obs.swept(report)
                    await self._export_registry()
            except StoreUnavailable as exc:
                log.warning("sweep failed: %s", exc)
            await asyncio.sleep(cfg.sweep_interval_s)

    # -- shutdown --------------------------------------------------------------------------------------------------------
    async def _drain(self, claimer: asyncio.Task[None]) -> None:
        self._stopping.set()
        self.state = WorkerState.DRAINING
        with contextlib.suppress(StoreUnavailable):
            await self.store.set_worker_state(self.id, WorkerState.DRAINING)
        await claimer
        unstarted = [c.fence for c in self._claimed.values()]
        if unstarted:
            with contextlib.suppress(StoreUnavailable):
                released = await self.store.release_claims(self.id, unstarted)
                log.info("drain: released %d unstarted claims", len(released))
            for f in unstarted:
                if self._claimed.pop(f.job_id, None) is not None:
                    self._free_slot()
        await self._settle_worker_slots()
        tasks = [e.task for e in self._running.values() if e.task is not None]
        if tasks:
            log.info("drain: waiting up to %.0fs for %d running jobs", self.config.drain_timeout_s, len(tasks))
            _, pending = await asyncio.wait(tasks, timeout=self.config.drain_timeout_s)
            if pending:
                self._shutting_down = True
                for t in pending:
                    t.cancel("worker shutdown")
                await asyncio.wait(pending)

    async def _export_registry(self) -> None:
        """As the sweeper-duty holder, export `tenure_workers{state}` every few seconds (one process does)."""
        now = time.monotonic()
        if now - self._registry_exported_at >= 5.0:
            self._registry_exported_at = now
            self._obs.registry_seen(await self.store.list_workers(include_gone=False))
            self._obs.jobs_seen(await self.store.count_live_jobs())

    async def _leave(self) -> None:
        self.state = WorkerState.GONE
        self._obs.show_state(self.state)
        self._obs.close()
        with contextlib.suppress(StoreUnavailable):
            await self.leases.release(SWEEPER_DUTY, self.id)
            await self.store.set_worker_state(self.id, WorkerState.GONE)
        await self._adapter.close(5.0)
        if self._process_adapter is not None:
            await self._process_adapter.close(5.0)
        log.info("worker %s gone after %d jobs", self.id, self.finished)


async def _keep_running(name: str, loop: Callable[[], Awaitable[None]]) -> None:
    """Run one of a worker's background loops. A loop that raises — a defect, or a driver error a backend failed
    to translate — is logged and started again after a growing delay: no background loop ends but with its
    worker (and a failing one must not take the worker's task group, and every job on it, down)."""
    delay = 0.1
    while True:
        try:
            await loop()
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("the %s loop failed; starting it again in %.1f s", name, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


class _HandlerTimeout(Exception):
    """The handler ran past its agent's timeout (and was stopped, or abandoned when it ignored that)."""

    def __init__(self, timeout_s: float | None, stopped: bool) -> None:
        text = f"the handler ran longer than {timeout_s}s"
        if not stopped:
            text += f" and ignored its cancellation for {_CANCEL_GRACE_S:g}s (abandoned)"
        super().__init__(text)


async def _call_handler(agent: Agent, ctx: Context, payload: Any, adapter: BlockingAdapter) -> Any:
    """The handler's call, in its own task. The three exceptions that are not `Exception`s become one here:
    asyncio re-raises SystemExit and KeyboardInterrupt out of any task into the event loop (ending the
    process), and GeneratorExit would escape the execution into the worker's task group."""
    try:
        if agent.is_async:
            return await agent.handler(ctx, payload)
        return await adapter.run(agent.handler, ctx, payload)
    except (SystemExit, KeyboardInterrupt, GeneratorExit) as exc:
        raise HandlerAborted(describe_error(exc)) from None
