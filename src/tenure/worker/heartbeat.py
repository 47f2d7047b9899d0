"""The heartbeat and the control fast path of one worker.

heartbeat   one round trip per interval renews every held claim and reports the worker's state; its reply
            says which claims are no longer this worker's and which jobs have a cancel request. Sent from
            the loop, never from a thread, so a frozen loop cannot fake being alive; it measures how late the
            loop let it go. No renewal for a whole claim TTL: others may own these jobs now, so the worker
            stops them all itself (self-fencing), from a loop timer rather than from this task: a worker
            frozen (SIGSTOP, a VM pause) or starved past the TTL resumes its handlers' tasks before this one,
            and a handler's next step may be a side effect; the timer's callback runs first.
quotas      the heartbeat's quota half, on the same interval but its own task, so that a slow store round
            trip never delays the renewal of quota leases (one renewed late is lost, its slot handed on).
control     cancel requests and commands as soon as the store hints at them (NOTIFY, a doorbell, Redis);
            the heartbeat reply stays the floor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from tenure.contracts.errors import StoreUnavailable
from tenure.contracts.store import Signals, Store
from tenure.control.quotas import QuotaManager
from tenure.worker.config import WorkerConfig
from tenure.worker.health import Health
from tenure.worker.held import Held
from tenure.worker.observe import WorkerObserver

log = logging.getLogger("tenure.worker")


class Heartbeat:
    """The heartbeat, quota-renewal and control loops of one worker (children of its task group)."""

    def __init__(self, store: Store, signals: Signals, worker_id: str, config: WorkerConfig, held: Held,
                 health: Health, observer: WorkerObserver, quotas: QuotaManager | None) -> None:  # fmt: skip
        self._store = store
        self._signals = signals
        self._worker_id = worker_id
        self._config = config
        self._held = held
        self._health = health
        self._obs = observer
        self._quotas = quotas
        self._last_renewed = time.monotonic()
        self._fence: asyncio.TimerHandle | None = None
        self._fenced_after = -1.0  # the last renewal after which this worker fenced itself (logged once)
        self.on_drain: Callable[[float | None], None] | None = None
        """Called with the drain timeout when a heartbeat reply carries an operator's drain request."""

    async def run(self) -> None:
        """The heartbeat loop. Self-fencing rides a loop timer beside it (see `_fence_lapsed`)."""
        cfg = self._config
        loop = asyncio.get_running_loop()
        self._last_renewed = time.monotonic()
        self._arm_fence()
        try:
            while True:
                due = loop.time() + cfg.heartbeat_s
                await asyncio.sleep(cfg.heartbeat_s)
                self._obs.heartbeat_sent(max(0.0, loop.time() - due), len(self._held))
                await self.beat()
        finally:
            if self._fence is not None:
                self._fence.cancel()

    def _arm_fence(self, delay_s: float | None = None) -> None:
        """Stop every held job when its claim may have expired on the server: at (last renewal sent) + TTL, or
        `delay_s` from now."""
        if self._fence is not None:
            self._fence.cancel()
        left = self._last_renewed + self._config.claim_ttl_s - time.monotonic() if delay_s is None else delay_s
        self._fence = asyncio.get_running_loop().call_later(max(0.0, left), self._fence_lapsed)

    def _fence_lapsed(self) -> None:
        """No renewal for a whole TTL: others may own these jobs now. Stop everything (self-fencing).

        A loop callback, not a task, and independent of the heartbeat's own round trip:
        - after a freeze (SIGSTOP, a starved process) the loop runs it in the iteration that resumes, before the
          steps of the tasks it wakes (those run in the next one), so every handler is cancelled before its next
          line (measured before, bench/chaos.py seed 1616: side effects of lost jobs 0.7-1.5 s after the sweeper
          had declared them lost);
        - a pulled cable makes no error: the heartbeat's round trip waits as long as TCP retransmits (minutes),
          and cancelling it would not help (asyncpg then waits for its cancel request, sent over the same dead
          network), so the fence cannot wait for the round trip to fail.
        While the silence lasts it fires again every heartbeat interval, for what was claimed meanwhile."""
        self._fence = None
        silent_s = time.monotonic() - self._last_renewed
        if silent_s < self._config.claim_ttl_s:
            self._arm_fence()
            return
        fences = self._held.fences()
        if fences and self._fenced_after != self._last_renewed:
            self._fenced_after = self._last_renewed
            log.warning(
                "no heartbeat got through for %.1f s (claim TTL %g s): stopping the %d jobs this worker holds",
                silent_s,
                self._config.claim_ttl_s,
                len(fences),
            )
        for f in fences:
            self._held.lose(f.job_id)
        self._arm_fence(self._config.heartbeat_s)

    async def beat(self) -> None:
        """One heartbeat round trip: renew every held claim, learn of losses and cancel requests."""
        cfg, held = self._config, self._held
        state = self._health.check()
        fences = held.fences()
        sent = time.monotonic()
        try:
            reply = await self._store.heartbeat(
                self._worker_id, state, len(held.running), fences, cfg.claim_ttl_s, self._obs.record.snapshot()
            )
        except StoreUnavailable as exc:
            self._obs.record.resend()  # the next heartbeat carries the record this one did not deliver
            log.warning("heartbeat failed: %s", exc)
            return  # the fence's timer stops everything once a whole TTL passed without a renewal
        self._last_renewed = sent
        self._arm_fence()
        for f in reply.lost(fences):
            if held.holds(f):
                held.lose(f.job_id)
        for job_id in reply.cancel_requested:
            held.cancel(job_id)
        if reply.drain and self.on_drain is not None:
            self.on_drain(reply.drain_timeout_s)

    async def run_quotas(self) -> None:
        """Renew every quota lease of this process in one round trip per interval (a lost one cancels its
        holding block), and export the quota gauges; the quota manager's own wake-ups run beside it."""
        quotas = self._quotas
        if quotas is None:
            return
        async with asyncio.TaskGroup() as tg:
            tg.create_task(quotas.run(), name="quota-listener")
            tg.create_task(self._renew_quotas(quotas), name="quota-heartbeat")

    async def _renew_quotas(self, quotas: QuotaManager) -> None:
        while True:
            await asyncio.sleep(self._config.heartbeat_s)
            await quotas.renew()
            await self._export_quotas(quotas)
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # A cancellation absorbed by the Redis driver mid-renewal must still stop this loop.
                raise asyncio.CancelledError

    async def _export_quotas(self, quotas: QuotaManager) -> None:
        """tenure_quota_in_use / _limit / _rejected_total / _fail_open_total for every configured quota (one
        read per key)."""
        in_use: dict[str, int] = {}
        # Bounded by one interval: the refusals and fail-open admissions counted here are what an operator needs
        # while the lease backend is down, and a partitioned one fails each read only after its timeouts.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._config.heartbeat_s):
                for key in quotas.specs:
                    try:
                        in_use[key] = len(await quotas.leases.holders(key))
                    except StoreUnavailable:  # LeasesUnavailable too: the gauge keeps its last value
                        continue
        self._obs.quotas_seen(
            in_use, {k: spec.limit for k, spec in quotas.specs.items()}, quotas.rejections, quotas.fail_open_admitted
        )

    async def run_control(self) -> None:
        """Act on cancel requests and new commands as soon as the store hints at them."""
        held, poll_s = self._held, self._config.poll_s
        while True:
            try:
                hint = await self._signals.wait_for_control(poll_s)
                if hint is not None and not hint:
                    continue
                ids = [j for j in held.running if hint is None or j in hint]
                if not ids:
                    continue
                cancels, seqs = await self._store.control_state(ids)
            except StoreUnavailable as exc:
                log.warning("control hints unavailable, heartbeats deliver commands meanwhile: %s", exc)
                await asyncio.sleep(poll_s)
                continue
            for job_id in cancels:
                held.cancel(job_id)
            for job_id, seq in seqs.items():
                execution = held.running.get(job_id)
                if execution is not None:
                    execution.command_arrived(seq)
