"""The worker: claim only with a free slot, start with the start CAS, run, finish with the finish CAS.

`Worker` composes one part per duty, every loop a child of one task group (each execution a task of its own):

    claiming.py   the claim loop: slots first, then candidates (store wake-ups or ready-index hints), then a
                  claimer (claim and start in one step, or two), then the executions are launched
    execution.py  one execution: its handler awaited in its own task, its stop and grace, its fenced writes, its finish
    waits.py      an execution's pause and resume (commands, approvals, a coordinator's wait for its children)
    completer.py  the batched writer of events and finishes (the next claim may carry the finishes)
    heartbeat.py  the heartbeat (renews every claim, learns of losses and cancels), quota renewal, the control
                  fast path
    duties.py     the sweeper duty (only while holding `duty:sweeper`), and the loops' restart-on-error guard
    slots.py, held.py, health.py   capacity, what is held now, and the state told to the registry

Every write an execution makes carries its fence (job, epoch, token). When a write matches no row, or a
heartbeat does not renew a claim, or no heartbeat got through for a whole claim TTL, the execution is stopped
(its task is cancelled and every later call raises `OwnershipLost`) and writes nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from tenure.contracts.errors import ConfigError, StoreUnavailable, TenureError
from tenure.contracts.profile import specs_json
from tenure.contracts.ready import ReadyIndex
from tenure.contracts.states import WorkerState
from tenure.contracts.store import Backends, Leases
from tenure.contracts.text import describe_error
from tenure.contracts.types import Claim, Started, WorkerInfo, new_id
from tenure.control.admission import Admission
from tenure.control.quotas import QuotaManager
from tenure.kernel.blocking import BlockingAdapter, ProcessAdapter
from tenure.kernel.registry import Tenure
from tenure.worker.claiming import (
    Candidates,
    ClaimLoop,
    OneStepClaimer,
    ReadyIndexHints,
    StoreWakeups,
    TwoStepClaimer,
)
from tenure.worker.completer import Completer
from tenure.worker.config import WorkerConfig
from tenure.worker.duties import SweeperDuty, keep_running
from tenure.worker.execution import Env, Execution
from tenure.worker.faults import Faults
from tenure.worker.health import Health
from tenure.worker.heartbeat import Heartbeat
from tenure.worker.held import Held
from tenure.worker.observe import WorkerObserver
from tenure.worker.slots import Slots

log = logging.getLogger("tenure.worker")


class WarmupFailed(TenureError):
    """A `@app.warmup` function raised: the worker left the registry without taking a job."""

    code = "warmup_failed"


def incarnation_id() -> str:
    """A new worker incarnation's id, `host:pid:random`: a restarted worker is a new member of the registry."""
    return f"{socket.gethostname()}:{os.getpid()}:{new_id()[-8:]}"


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
        admission: Admission | None = None,
    ) -> None:
        cfg = self.config = config or WorkerConfig()
        store = self.store = backends.jobs
        self.signals = backends.signals
        self.app = app
        self.faults = faults or Faults()
        # Global quotas (control/quotas.py): renewed by the heartbeat, one round trip per lease backend. Without
        # a configured manager, quotas live on the store's leases table and no key is configured.
        self.quotas = quotas or QuotaManager(backends.leases, {}, ttl_s=cfg.claim_ttl_s)
        self.host = socket.gethostname()
        self.id = worker_id or incarnation_id()
        self._registered = False
        self.agents = sorted(app.agents)
        self.finished = 0
        self.on_claimed: Callable[[str], None] | None = None
        """Told the id of each job it starts (the local fast path's accounting: control/routing.LocalPath)."""
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()  # the executions' tasks (held here: the loop holds them weakly)
        self._none_running = asyncio.Event()  # set while no execution runs (the drain waits for it)
        self._none_running.set()
        self._obs = WorkerObserver(
            self.id,
            heartbeat_s=cfg.heartbeat_s,
            lag_interval_s=cfg.lag_interval_s,
            stall_threshold_s=cfg.stall_threshold_s,
            degraded_lag_s=cfg.degraded_lag_s,
            degraded_for_s=cfg.degraded_for_s,
        )
        self.health = Health(self._obs, cfg.unhealthy_after, cfg.unhealthy_cooldown_s)
        if app.warmups:
            self.health.warming()  # registers as `warming`; `active` once `_warm_up` ran them all
        self.warmup_error: BaseException | None = None
        self.slots = Slots(cfg.concurrency)
        self.held = Held(self.slots)
        self.completer = Completer(
            store,
            self.id,
            self.held.lose,
            linger_s=cfg.write_linger_s,
            full=max(1, cfg.concurrency),
            busy=lambda: self.slots.busy > 0,
            claim_soon=lambda: self._claim_loop.claims_soon(),
        )
        self._adapter = BlockingAdapter(
            "worker", cfg.blocking_max_in_flight, cfg.blocking_max_queued, cfg.blocking_queue_timeout_s
        )
        self._obs.watch_adapter(self._adapter)
        self._process_adapter: ProcessAdapter | None = None
        self.abandoned: set[asyncio.Task[Any]] = set()
        """Handlers that ignored their cancellation and run on after their execution ended."""
        self._env = Env(
            worker_id=self.id,
            config=cfg,
            store=store,
            completer=self.completer,
            slots=self.slots,
            observer=self._obs,
            faults=self.faults,
            adapter=self._adapter,
            process_adapter=self._processes,
            quotas=self.quotas,
            abandoned=self.abandoned,
            artifacts=backends.artifacts,
            # Children (`ctx.spawn`) come in by the same door as every job: the caps, known agents and budgets hold.
            admission=admission or Admission(store, app.specs(), ready_index=ready_index),
        )
        # The claim path: one step unless a worker quota must be taken per claim (or two steps are asked for).
        # A fault point on the two-step path is never a reason to take it.
        worker_quotas = any(a.spec.worker_quota is not None for a in app.agents.values())
        two_step = cfg.claim_mode == "two_step" or worker_quotas
        if self.faults.armed("after_claim") and not two_step:
            raise ConfigError(
                "TENURE_FAULTS names after_claim, a point of the two-step claim only: set TENURE_CLAIM_MODE=two_step"
            )
        self._claimer: OneStepClaimer | TwoStepClaimer
        if two_step:
            self._claimer = TwoStepClaimer(
                store, app, cfg, self.id, self.slots, self.held, self._obs, self.faults, self.quotas, self._stopping
            )
        else:
            self._claimer = OneStepClaimer(self.completer, cfg, self.agents, self.slots, self._obs)
        # The ready index (Redis Streams) only wakes this worker and hints candidates; claims stay the store's
        # conditional UPDATE, and the store is polled whenever the index is down or silent.
        self.ready_index = ready_index
        candidates: Candidates = (
            StoreWakeups(backends.signals, cfg.poll_s, self._stopping, cfg.route_grace_ms / 1000.0)
            if ready_index is None
            else ReadyIndexHints(
                ready_index,
                store,
                backends.signals,
                self.agents,
                self.id,
                cfg.poll_s,
                self._stopping,
                cfg.route_grace_ms / 1000.0,
            )
        )
        gate = self._claimer.gate if isinstance(self._claimer, TwoStepClaimer) and self._claimer.gate.active else None
        self._gate = gate
        self._claim_loop = ClaimLoop(
            candidates,
            self._claimer,
            self.slots,
            self.health,
            self.held,
            self._obs,
            self.faults,
            cfg,
            self._stopping,
            self._launch,
            after_round=gate.settle if gate is not None else None,
        )
        self._heartbeat = Heartbeat(store, backends.signals, self.id, cfg, self.held, self.health, self._obs, self.quotas)
        # An operator's drain (`tenure drain`, POST /v1/workers/{id}/drain) arrives with a heartbeat reply.
        self._drain_requested = asyncio.Event()
        self._drain_timeout_s: float | None = None
        self._heartbeat.on_drain = self.request_drain
        # The sweeper duty lives in the store's leases table unless other leases are given.
        self._sweeper = SweeperDuty(
            store, leases or backends.leases, self.id, cfg, self._obs, ready_index, artifacts=backends.artifacts
        )

    @property
    def state(self) -> WorkerState:
        """What this worker tells the registry (see health.py)."""
        return self.health.state

    def free_slots(self) -> int:
        """Slots free now (the local fast path's room: control/routing.LocalPath)."""
        return self.slots.available

    def claim_tags(self) -> tuple[str, ...]:
        """What its claims match a job's `requires` against."""
        return self.config.claim_tags

    def info(self) -> WorkerInfo:
        return WorkerInfo(
            id=self.id,
            host=self.host,
            pid=os.getpid(),
            concurrency=self.config.concurrency,
            agents=tuple(self.agents),
            capabilities=tuple(self.config.capabilities),
            state=self.state,
            features=tuple(self.config.features),
            agent_specs=specs_json(self.app.specs()),
        )

    async def register(self) -> None:
        """Enter the registry (its agents with their specs, capabilities, features); `run` does it unless done.
        Raises `StoreUnavailable` when the store does not answer (`tenure worker` then tries again, with
        backoff: control/retry.py `keep_trying`)."""
        await self.store.register_worker(self.info())
        self._registered = True

    async def run(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set, then drain: release unstarted claims at once, let running executions
        finish (up to the drain timeout), and leave the registry."""
        if not self._registered:
            await self.register()
        log.info("worker %s up: %d slots, agents %s", self.id, self.config.concurrency, ", ".join(self.agents))
        async with asyncio.TaskGroup() as loops:
            writer = loops.create_task(keep_running("writer", self.completer.run), name="writer")
            heartbeat = loops.create_task(keep_running("heartbeat", self._heartbeat.run), name="heartbeat")
            sweeper = loops.create_task(keep_running("sweeper", self._sweeper.run), name="sweeper")
            lag_sampler = loops.create_task(self._obs.sampler.run(), name="lag-sampler")
            control = loops.create_task(keep_running("control", self._heartbeat.run_control), name="control")
            quotas = loops.create_task(keep_running("quota", self._heartbeat.run_quotas), name="quota-wakeups")
            # Executions are tasks of their own, not of a task group: the task of a handler that ignores its
            # cancellation outlives its execution (abandoned, worker/execution.py), and must not hold the exit.
            try:
                async with asyncio.TaskGroup() as claiming:
                    claimer = None
                    if await self._warm_up(stop):
                        claimer = claiming.create_task(keep_running("claim", self._claim_loop.run), name="claim-loop")
                        await _either(stop, self._drain_requested)
                    await self._drain(claimer)
            finally:
                for execution in list(self.held.running.values()):  # only when the drain itself did not end
                    if execution.task is not None:
                        execution.task.cancel("worker stopped")
            for task in (sweeper, control, quotas):
                task.cancel()
            await self.completer.close()
            await writer
            heartbeat.cancel()
            lag_sampler.cancel()
        await self._leave()
        if self.warmup_error is not None:
            raise WarmupFailed(f"a warm-up function failed, the worker took no job: {self.warmup_error}")

    async def _warm_up(self, stop: asyncio.Event) -> bool:
        """Run the app's `@app.warmup` functions (heartbeats go on meanwhile; nothing is claimed), then turn
        `active`. False: one raised (the worker leaves without claiming) or the worker was stopped meanwhile."""
        warmups = self.app.warmups
        if not warmups:
            return True
        log.info("warming up: %d warm-up functions", len(warmups))
        began = time.monotonic()
        for fn in warmups:
            try:
                result = await asyncio.to_thread(fn) if not inspect.iscoroutinefunction(fn) else await fn()
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:
                log.error("warm-up %s failed: %s", getattr(fn, "__name__", fn), describe_error(exc))
                self.warmup_error = exc
                return False
            if stop.is_set() or self._drain_requested.is_set():
                return False
        self.health.warmed()
        with contextlib.suppress(StoreUnavailable):
            await self.store.set_worker_state(self.id, self.health.state)
        log.info("warm-up done in %.2f s: claiming", time.monotonic() - began)
        return True

    def request_drain(self, timeout_s: float | None = None) -> None:
        """Drain as a stop would (the same path as SIGTERM), within `timeout_s` (None: TENURE_DRAIN_TIMEOUT_S);
        `run` then returns, and `tenure worker` exits 0. A second request changes nothing."""
        if self._drain_requested.is_set():
            return
        self._drain_timeout_s = timeout_s
        log.info("drain requested through the registry (timeout %s)", "default" if timeout_s is None else f"{timeout_s:g} s")
        self._drain_requested.set()

    async def heartbeat_once(self) -> None:
        """One heartbeat round trip now (renew every held claim, learn of losses and cancel requests)."""
        await self._heartbeat.beat()

    # -- executions ------------------------------------------------------------------------------------------------
    def _launch(self, claim: Claim, started: Started) -> None:
        agent = self.app.get(claim.agent)
        if agent is None:  # claims name only this worker's agents: a defect if it happens
            log.error("job %s of unknown agent %r started; it will be declared lost", claim.fence.job_id, claim.agent)
            self.slots.free()
            return
        execution = Execution(self._env, claim, started, agent, self._ended)
        self.held.running[claim.fence.job_id] = execution
        self._none_running.clear()
        if self.on_claimed is not None:
            self.on_claimed(claim.fence.job_id)
        task = execution.task = asyncio.get_running_loop().create_task(execution.run(), name=f"job-{claim.fence.job_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _ended(self, job_id: str) -> None:
        self.held.ended(job_id)
        if not self.held.running:
            self._none_running.set()
        self.finished += 1
        if self._gate is not None:
            await self._gate.settle()  # its worker-quota slot goes back at once

    def _processes(self) -> ProcessAdapter:
        if self._process_adapter is None:
            cfg = self.config
            self._process_adapter = ProcessAdapter(
                "worker-process", max(1, (os.cpu_count() or 2) - 1), cfg.blocking_max_queued, cfg.blocking_queue_timeout_s
            )
            self._obs.watch_adapter(self._process_adapter)  # tenure_blocking_*{adapter="worker-process"}
        return self._process_adapter

    # -- shutdown ----------------------------------------------------------------------------------------------------
    async def _drain(self, claimer: asyncio.Task[None] | None) -> None:
        self._stopping.set()
        self.health.leave(WorkerState.DRAINING)
        with contextlib.suppress(StoreUnavailable):
            await self.store.set_worker_state(self.id, WorkerState.DRAINING)
        if claimer is not None:
            await claimer
        unstarted = [c.fence for c in self.held.claimed.values()]
        if unstarted:
            with contextlib.suppress(StoreUnavailable):
                released = await self.store.release_claims(self.id, unstarted)
                log.info("drain: released %d unstarted claims", len(released))
            for f in unstarted:
                if self.held.claimed.pop(f.job_id, None) is not None:
                    self.slots.free()
        if self._gate is not None:
            await self._gate.settle()
        if self.held.running:
            timeout_s = self.config.drain_timeout_s if self._drain_timeout_s is None else self._drain_timeout_s
            log.info("drain: waiting up to %.0fs for %d running jobs", timeout_s, len(self.held.running))
            try:
                await asyncio.wait_for(self._none_running.wait(), timeout_s)
            except TimeoutError:
                for execution in list(self.held.running.values()):
                    execution.shut_down()  # each ends within its cancel grace: a handler ignoring it is abandoned
                await self._none_running.wait()

    async def _leave(self) -> None:
        self.health.leave(WorkerState.GONE)
        self._obs.close()
        await self._sweeper.leave()
        with contextlib.suppress(StoreUnavailable):
            await self.store.set_worker_state(self.id, WorkerState.GONE)
        await self._adapter.close(5.0)
        if self._process_adapter is not None:
            await self._process_adapter.close(5.0)
        log.info("worker %s gone after %d jobs", self.id, self.finished)


async def _either(a: asyncio.Event, b: asyncio.Event) -> None:
    """Wait until one of the two events is set."""
    waits = {asyncio.ensure_future(a.wait()), asyncio.ensure_future(b.wait())}
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
