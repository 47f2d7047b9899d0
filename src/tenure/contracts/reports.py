"""What the store reports about its own state, beside the jobs it holds: why a queued job waits
(`JobStore.waiting_info`, docs/scheduling.md), what holds the store back (`JobStore.health`, docs/operations.md),
and what admission's gate reads (`JobStore.admission_state`, `circuit_state`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WaitingInfo:
    """Why a queued job waits (`JobStore.waiting_info`): claimable jobs ahead of it in claim order (counted up to a
    bound: `ahead_capped`), how many of those are other tenants' jobs of its own priority (`other_tenants_ahead`:
    there by fair shares, their tenants' turns come first; a lower bound when capped), its own turn (`turn`, its
    `fair_at`), for a job waiting for its concurrency key's turn the jobs holding the key, and, when the caller
    gave its agent's queue cap, the jobs of its agent (of its mode, for a cap per mode) waiting to start, counted
    up to that cap (`agent_waiting`; None without a cap)."""

    ahead: int
    ahead_capped: bool
    key_holders: tuple[str, ...] = ()
    other_tenants_ahead: int = 0
    turn: float = 0.0
    agent_waiting: int | None = None


@dataclass(frozen=True, slots=True)
class StoreHealth:
    """What holds a store back, for metrics and `tenure doctor` (docs/operations.md).

    `oldest_xmin_age_s`: on PostgreSQL, the age of the oldest transaction (or snapshot, prepared transaction,
    replication slot) that keeps VACUUM from removing dead rows — the "xmin horizon"; while it stays old, every
    claim and finish leaves dead versions of `jobs` rows behind that nothing can reclaim. None where the store has
    no such thing (SQLite). `oldest_xmin_holder` says who holds it. Per table: dead rows (`dead_tuples`, PostgreSQL's
    estimate), live rows and bytes on disk with indexes (`table_bytes`; on SQLite, the whole file as `(file)`)."""

    oldest_xmin_age_s: float | None
    oldest_xmin_holder: str | None
    dead_tuples: Mapping[str, int]
    live_tuples: Mapping[str, int]
    table_bytes: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class CircuitState:
    """A circuit breaker's window as the store counts it: failures within the window, and seconds the circuit
    stays open (0 when closed)."""

    failures: int
    open_for_s: float

    @classmethod
    def from_window(cls, failures: int, latest: float | None, now: float, threshold: int, open_s: float) -> CircuitState:
        """The state of a window of `failures`, the latest at `latest`, read at `now` (the store's clock): open
        for `open_s` after the failure that brought the count to `threshold` or more."""
        open_for = 0.0
        if failures >= threshold and latest is not None:
            open_for = max(0.0, latest + open_s - now)
        return cls(int(failures), open_for)


@dataclass(frozen=True, slots=True)
class AdmissionState:
    """What admission's gate reads in one round trip before it admits: jobs waiting to start (queued or
    scheduled) in all and of one tenant, and the circuit of the agent asked for. The counts stop at the bounds
    the gate asks for (`GateAsk.count_upto`): a count that reached its bound means at least that many, and a
    submit never counts a backlog past its cap."""

    queued: int
    queued_tenant: int
    circuit: CircuitState


@dataclass(frozen=True, slots=True)
class GateAsk:
    """The gate's read of one (tenant, agent), handed to `JobStore.enqueue` so that the store reads the admission
    state in the enqueue's own round trip (PostgreSQL) or write transaction (SQLite), before it inserts anything.

    `verdict(state)` is the rule (control/gate.py): it raises `QueueFull` or `CircuitOpen` to refuse, and nothing
    is written. A store that decides in SQL refuses on the same thresholds, then calls `verdict` for the answer:
    more than `total_max` jobs waiting in all, more than `tenant_max` of the tenant, or the circuit open (at least
    `threshold` failures within `window_s`, the latest less than `open_s` ago). The store counts waiting jobs
    only up to `count_upto` (the larger cap + 1: exact up to the cap, then "more than the cap"), so that the read
    costs the same behind any backlog; PostgreSQL's function derives it from `total_max`, `tenant_max` and the
    batch's size, which is `asked`."""

    tenant: str
    circuit_key: str
    threshold: int
    window_s: float
    open_s: float
    total_max: int
    tenant_max: int
    asked: int
    verdict: Callable[[AdmissionState], None]

    @property
    def count_upto(self) -> int:
        """How far the store counts waiting jobs, in all and of the tenant: one past the larger cap."""
        return max(self.total_max, self.tenant_max) + self.asked + 1
