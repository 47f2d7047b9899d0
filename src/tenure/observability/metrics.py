"""Every Prometheus metric Tenure exports, defined once, for every role (gateway, worker).

The names are a public contract: `deploy/prometheus/alerts.yml` and `deploy/grafana/tenure-dashboard.json`
query them (docs/observability.md lists them all). Metrics live on prometheus_client's default registry, so
`PROMETHEUS_MULTIPROC_DIR` (see `tenure.observability.multiprocess`) turns on multiprocess mode for all of
them at once; gauges carry the `multiprocess_mode` that makes sense when several processes write them.

Two kinds of sources feed them:

* **events**, recorded where they happen (`observe_*`, `count_*` below, or the metric objects directly);
* **state read from other objects** (blocking adapters, the lag sampler): registered with `watch_adapter` /
  `watch_lag` and copied into the metrics by `refresh()`, which runs before every scrape and, in
  multiprocess mode, on a small thread (`start_refresher`). Those objects are meant to be read from any
  thread, so the numbers keep moving while the event loop is frozen (seed 000, pitfall 2).

kernel and control never import this module (layers): they expose plain properties and callbacks.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import Counter, Gauge, Histogram

__all__ = [
    "AdapterStats",
    "LagStats",
    "Watched",
    "refresh",
    "start_refresher",
    "watch_adapter",
    "watch_lag",
]

log = logging.getLogger("tenure.metrics")

# Seed 000's buckets for loop lag; the interval buckets reach further (queue waits and model calls are long).
LAG_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
INTERVAL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

# -- event loop (one curve per process: `role` and `worker` labels; never aggregate across processes) ------
LOOP_LAG = Histogram(
    "event_loop_lag_seconds",
    "How late the event loop's sampler woke up (scheduling debt of the loop)",
    ["role", "worker"],
    buckets=LAG_BUCKETS,
)
LOOP_LAG_MAX = Gauge(
    "event_loop_lag_max_seconds",
    "Max loop lag over the sampler's window, an ongoing stall included",
    ["role", "worker"],
    multiprocess_mode="livemax",
)
LOOP_STALLS = Counter(
    "tenure_loop_stalls_total",
    "Loop stalls longer than the stall threshold (each logged with its stack)",
    ["role", "worker"],
)
HEARTBEAT_LATENESS = Histogram(
    "tenure_heartbeat_lateness_seconds",
    "How much later than scheduled the worker's heartbeat was sent",
    ["worker"],
    buckets=LAG_BUCKETS,
)
HEARTBEATS_LATE = Counter("tenure_heartbeats_late_total", "Heartbeats sent more than half an interval late", ["worker"])
SWEEPS = Counter("tenure_sweeps_total", "Sweeps this worker ran (only while holding the duty:sweeper lease)", ["worker"])
CLAIM_FAILURES = Counter(
    "tenure_claim_failures_total", "Claim round trips that failed (the worker is degraded until one works)", ["worker"]
)
WORKER_STATE = Gauge(
    "tenure_worker_state",
    "1 for this worker's current lifecycle state (active, degraded, draining, gone)",
    ["worker", "state"],
    multiprocess_mode="livemax",
)

# -- the four intervals of a job (seed 000), per agent ---------------------------------------------------
QUEUE_WAIT = Histogram(
    "tenure_queue_wait_seconds",
    "Admitted -> claimed, database clock (first attempt only)",
    ["agent"],
    buckets=INTERVAL_BUCKETS,
)
DISPATCH = Histogram(
    "tenure_dispatch_seconds",
    "Claimed -> started (start CAS committed), database clock",
    ["agent"],
    buckets=INTERVAL_BUCKETS,
)
FIRST_EVENT = Histogram(
    "tenure_first_event_seconds",
    "Started -> the execution's first event, worker clock",
    ["agent"],
    buckets=INTERVAL_BUCKETS,
)
EXTERNAL = Histogram(
    "tenure_external_seconds",
    "Model and tool calls timed with ctx.external(kind)",
    ["agent", "kind"],
    buckets=INTERVAL_BUCKETS,
)

# -- jobs ------------------------------------------------------------------------------------------------
JOBS_FINISHED = Counter(
    "tenure_jobs_finished_total",
    "Jobs reaching a terminal state (agent is empty for jobs the sweeper finished: lost, expired, dead)",
    ["agent", "state"],
)
DEGRADED = Counter(
    "tenure_degraded_total",
    "Jobs admitted degraded: routed to the agent's fallback or run in a lesser mode (docs/scheduling.md)",
    ["agent", "reason"],
)
RETRIES = Counter("tenure_retries_total", "Executions that failed and were scheduled again", ["agent"])
SOFT_TIMEOUTS = Counter(
    "tenure_soft_timeouts_total",
    "Executions that ran past their soft timeout (counted once each; never interrupted; docs/routing.md)",
    ["agent"],
)
JOBS_DEAD = Counter("tenure_jobs_dead_total", "Jobs dead after their last attempt", ["agent"])
JOBS_LOST = Counter("tenure_jobs_lost_total", "Running jobs whose owner stopped renewing its claim (marked by the sweeper)")
JOBS = Gauge("tenure_jobs", "Jobs in the store by state", ["state"], multiprocess_mode="livemax")
STORE_XMIN_AGE = Gauge(
    "tenure_store_oldest_xmin_age_seconds",
    "Age of the oldest transaction holding back vacuum (PostgreSQL's xmin horizon; 0 when none)",
    multiprocess_mode="livemax",
)
STORE_DEAD_TUPLES = Gauge(
    "tenure_store_dead_tuples",
    "Dead rows of a Tenure table (estimate)",
    ["table"],
    multiprocess_mode="livemax",
)
STORE_LIVE_TUPLES = Gauge(
    "tenure_store_live_tuples",
    "Live rows of a Tenure table (estimate)",
    ["table"],
    multiprocess_mode="livemax",
)
STORE_TABLE_BYTES = Gauge(
    "tenure_store_table_bytes", "Bytes on disk of a Tenure table with its indexes", ["table"], multiprocess_mode="livemax"
)
QUEUE_DEPTH = Gauge(
    "tenure_queue_depth",
    "Queued jobs counted in the shared store (scope: global or a tenant)",
    ["scope"],
    multiprocess_mode="livemax",
)
QUEUE_CAPACITY = Gauge(
    "tenure_queue_capacity",
    "The admission cap on queued jobs for the scope",
    ["scope"],
    multiprocess_mode="livemax",
)
WORKERS = Gauge(
    "tenure_workers",
    "Workers by state: live ones from the registry; gone = lost (silent, not drained) in the last 10 min",
    ["state"],
    multiprocess_mode="livemax",
)
WORKERS_LOST = Counter("tenure_workers_lost_total", "Workers the sweeper marked gone because their heartbeats stopped")

# -- quotas and circuit breakers (defined here, fed by the quota and gateway code) --------------------------
QUOTA_IN_USE = Gauge("tenure_quota_in_use", "Lease slots held now for a named quota", ["key"], multiprocess_mode="livemax")
QUOTA_LIMIT = Gauge("tenure_quota_limit", "The limit of a named quota", ["key"], multiprocess_mode="livemax")
QUOTA_REJECTED = Counter(
    "tenure_quota_rejected_total",
    "Quota acquisitions refused (reason: full, timeout, unavailable)",
    ["key", "reason"],
)
QUOTA_FAIL_OPEN = Counter(
    "tenure_quota_fail_open_total",
    "Quota blocks let through without a lease because the lease backend was down (fail-open keys)",
    ["key"],
)
CIRCUIT_STATE = Gauge(
    "tenure_circuit_state",
    "Circuit breaker state: 0 closed, 1 half-open, 2 open",
    ["scope"],
    multiprocess_mode="livemax",
)

# -- blocking adapters (read from the adapters' properties by refresh()) -----------------------------------
BLOCKING_IN_FLIGHT = Gauge(
    "tenure_blocking_in_flight",
    "Adapter slots held now",
    ["adapter", "role", "worker"],
    multiprocess_mode="livesum",
)
BLOCKING_QUEUED = Gauge(
    "tenure_blocking_queued",
    "Callers waiting for an adapter slot",
    ["adapter", "role", "worker"],
    multiprocess_mode="livesum",
)
BLOCKING_MAX_IN_FLIGHT = Gauge(
    "tenure_blocking_max_in_flight",
    "The adapter's bound on calls in flight",
    ["adapter", "role", "worker"],
    multiprocess_mode="livesum",
)
BLOCKING_COMPLETED = Counter(
    "tenure_blocking_completed_total",
    "Offloaded calls that ended and gave their slot back",
    ["adapter", "role", "worker"],
)
BLOCKING_FAILED_CLOSED = Counter(
    "tenure_blocking_failed_closed_total",
    "Adapter slots written off because an operation was cancelled",
    ["adapter", "role", "worker"],
)
BLOCKING_REJECTED = Counter(
    "tenure_blocking_rejected_total",
    "Offloaded calls rejected (queue_full, queue_timeout)",
    ["adapter", "role", "worker", "reason"],
)


class AdapterStats(Protocol):
    """What `watch_adapter` reads: `tenure.kernel.blocking` adapters, the SQLite store's connection thread."""

    @property
    def name(self) -> str: ...
    @property
    def max_in_flight(self) -> int: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def queued(self) -> int: ...
    @property
    def completed(self) -> int: ...
    @property
    def failed_closed(self) -> int: ...
    @property
    def rejected_queue_full(self) -> int: ...
    @property
    def rejected_queue_timeout(self) -> int: ...


class LagStats(Protocol):
    """What `watch_lag` reads from a `tenure.kernel.lag.LagSampler` (its read side is thread-safe)."""

    def max_lag_window(self, window_s: float | None = None) -> float: ...


@dataclass
class _WatchedAdapter:
    adapter: AdapterStats
    labels: tuple[str, str, str]
    seen: dict[str, int] = field(default_factory=dict)


@dataclass
class Watched:
    """The objects `refresh()` reads. The lists are replaced whole, never mutated, so registering from the
    loop thread takes no lock (a contended lock on the loop would block it); only `refresh()` locks."""

    adapters: list[_WatchedAdapter] = field(default_factory=list)
    lags: list[tuple[LagStats, tuple[str, str]]] = field(default_factory=list)
    refresh_lock: threading.Lock = field(default_factory=threading.Lock)


_WATCHED = Watched()


def watch_adapter(adapter: AdapterStats, role: str, worker: str) -> Callable[[], None]:
    """Export `adapter`'s numbers as `tenure_blocking_*{adapter, role, worker}`; returns an unwatcher."""
    entry = _WatchedAdapter(adapter, (adapter.name, role, worker))
    _WATCHED.adapters = [*_WATCHED.adapters, entry]

    def unwatch() -> None:
        _final_refresh(lambda: _refresh_adapter(entry))
        _WATCHED.adapters = [e for e in _WATCHED.adapters if e is not entry]

    return unwatch


def watch_lag(sampler: LagStats, role: str, worker: str) -> Callable[[], None]:
    """Export `sampler.max_lag_window()` as `event_loop_lag_max_seconds{role, worker}`."""
    item = (sampler, (role, worker))
    _WATCHED.lags = [*_WATCHED.lags, item]

    def unwatch() -> None:
        _final_refresh(lambda: LOOP_LAG_MAX.labels(role, worker).set(sampler.max_lag_window()))
        _WATCHED.lags = [x for x in _WATCHED.lags if x is not item]

    return unwatch


def _final_refresh(fn: Callable[[], None]) -> None:
    """Export an object's last numbers before it is unwatched, unless a refresh is running right now (then
    that refresh exports them): a non-blocking try, because unwatching happens on the event loop."""
    if _WATCHED.refresh_lock.acquire(blocking=False):
        try:
            fn()
        finally:
            _WATCHED.refresh_lock.release()


def lag_sample_recorder(role: str, worker: str) -> Callable[[float], None]:
    """An `on_sample` callback for `LagSampler`: observes `event_loop_lag_seconds{role, worker}`."""
    return LOOP_LAG.labels(role, worker).observe


def stall_recorder(role: str, worker: str) -> Callable[[object], None]:
    """An `on_stall` callback for `LagSampler`: counts `tenure_loop_stalls_total{role, worker}`."""
    counter = LOOP_STALLS.labels(role, worker)

    def on_stall(_report: object) -> None:
        counter.inc()

    return on_stall


def _refresh_adapter(entry: _WatchedAdapter) -> None:
    a, labels = entry.adapter, entry.labels
    try:
        # `queued` walks a deque the loop thread may change meanwhile; a failed read skips one refresh.
        in_flight, queued = a.in_flight, a.queued
    except RuntimeError:
        return
    BLOCKING_IN_FLIGHT.labels(*labels).set(in_flight)
    BLOCKING_QUEUED.labels(*labels).set(queued)
    BLOCKING_MAX_IN_FLIGHT.labels(*labels).set(a.max_in_flight)
    # The adapters count monotonically; counters take the growth since the last refresh.
    for key, counter, value in (
        ("completed", BLOCKING_COMPLETED.labels(*labels), a.completed),
        ("failed_closed", BLOCKING_FAILED_CLOSED.labels(*labels), a.failed_closed),
        ("queue_full", BLOCKING_REJECTED.labels(*labels, "queue_full"), a.rejected_queue_full),
        ("queue_timeout", BLOCKING_REJECTED.labels(*labels, "queue_timeout"), a.rejected_queue_timeout),
    ):
        grown = value - entry.seen.get(key, 0)
        if grown > 0:
            counter.inc(grown)
        entry.seen[key] = value


def refresh() -> None:
    """Copy the watched objects' current numbers into the metrics. Safe from any thread."""
    with _WATCHED.refresh_lock:  # never taken on an event loop: refresh runs on scrape or refresher threads
        for entry in _WATCHED.adapters:
            _refresh_adapter(entry)
        for sampler, labels in _WATCHED.lags:
            LOOP_LAG_MAX.labels(*labels).set(sampler.max_lag_window())


class _StopFlag:
    __slots__ = ("requested",)

    def __init__(self) -> None:
        self.requested = False


def start_refresher(interval_s: float = 1.0) -> Callable[[], None]:
    """Run `refresh()` every `interval_s` on a daemon thread (needed in multiprocess mode, where the scrape
    happens in another process). Returns a stop function that does not wait for the thread."""
    stop = _StopFlag()

    def body() -> None:
        import time

        while not stop.requested:
            try:
                refresh()
            except Exception:
                log.exception("metrics refresh failed")
            time.sleep(interval_s)

    threading.Thread(target=body, name="tenure-metrics-refresh", daemon=True).start()

    def request_stop() -> None:
        stop.requested = True

    return request_stop
