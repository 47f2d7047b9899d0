"""What a worker measures about itself: loop lag, lag-aware liveness, heartbeat lateness, job intervals.

Kept apart from `worker.py` so that file only calls a few hooks (`claimed`, `started`, `first_event`,
`finished`, ...). One `WorkerObserver` per worker incarnation:

* a `LagSampler` (kernel) run as a child of the worker's task group, exported as `event_loop_lag_seconds`,
  `event_loop_lag_max_seconds` and `tenure_loop_stalls_total` with `role="worker"` and the worker id;
* **lag-aware liveness**: when the lag has stayed above `degraded_lag_s` for `degraded_for_s` (a frozen
  loop, or one that is late tick after tick), the worker turns `degraded`: it claims nothing new, keeps
  and renews its claims, and says so in every heartbeat. It becomes `active` again once the lag has stayed
  under the threshold for `degraded_for_s`. Blocked is not dead: nobody takes its jobs for being slow;
  only a claim TTL without a heartbeat does that (the sweeper);
* the heartbeat's own lateness (scheduled vs actual send time, on the loop's clock): a heartbeat sent from
  a thread could claim liveness for a frozen loop, so it is sent from the loop, and it measures how late
  the loop let it go.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tenure.contracts.reports import StoreHealth
from tenure.contracts.states import JobState, WorkerState
from tenure.contracts.types import Claim, JobCounts, Started, SweepReport, WorkerInfo
from tenure.kernel.blocking import BlockingAdapter, ProcessAdapter
from tenure.kernel.lag import LagSampler
from tenure.observability import metrics as m
from tenure.worker.record import Record

log = logging.getLogger("tenure.worker")

ROLE = "worker"
LOST_WINDOW_S = 600.0


class WorkerObserver:
    """Metrics and liveness of one worker. Every method runs on the worker's loop unless said otherwise."""

    def __init__(
        self,
        worker_id: str,
        *,
        heartbeat_s: float,
        lag_interval_s: float,
        stall_threshold_s: float,
        degraded_lag_s: float,
        degraded_for_s: float,
    ) -> None:
        self.worker_id = worker_id
        self.record = Record()
        """Its own record (worker/record.py), sent with each heartbeat."""
        self.heartbeat_s = heartbeat_s
        self.degraded_lag_s = degraded_lag_s
        self.degraded_for_s = degraded_for_s
        self.sampler = LagSampler(
            interval_s=lag_interval_s,
            threshold_s=stall_threshold_s,
            window_s=max(10.0, 2 * degraded_for_s),
            on_sample=self._on_lag_sample,
            on_stall=m.stall_recorder(ROLE, worker_id),
        )
        self._observe_lag = m.lag_sample_recorder(ROLE, worker_id)
        # (when, lag) of the samples later than `degraded_lag_s`, for `late_share`.
        self._late_samples: collections.deque[tuple[float, float]] = collections.deque()
        self._unwatch = [m.watch_lag(self.sampler, ROLE, worker_id)]
        self._hb_lateness = m.HEARTBEAT_LATENESS.labels(worker_id)
        self._hb_late = m.HEARTBEATS_LATE.labels(worker_id)
        self._claim_failures = m.CLAIM_FAILURES.labels(worker_id)
        self._sweeps = m.SWEEPS.labels(worker_id)
        self._claimed_at: dict[str, float | None] = {}
        self._started_mono: dict[str, float] = {}
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}  # the per-job metrics' labelled children
        self._shown_state: WorkerState | None = None
        self._tenants_seen: set[str] = set()
        self._health_tables: set[str] = set()
        self._lost_workers: collections.deque[float] = collections.deque()
        self._quota_rejections_seen: dict[tuple[str, str], int] = {}
        self._quota_fail_open_seen: dict[str, int] = {}

    def quotas_seen(
        self,
        in_use: Mapping[str, int],
        limits: Mapping[str, int],
        rejections: Mapping[tuple[str, str], int],
        fail_open: Mapping[str, int],
    ) -> None:
        """Export the quotas this worker uses: slots held fleet-wide (read from the lease backend), limits, this
        process's refusals by reason and its blocks let through unleased (fail-open) — running totals, turned
        into counter increments."""
        for key, n in in_use.items():
            m.QUOTA_IN_USE.labels(key).set(n)
        for key, n in limits.items():
            m.QUOTA_LIMIT.labels(key).set(n)
        for (key, reason), total in rejections.items():
            delta = total - self._quota_rejections_seen.get((key, reason), 0)
            if delta > 0:
                m.QUOTA_REJECTED.labels(key, reason).inc(delta)
                self._quota_rejections_seen[(key, reason)] = total
        for key, total in fail_open.items():
            delta = total - self._quota_fail_open_seen.get(key, 0)
            if delta > 0:
                m.QUOTA_FAIL_OPEN.labels(key).inc(delta)
                self._quota_fail_open_seen[key] = total

    def watch_adapter(self, adapter: BlockingAdapter | ProcessAdapter) -> None:
        """Export an adapter of this worker as `tenure_blocking_*{adapter, role, worker}`."""
        self._unwatch.append(m.watch_adapter(adapter, ROLE, self.worker_id))

    def close(self) -> None:
        for unwatch in self._unwatch:
            unwatch()
        self._unwatch.clear()

    # -- liveness --------------------------------------------------------------------------------------------
    def _on_lag_sample(self, lag_s: float) -> None:
        self._observe_lag(lag_s)
        now = time.monotonic()
        if lag_s > self.degraded_lag_s:
            self._late_samples.append((now, lag_s))
        horizon = now - self.degraded_for_s
        while self._late_samples and self._late_samples[0][0] < horizon:
            self._late_samples.popleft()

    def late_share(self) -> float:
        """The share of the last `degraded_for_s` the loop spent in stalls longer than `degraded_lag_s`."""
        horizon = time.monotonic() - self.degraded_for_s
        late = sum(lag for at, lag in self._late_samples if at >= horizon)
        ongoing = self.sampler.current_lag
        if ongoing > self.degraded_lag_s:
            late += ongoing
        return min(1.0, late / self.degraded_for_s)

    def liveness(self, state: WorkerState) -> WorkerState:
        """The state this worker should be in now, given its loop lag (only active ⇄ degraded change here).

        Degraded when the lag stayed above `degraded_lag_s` for `degraded_for_s` — one long stall or late
        tick after late tick — or when stalls longer than `degraded_lag_s` took at least half of the last
        `degraded_for_s` (a loop blocked 0.7 s out of every 0.8 s ticks on time in its short gaps, yet it is
        no healthier). Active again once no tick was later than `degraded_lag_s` for `degraded_for_s`.
        """
        if state is WorkerState.ACTIVE and self.sampler.running:
            if self.sampler.degraded(self.degraded_lag_s, self.degraded_for_s) or self.late_share() >= 0.5:
                log.warning(
                    "event loop lag above %.3f s for %.1f s: worker degraded, claiming nothing new "
                    "(it keeps and renews its claims)",
                    self.degraded_lag_s,
                    self.degraded_for_s,
                    extra={"worker_id": self.worker_id, "state": WorkerState.DEGRADED.value},
                )
                return WorkerState.DEGRADED
        elif state is WorkerState.DEGRADED:
            if self.sampler.max_lag_window(self.degraded_for_s) <= self.degraded_lag_s:
                log.info(
                    "event loop lag under %.3f s for %.1f s: worker active again",
                    self.degraded_lag_s,
                    self.degraded_for_s,
                    extra={"worker_id": self.worker_id, "state": WorkerState.ACTIVE.value},
                )
                return WorkerState.ACTIVE
        return state

    def claim_failed(self) -> None:
        """One claim round trip failed (`tenure_claim_failures_total`)."""
        self._claim_failures.inc()

    def show_state(self, state: WorkerState) -> None:
        """Export this worker's own state as `tenure_worker_state{worker, state}` (1 for the current one)."""
        if state is self._shown_state:
            return
        for s in WorkerState:
            m.WORKER_STATE.labels(self.worker_id, s.value).set(1 if s is state else 0)
        self._shown_state = state

    # -- heartbeat -------------------------------------------------------------------------------------------
    def heartbeat_sent(self, lateness_s: float, held: int) -> None:
        """Record how late a heartbeat went out; log when it is more than half an interval late."""
        self._hb_lateness.observe(lateness_s)
        if lateness_s > self.heartbeat_s / 2:
            self._hb_late.inc()
            log.warning(
                "heartbeat sent %.3f s late (interval %.3f s, %d claims held): the event loop was blocked",
                lateness_s,
                self.heartbeat_s,
                held,
                extra={"worker_id": self.worker_id, "duration_ms": round(lateness_s * 1000, 1)},
            )

    # -- job intervals ---------------------------------------------------------------------------------------
    def _child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, looked up once per label set (the per-job path calls it for every job)."""
        child = self._children.get((metric, labels))
        if child is None:
            child = self._children[(metric, labels)] = metric.labels(*labels)
        return child

    def claimed(self, claims: Sequence[Claim]) -> None:
        """Queue wait (admitted → claimed, database clock) of first attempts; remember the claim time."""
        for c in claims:
            self._claimed_at[c.fence.job_id] = c.claimed_at
            if c.attempts == 0 and c.claimed_at is not None and c.created_at is not None:
                self._child(m.QUEUE_WAIT, c.agent).observe(max(0.0, c.claimed_at - c.created_at))

    def started(self, claim: Claim, started: Started | None) -> None:
        """Dispatch (claimed → started, database clock); start the first-event clock."""
        job_id = claim.fence.job_id
        claimed_at = self._claimed_at.pop(job_id, None)
        if started is None:
            return
        if claimed_at is not None:
            self._child(m.DISPATCH, claim.agent).observe(max(0.0, started.started_at - claimed_at))
        self._started_mono[job_id] = time.monotonic()
        if not log.isEnabledFor(logging.INFO):  # the line's fields are built for nothing otherwise
            return
        log.info(
            "job started",
            extra={
                "job_id": job_id,
                "execution_id": started.execution_id,
                "worker_id": self.worker_id,
                "agent": claim.agent,
                "state": JobState.RUNNING.value,
                "epoch": claim.fence.epoch,
            },
        )

    def first_event(self, job_id: str, agent: str) -> None:
        """Started → first event emitted by the handler (worker clock)."""
        began = self._started_mono.pop(job_id, None)
        if began is not None:
            m.FIRST_EVENT.labels(agent).observe(time.monotonic() - began)

    def external(self, agent: str, kind: str, seconds: float) -> None:
        """One model or tool call, timed by `ctx.external(kind)`."""
        m.EXTERNAL.labels(agent, kind).observe(seconds)

    def soft_timed_out(self, claim: Claim, execution_id: str, elapsed_s: float, threshold_s: float) -> None:
        """An execution ran past its soft timeout and goes on: one line and `tenure_soft_timeouts_total{agent}`."""
        m.SOFT_TIMEOUTS.labels(claim.agent).inc()
        log.warning(
            "job %s still running after %.3f s, past its soft timeout of %.3f s (not interrupted)",
            claim.fence.job_id,
            elapsed_s,
            threshold_s,
            extra={
                "job_id": claim.fence.job_id,
                "execution_id": execution_id,
                "worker_id": self.worker_id,
                "agent": claim.agent,
                "epoch": claim.fence.epoch,
                "elapsed_s": round(elapsed_s, 3),
                "threshold_s": round(threshold_s, 3),
            },
        )

    def timed_out(self) -> None:
        """An execution ran past its hard timeout (its finish follows): its worker's record counts it now."""
        self.record.timed_out()

    def finished(
        self,
        claim: Claim,
        execution_id: str,
        state: JobState,
        error_code: str | None,
        duration_s: float,
        matched: bool,
        timed: bool = True,
    ) -> None:
        """One line and the counters for an execution's end (`state` SCHEDULED means a retry). `timed` False:
        it paused (waiting on a person or on children), so its duration judges no later run's timeouts."""
        job_id = claim.fence.job_id
        self._started_mono.pop(job_id, None)

        def line(level: int, msg: str, *args: object) -> None:  # its fields built only for a line written
            if log.isEnabledFor(level):
                fields = {
                    "job_id": job_id,
                    "execution_id": execution_id,
                    "worker_id": self.worker_id,
                    "agent": claim.agent,
                    "state": state.value if matched else JobState.LOST.value,
                    "epoch": claim.fence.epoch,
                    "duration_ms": round(duration_s * 1000, 1),
                    "error_code": error_code,
                }
                log.log(level, msg, *args, extra=fields)

        if not matched:
            line(logging.WARNING, "job finish not recorded: ownership was lost")
            return
        self.record.finished(state, error_code, duration_s, claim.agent if timed else None)
        if state is JobState.SCHEDULED:
            m.RETRIES.labels(claim.agent).inc()
            line(logging.INFO, "job failed, retry scheduled")
            return
        self._child(m.JOBS_FINISHED, claim.agent, state.value).inc()
        if state is JobState.DEAD:
            m.JOBS_DEAD.labels(claim.agent).inc()
        line(logging.INFO if state is JobState.SUCCEEDED else logging.WARNING, "job %s", state.value)

    def lost(self, claim: Claim, execution_id: str | None) -> None:
        """This worker learned that it no longer owns a job."""
        self._started_mono.pop(claim.fence.job_id, None)
        self._claimed_at.pop(claim.fence.job_id, None)
        log.warning(
            "job ownership lost: execution stopped",
            extra={
                "job_id": claim.fence.job_id,
                "execution_id": execution_id,
                "worker_id": self.worker_id,
                "agent": claim.agent,
                "state": JobState.LOST.value,
                "epoch": claim.fence.epoch,
                "error_code": "owner_lost",
            },
        )

    # -- sweeper duty (only the holder of the sweeper lease exports store-wide numbers) --------------------
    def swept(self, report: SweepReport) -> None:
        self._sweeps.inc()
        for job_id in report.lost:
            m.JOBS_LOST.inc()
            m.JOBS_FINISHED.labels("", JobState.LOST.value).inc()
            log.warning(
                "job lost: its owner stopped renewing the claim",
                extra={
                    "job_id": job_id,
                    "state": JobState.LOST.value,
                    "error_code": "owner_lost",
                },
            )
        for job_id in report.dead:
            m.JOBS_FINISHED.labels("", JobState.DEAD.value).inc()
            log.warning(
                "job dead: owner lost on its last attempt",
                extra={
                    "job_id": job_id,
                    "state": JobState.DEAD.value,
                    "error_code": "owner_lost",
                },
            )
        for worker_id in report.workers_gone:
            self._lost_workers.append(time.monotonic())
            m.WORKERS_LOST.inc()
            log.warning(
                "worker lost: no heartbeat for two claim TTLs",
                extra={
                    "worker_id": worker_id,
                    "state": WorkerState.GONE.value,
                },
            )
        for job_id in report.expired:
            m.JOBS_FINISHED.labels("", JobState.EXPIRED.value).inc()
            log.info(
                "job expired before it started",
                extra={
                    "job_id": job_id,
                    "state": JobState.EXPIRED.value,
                    "error_code": "deadline_exceeded",
                },
            )

    def jobs_seen(self, counts: JobCounts) -> None:
        """Export `tenure_jobs{state}` (unfinished states) and `tenure_queue_depth{scope}` (the ready queue:
        `global` and one scope per tenant) from the store (sweeper holder only)."""
        for state in (JobState.QUEUED, JobState.SCHEDULED, JobState.RUNNING, JobState.WAITING):
            m.JOBS.labels(state.value).set(counts.by_state.get(state.value, 0))
        m.QUEUE_DEPTH.labels("global").set(counts.ready)
        for tenant in self._tenants_seen - set(counts.ready_by_tenant):
            m.QUEUE_DEPTH.labels(tenant).set(0)
        for tenant, n in counts.ready_by_tenant.items():
            m.QUEUE_DEPTH.labels(tenant).set(n)
        self._tenants_seen |= set(counts.ready_by_tenant)

    def health_seen(self, health: StoreHealth) -> None:
        """Export what holds the store back (sweeper holder only): `tenure_store_oldest_xmin_age_seconds` and, per
        table, `tenure_store_dead_tuples`, `tenure_store_live_tuples`, `tenure_store_table_bytes`."""
        if health.oldest_xmin_age_s is not None:
            m.STORE_XMIN_AGE.set(health.oldest_xmin_age_s)
        for table, n in health.dead_tuples.items():
            m.STORE_DEAD_TUPLES.labels(table).set(n)
        for table, n in health.live_tuples.items():
            m.STORE_LIVE_TUPLES.labels(table).set(n)
        for table, n in health.table_bytes.items():
            m.STORE_TABLE_BYTES.labels(table).set(n)
        self._health_tables |= set(health.table_bytes)

    def health_forgotten(self) -> None:
        """This process lost the sweeper duty: zero what it exported in `health_seen`, so a stale age from the
        former holder cannot keep an alert (on the max across processes) firing."""
        m.STORE_XMIN_AGE.set(0)
        for table in self._health_tables:
            for gauge in (m.STORE_DEAD_TUPLES, m.STORE_LIVE_TUPLES, m.STORE_TABLE_BYTES):
                gauge.labels(table).set(0)

    def registry_seen(self, workers: Sequence[WorkerInfo]) -> None:
        """Export `tenure_workers{state}` (sweeper holder only, so one process says it): live workers by
        state from the registry, and as `gone` the workers *lost* (swept for silence, not drained) in the
        last `LOST_WINDOW_S`. The registry alone cannot tell: a worker that drained and left is `gone`
        too, and counting every past incarnation would make `TenureWorkersLost` fire after each deploy."""
        counts = {s.value: 0 for s in WorkerState}
        for w in workers:
            if w.state is not WorkerState.GONE:
                counts[w.state.value] += 1
        horizon = time.monotonic() - LOST_WINDOW_S
        while self._lost_workers and self._lost_workers[0] < horizon:
            self._lost_workers.popleft()
        counts[WorkerState.GONE.value] = len(self._lost_workers)
        for state, n in counts.items():
            m.WORKERS.labels(state).set(n)
