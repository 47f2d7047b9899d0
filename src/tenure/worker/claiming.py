"""The claim loop: take slots, learn what may be claimable, claim, start, launch. One loop, whatever the source.

    candidates  where the loop learns of work: the store's wake-ups (NOTIFY, doorbells, polling) or the Redis
                ready index's hints (seed 003: read at most as many hints as there are free slots, acknowledge a
                hint once its claim succeeded or proved the job gone). The store claim runs either way, so a
                job the index never heard of is still found.
    claimer     `OneStepClaimer`: the claim CAS and the start CAS in one round trip and one commit (through the
                completer, whose pending finishes may ride along); `TwoStepClaimer`: claim, then start, for
                agents with a worker quota (a global slot taken per claim before it is sent) and for
                `claim_mode="two_step"`. The pre-start window exists only there, and so does the `after_claim`
                fault point: fault points are hooks on the path that runs, never a choice of path.

Liveness (`Health`: a lagging loop claims nothing new; a failing claim makes the worker degraded), the
queue-wait and dispatch metrics and the fault points are written once, here, for every source and claimer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from tenure.contracts.errors import ConfigError, QuotaExhausted, QuotaUnavailable, StoreUnavailable
from tenure.contracts.ready import Delivery, ReadyHint, ReadyIndex
from tenure.contracts.states import JobState
from tenure.contracts.store import LeaseRef, Signals, Store
from tenure.contracts.types import Claim, JobFilter, Start, Started, new_id
from tenure.control.quotas import QuotaManager
from tenure.kernel.registry import Tenure
from tenure.worker.completer import Completer
from tenure.worker.config import WorkerConfig
from tenure.worker.faults import Faults
from tenure.worker.health import Health
from tenure.worker.held import Held
from tenure.worker.observe import WorkerObserver
from tenure.worker.slots import Slots

log = logging.getLogger("tenure.worker")

Pair = tuple[Claim, Started | None]


async def wait_any(aw: Awaitable[Any], stop: asyncio.Event, timeout_s: float) -> None:
    """Wait for `aw` or for `stop`, at most `timeout_s` seconds."""
    waiter = asyncio.ensure_future(aw)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({waiter, stopper}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (waiter, stopper):
            t.cancel()
        await asyncio.gather(waiter, stopper, return_exceptions=True)


# -- candidates ----------------------------------------------------------------------------------------------------
class Candidates(Protocol):
    """Where the claim loop learns of work."""

    async def next(self, free: int, idle: bool) -> list[Delivery]:
        """Before a claim of up to `free` jobs: wait for work when the last claim found none (`idle`), and
        return the hints taken for this claim (acknowledged by `done`)."""
        ...

    async def done(self, deliveries: list[Delivery], claimed: set[str]) -> None:
        """After the claim: settle the hints (those claimed, or naming a job no longer claimable)."""
        ...


# A wake-up's job may be another worker's for its routing grace (docs/routing.md): a claim after a wake-up that
# found nothing is tried again this long after the grace, not a whole poll interval later.
RECHECK_MARGIN_S = 0.01


class StoreWakeups:
    """Candidates from the store's own wake-ups (its `Signals`): NOTIFY on PostgreSQL, doorbells and
    `data_version` on SQLite (the poll interval is the floor). `recheck_s` (the routing grace): after a
    wake-up whose claim found nothing, the next wait is at most that long, so a job skipped because another
    worker was preferred for it is claimed here once the grace ends if that worker has not (0: off)."""

    def __init__(self, signals: Signals, poll_s: float, stop: asyncio.Event, recheck_s: float = 0.0) -> None:
        self._signals = signals
        self._poll_s = poll_s
        self._stop = stop
        self._recheck_s = recheck_s + RECHECK_MARGIN_S if recheck_s > 0 else 0.0
        self._woken = False  # the last wait ended by a wake-up, not its timeout

    async def next(self, free: int, idle: bool) -> list[Delivery]:
        if idle:
            timeout = min(self._poll_s, self._recheck_s) if self._woken and self._recheck_s else self._poll_s
            loop = asyncio.get_running_loop()
            began = loop.time()
            await wait_any(self._signals.wait_for_jobs(timeout), self._stop, timeout)
            self._woken = loop.time() - began < timeout
        return []

    async def done(self, deliveries: list[Delivery], claimed: set[str]) -> None:
        return None


# A read of the ready index that has not answered this long after its blocking time is a failed one: a
# partition makes no error, only a read that waits for its socket timeout (5-10 s) while the store goes unpolled.
INDEX_GRACE_S = 1.0
# While reads keep failing, the store alone is polled for longer each time (doubling from a second up to this),
# so that a partition costs one bounded wait per period instead of most of the time.
INDEX_RETRY_MAX_S = 30.0


class ReadyIndexHints:
    """Candidates from the Redis ready index, with the store's wake-ups as the floor while it is down."""

    def __init__(self, index: ReadyIndex, store: Store, signals: Signals, agents: Sequence[str], worker_id: str,
                 poll_s: float, stop: asyncio.Event, recheck_s: float = 0.0) -> None:  # fmt: skip
        self._index = index
        self._store = store
        self._agents = list(agents)
        self._worker_id = worker_id
        self._poll_s = poll_s
        # A hint taken here whose job stayed claimable (preferred to another worker for its grace): the next
        # read blocks at most this long, and the store claim that follows takes the job if its grace ended.
        self._recheck_s = recheck_s + RECHECK_MARGIN_S if recheck_s > 0 else 0.0
        self._recheck = False
        self._fallback = StoreWakeups(signals, poll_s, stop, recheck_s)
        self._down_until = 0.0
        self._failures = 0  # reads of the index failed in a row

    async def next(self, free: int, idle: bool) -> list[Delivery]:
        loop = asyncio.get_running_loop()
        if loop.time() >= self._down_until:
            try:
                if self._index.rebuild_needed:
                    await rebuild_ready_index(self._index, self._store, self._agents)
                # Blocks up to the poll interval for hints: the wait for work when idle.
                block_s = min(self._poll_s, self._recheck_s) if self._recheck else self._poll_s
                self._recheck = False
                async with asyncio.timeout(block_s + INDEX_GRACE_S):
                    taken = await self._index.take(self._worker_id, self._agents, free, block_s)
                self._failures = 0
                return taken
            except (StoreUnavailable, TimeoutError) as exc:
                self._failures += 1
                retry_s = min(INDEX_RETRY_MAX_S, max(1.0, self._poll_s) * 2 ** min(self._failures - 1, 10))
                why = str(exc) or f"no answer within {self._poll_s + INDEX_GRACE_S:g} s"
                log.warning("ready index unavailable, polling the store for %g s: %s", retry_s, why)
                self._down_until = loop.time() + retry_s
        return await self._fallback.next(free, idle)

    async def done(self, deliveries: list[Delivery], claimed: set[str]) -> None:
        """Acknowledge the hints whose job this worker claimed, or which no longer name a claimable job. A hint
        of a job still claimable (claimed by nobody yet) stays pending for another consumer."""
        if not deliveries:
            return
        acked = []
        for d in deliveries:
            if d.job_id in claimed:
                acked.append(d)
                continue
            try:
                job = await self._store.get_job(d.job_id)
            except StoreUnavailable:
                continue
            if job is None or job.state is not JobState.QUEUED or job.owner is not None or job.key_wait:
                acked.append(d)  # (a job waiting for its key's turn is found by the store's claim when its turn comes)
            else:
                self._recheck = self._recheck_s > 0  # likely another worker's grace: claim again when it ends
        with contextlib.suppress(StoreUnavailable):
            await self._index.ack(acked)


HINT_PUBLISH_TIMEOUT_S = 2.0
"""The longest the sweeper waits to publish the hints of one sweep (they are an accelerator: polling finds the
jobs anyway)."""


async def hint_ready(index: ReadyIndex | None, store: Store, job_ids: Sequence[str]) -> None:
    """Tell the ready index about jobs that became claimable (released, requeued, due)."""
    if index is None or not job_ids:
        return
    hints = []
    for job_id in job_ids:
        with contextlib.suppress(StoreUnavailable):
            job = await store.get_job(job_id)
            if job is not None and job.state is JobState.QUEUED:
                hints.append(ReadyHint(job.id, job.agent, job.priority))
    # Bounded: the sweeper publishes these between two sweeps, and a partitioned Redis answers nothing at all.
    with contextlib.suppress(StoreUnavailable, TimeoutError):
        async with asyncio.timeout(HINT_PUBLISH_TIMEOUT_S):
            await index.publish(hints)


async def rebuild_ready_index(index: ReadyIndex, store: Store, agents: Sequence[str]) -> None:
    """The index was lost (or is new): re-publish every queued, unowned job of these agents from the store, the
    truth. Duplicates are harmless: a hint of a job already claimed is acknowledged."""
    index.rebuild_needed = False
    hints: list[ReadyHint] = []
    before = None
    while True:
        page = await store.list_jobs(JobFilter(state=JobState.QUEUED, before=before, limit=500))
        hints += [
            ReadyHint(j.id, j.agent, j.priority) for j in page if j.owner is None and not j.key_wait and j.agent in agents
        ]
        if len(page) < 500:
            break
        before = page[-1].id
    # Pages come newest first; publish oldest first, the order in which the store claim takes them.
    hints.reverse()
    for i in range(0, len(hints), 500):
        await index.publish(hints[i : i + 500])
    log.info("ready index rebuilt from the store: %d hints", len(hints))


# -- claimers ------------------------------------------------------------------------------------------------------
class Claimer(Protocol):
    """Claims (and starts) up to `free` jobs. `registers`: its claims sit in `Held.claimed` until started.
    `carries_finishes`: its claim goes through the completer, which may hand it the pending finishes."""

    registers: bool
    carries_finishes: bool

    async def claim(self, free: int) -> list[Pair]:
        """Claim up to `free` jobs, taking a slot for each; return each claim with its start (None: the start
        CAS matched nothing)."""
        ...


class OneStepClaimer:
    """The claim CAS and the start CAS in one round trip and one commit."""

    registers = False
    carries_finishes = True  # through the completer's claim_and_start (finish_and_claim where the store can)

    def __init__(self, completer: Completer, config: WorkerConfig, agents: Sequence[str], slots: Slots,
                 observer: WorkerObserver) -> None:  # fmt: skip
        self._completer = completer
        self._config = config
        self._agents = list(agents)
        self._tags = config.claim_tags
        self._slots = slots
        self._obs = observer

    async def claim(self, free: int) -> list[Pair]:
        cfg = self._config
        pairs = await self._completer.claim_and_start(self._agents, self._tags, free, cfg.claim_ttl_s)
        if pairs:
            self._slots.take(len(pairs))
            self._obs.claimed([c for c, _ in pairs])
        return list(pairs)


class TwoStepClaimer:
    """Claim, then start: the claims wait in `Held.claimed` (renewed by the heartbeat) across the `after_claim`
    fault point. Jobs of agents with a worker quota are claimed only for slots of it taken first (wait=False:
    a worker never claims and then waits for a slot); each slot is held for the whole execution."""

    registers = True
    carries_finishes = False

    def __init__(self, store: Store, app: Tenure, config: WorkerConfig, worker_id: str, slots: Slots, held: Held,
                 observer: WorkerObserver, faults: Faults, quotas: QuotaManager | None,
                 stop: asyncio.Event) -> None:  # fmt: skip
        self._store = store
        self._config = config
        self._worker_id = worker_id
        self._slots = slots
        self._held = held
        self._obs = observer
        self._faults = faults
        self._stop = stop
        self.gate = WorkerQuotaGate(app, quotas, worker_id, held)

    async def claim(self, free: int) -> list[Pair]:
        cfg = self._config
        claims = await self.gate.claim(self._store, cfg.claim_tags, free, cfg.claim_ttl_s)
        if not claims:
            return []
        self._slots.take(len(claims))
        self._obs.claimed(claims)
        for c in claims:
            self._held.claimed[c.fence.job_id] = c
        await self._faults.hit("after_claim", {c.agent for c in claims}, self._stop)
        if self._stop.is_set():
            return []  # draining: these claims stay unstarted and the drain releases them
        starts = [Start(c.fence, new_id()) for c in claims]
        try:
            started = await self._store.start(self._worker_id, starts)
        except StoreUnavailable as exc:
            # Unknown whether the start committed: treat these claims as lost to us. If they did start, the
            # sweeper will find them unrenewed and mark them lost; if not, it releases them.
            log.warning("start failed, giving up %d claims: %s", len(claims), exc)
            started = []
        by_job = {s.fence.job_id: s for s in started}
        return [(c, by_job.get(c.fence.job_id)) for c in claims]


class WorkerQuotaGate:
    """The worker-quota half of the two-step claim: agents declaring `worker_quota=` are claimed only for
    slots of that global quota taken first; a slot lost at renewal stops its execution, like a lost claim."""

    def __init__(self, app: Tenure, quotas: QuotaManager | None, worker_id: str, held: Held) -> None:
        self._quotas = quotas
        self._worker_id = worker_id
        self._held = held
        self._by_key: dict[str, list[str]] = {}
        for name, agent in sorted(app.agents.items()):
            if agent.spec.worker_quota is not None:
                self._by_key.setdefault(agent.spec.worker_quota, []).append(name)
        self._plain = [a for a in sorted(app.agents) if app.agents[a].spec.worker_quota is None]
        self._slots: dict[str, LeaseRef] = {}  # job id → the worker-quota slot held for it
        self._seq = 0
        for key in self._by_key:
            if quotas is None:
                raise ConfigError(f"worker quota {key!r} needs a quota backend")
            quotas.spec(key)  # an unconfigured worker quota is a start-up error

    @property
    def active(self) -> bool:
        """Whether any agent of this worker has a worker quota."""
        return bool(self._by_key)

    async def claim(self, store: Store, capabilities: Sequence[str], free: int, ttl_s: float) -> list[Claim]:
        claims: list[Claim] = []
        if self._plain:
            claims = await store.claim(self._worker_id, self._plain, capabilities, free, ttl_s)
        for key, agents in self._by_key.items():
            left = free - len(claims)
            if left <= 0:
                break
            slots = await self._reserve(key, left)
            if not slots:
                continue
            got: list[Claim] = []
            try:
                got = await store.claim(self._worker_id, agents, capabilities, len(slots), ttl_s)
            except StoreUnavailable as exc:
                if not claims:
                    raise
                log.warning("claim failed: %s", exc)  # keep the claims already made
            finally:
                for ref in slots[len(got) :]:
                    await self._release(ref)
            for c, ref in zip(got, slots, strict=False):
                self._slots[c.fence.job_id] = ref
                self._track(c.fence.job_id, ref)
            claims.extend(got)
        return claims

    async def settle(self) -> None:
        """Give back the slots of jobs this worker no longer holds (start failed, lost, ended)."""
        held = self._held
        for job_id in [j for j in self._slots if j not in held.claimed and j not in held.running]:
            await self._release(self._slots.pop(job_id))

    async def _reserve(self, key: str, count: int) -> list[LeaseRef]:
        quotas = self._quotas
        assert quotas is not None
        spec = quotas.spec(key)
        slots: list[LeaseRef] = []
        for _ in range(count):
            self._seq += 1
            ref = LeaseRef(key, f"{self._worker_id}:slot:{self._seq}")
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

    def _track(self, job_id: str, ref: LeaseRef) -> None:
        if ref.holder and self._quotas is not None:
            self._quotas._track(ref, lambda: self._held.lose(job_id))

    async def _release(self, ref: LeaseRef) -> None:
        if ref.holder and self._quotas is not None:
            with contextlib.suppress(Exception):
                await self._quotas.release(ref)


# -- the loop ------------------------------------------------------------------------------------------------------
class ClaimLoop:
    """Claim while there are free slots and the worker may claim; launch what started."""

    def __init__(self, candidates: Candidates, claimer: Claimer, slots: Slots, health: Health, held: Held,
                 observer: WorkerObserver, faults: Faults, config: WorkerConfig, stop: asyncio.Event,
                 launch: Callable[[Claim, Started], None],
                 after_round: Callable[[], Awaitable[None]] | None = None) -> None:  # fmt: skip
        self._candidates = candidates
        self._obs = observer
        self._claimer = claimer
        self._slots = slots
        self._health = health
        self._held = held
        self._faults = faults
        self._config = config
        self._stop = stop
        self._launch = launch
        self._after_round = after_round
        self._idle = False  # the last claim found nothing
        self._waiting_for_slot = False
        self._claimer_carries = claimer.carries_finishes

    def claims_soon(self) -> bool:
        """Will the next step claim? It waits for a slot, one is free now, its last claim found work, and its
        claimer carries finishes. The completer then leaves its pending finishes to that claim, which writes
        them in its own commit (`finish_and_claim`) instead of a commit of their own: the slots those finishes
        freed are what woke the claim, and it is a few loop steps behind the completer."""
        return (
            self._waiting_for_slot
            and not self._idle
            and self._claimer_carries
            and self._slots.available > 0
            and self._health.may_claim()
        )

    async def run(self) -> None:
        cfg, stop = self._config, self._stop
        while not stop.is_set():
            self._health.check()
            free = self._slots.available
            if free <= 0 or not self._health.may_claim():
                self._waiting_for_slot = free <= 0
                try:
                    await wait_any(self._slots.freed(), stop, cfg.poll_s)
                finally:
                    self._waiting_for_slot = False
                continue
            idle = self._idle
            deliveries = await self._candidates.next(free, idle)
            if stop.is_set():
                return  # hints taken now stay pending and are handed over after the claim TTL
            try:
                pairs = await self._claimer.claim(free)
            except StoreUnavailable as exc:
                # A claim_and_start that committed before the error left running jobs nobody renews: the
                # sweeper marks them lost after the claim TTL, as after a failed start.
                self._health.claim_failed(exc)
                failures = self._health.claim_failures
                delay = min(cfg.poll_s * 2 ** min(failures - 1, 10), max(cfg.poll_s, 5.0))
                await wait_any(stop.wait(), stop, delay)
                continue
            self._health.claim_worked()
            await self._candidates.done(deliveries, {c.fence.job_id for c, _ in pairs})
            self._idle = not pairs
            if pairs:
                self._start(pairs)
                if any(s is not None for _, s in pairs):
                    await self._faults.hit("after_start", {c.agent for c, _ in pairs})
                # Let the handlers just spawned take their first step before the next claim is sent: they
                # start now, not after another round trip has been prepared and written. (The next claim may
                # not wait for a wake-up instead: a claim returns fewer jobs than asked whenever a concurrent
                # claim held or had just updated some of its candidates, with more still queued.)
                await asyncio.sleep(0)
            if self._after_round is not None:
                await self._after_round()

    def _start(self, pairs: list[Pair]) -> None:
        """Launch the execution of every claim whose start matched; free the slots of the others."""
        registers = self._claimer.registers
        for c, s in pairs:
            # A registered claim given up meanwhile (heartbeat said lost, self-fencing) already freed its slot.
            still_held = self._held.claimed.pop(c.fence.job_id, None) is not None if registers else True
            self._obs.started(c, s)
            if s is None:
                log.warning(
                    "start CAS for job %s (epoch %d) matched no row: the claim was lost, or the job cancelled, "
                    "before it started",
                    c.fence.job_id,
                    c.fence.epoch,
                )
                if still_held:
                    self._slots.free()
                continue
            if not still_held:
                self._slots.take()  # given up too early: the start CAS matched, so the job is ours after all
            self._launch(c, s)
