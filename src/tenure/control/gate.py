"""Admission control: queue caps and circuit breakers, checked for every admission (control/admission.py).

Every count lives in the shared store, so two gateways — and a gateway and a `tenure submit` beside it — answer
alike (seed 004's open gap): the caps count queued and scheduled jobs in the database, and a circuit's window of
timeouts is a table, not a counter in one process. An admission of one (tenant, agent) — every single submit —
hands its check to the enqueue (`Gate.ask`, `JobStore.enqueue(jobs, gate)`): the store reads both in the
enqueue's own round trip on PostgreSQL and in its write transaction on SQLite, before it inserts. On SQLite the
write lock makes the count and the insert one step; on PostgreSQL they are one statement, whose snapshot does not
see another gateway's insert in flight, so concurrent admissions can overshoot a cap by at most the number of
admissions in flight at that moment. A batch of several pairs reads each first (`Store.admission_state`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from tenure.contracts.errors import TenureError
from tenure.contracts.reports import AdmissionState, GateAsk
from tenure.contracts.store import Store


class QueueFull(TenureError):
    """A global or per-tenant cap on waiting jobs is reached; retry after `retry_after_s`."""

    code = "queue_full"

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class CircuitOpen(TenureError):
    """The circuit of an agent is open after repeated timeouts; retry after `retry_after_s`."""

    code = "circuit_open"

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class GateConfig:
    """Caps and breaker settings. Defaults follow DESIGN.md (500 waiting jobs; 3 timeouts in 10 min → 60 s)."""

    max_queued: int = 500
    max_queued_per_tenant: int = 500
    breaker_threshold: int = 3
    breaker_window_s: float = 600.0
    breaker_open_s: float = 60.0
    retry_after_s: int = 1


class GateObserver(Protocol):
    """Told of every check (the gateway exports it as metrics: the caps admitted under, the circuit's state)."""

    def __call__(self, tenant: str, circuit_key: str, circuit_open: bool) -> None:
        """One check of `tenant`'s admission to circuit `circuit_key` read the circuit open or closed."""
        ...


class Gate:
    """Checks an admission against the shared counts, with one read of the store per (tenant, agent) asked
    for (one for a single job). Raises `QueueFull` or `CircuitOpen`."""

    def __init__(self, store: Store, config: GateConfig | None = None, observer: GateObserver | None = None) -> None:
        self.store = store
        self.config = config or GateConfig()
        self.observer = observer

    async def check(self, demand: Mapping[tuple[str, str], int]) -> None:
        """Whether `demand` — how many jobs of each (tenant, agent) one admission asks for at once — may be
        admitted: every agent's circuit is closed, and no cap would be passed by the whole of it. One read per
        (tenant, agent); an admission of one pair can instead hand `ask(demand)` to the enqueue."""
        cfg = self.config
        states = {}
        upto = max(cfg.max_queued, cfg.max_queued_per_tenant) + 1  # no count walks a backlog past the cap
        for tenant, agent in demand:
            states[(tenant, agent)] = await self.store.admission_state(
                tenant, f"agent:{agent}", cfg.breaker_threshold, cfg.breaker_window_s, cfg.breaker_open_s, upto
            )
        self.decide(demand, states)

    def ask(self, demand: Mapping[tuple[str, str], int]) -> GateAsk | None:
        """The check of a demand of one (tenant, agent), for the store to make in the enqueue's own round trip
        (`JobStore.enqueue(jobs, gate)`); None for a demand of several pairs (`check` reads each)."""
        if len(demand) != 1:
            return None
        ((tenant, agent), asked), cfg = next(iter(demand.items())), self.config

        def verdict(state: AdmissionState) -> None:  # an admission tells the observer once, by `admitted`
            try:
                self.decide(demand, {(tenant, agent): state}, observe=False)
            except (QueueFull, CircuitOpen):
                if self.observer is not None:
                    self.observer(tenant, f"agent:{agent}", state.circuit.open_for_s > 0)
                raise

        return GateAsk(
            tenant,
            f"agent:{agent}",
            cfg.breaker_threshold,
            cfg.breaker_window_s,
            cfg.breaker_open_s,
            total_max=cfg.max_queued - asked,
            tenant_max=cfg.max_queued_per_tenant - asked,
            asked=asked,
            verdict=verdict,
        )

    def admitted(self, ask: GateAsk | None) -> None:
        """An enqueue given `ask` admitted its jobs: tell the observer (the store may have decided in SQL, without
        calling the rule, and an admission means the circuit was closed)."""
        if ask is not None and self.observer is not None:
            self.observer(ask.tenant, ask.circuit_key, False)

    def decide(
        self,
        demand: Mapping[tuple[str, str], int],
        states: Mapping[tuple[str, str], AdmissionState],
        observe: bool = True,
    ) -> None:
        """The rule: raise `CircuitOpen` or `QueueFull` unless `demand` may be admitted on the `states` read for
        its pairs (the observer is told of each circuit). PostgreSQL's `tenure_enqueue` refuses on the same
        thresholds (`GateAsk`), and calls for this rule only to word a refusal: see `admitted`."""
        cfg = self.config
        total = 0
        queued_of: dict[str, int] = {}
        for (tenant, agent), state in states.items():
            key = f"agent:{agent}"
            circuit = state.circuit
            if observe and self.observer is not None:
                self.observer(tenant, key, circuit.open_for_s > 0)
            if circuit.open_for_s > 0:
                raise CircuitOpen(
                    f"agent {agent!r} timed out {circuit.failures} times in the last {cfg.breaker_window_s:g}s; "
                    f"new jobs are refused for {circuit.open_for_s:.0f}s more",
                    retry_after_s=max(1, int(circuit.open_for_s + 0.999)),
                )
            total = max(total, state.queued)
            queued_of[tenant] = state.queued_tenant
        asked = sum(demand.values())
        if total + asked > cfg.max_queued:
            raise QueueFull(
                f"{_count(total, cfg.max_queued)} jobs are waiting to start; the limit is {cfg.max_queued}" + _batch(asked),
                cfg.retry_after_s,
            )
        for tenant, mine in queued_of.items():
            mine_asked = sum(n for (t, _), n in demand.items() if t == tenant)
            cap = cfg.max_queued_per_tenant
            if mine + mine_asked > cap:
                raise QueueFull(
                    f"tenant {tenant!r} has {_count(mine, cap)} jobs waiting to start; the limit is {cap}"
                    + _batch(mine_asked),
                    cfg.retry_after_s,
                )


def _count(n: int, cap: int) -> str:
    """A count past the cap says only that (the store stops counting one past the larger cap: `GateAsk.count_upto`)."""
    return f"more than {cap}" if n > cap else str(n)


def _batch(asked: int) -> str:
    return "" if asked == 1 else f" (a batch of {asked} would pass it)"
