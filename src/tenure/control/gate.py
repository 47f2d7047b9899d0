"""Admission control at the gateway: queue caps, circuit breakers, and same-process idempotency.

Every count lives in the shared store, so two gateways answer alike (seed 004's open gap): the caps count
queued and scheduled jobs in the database, and a circuit's window of timeouts is a table, not a counter in
one process. The one in-process structure is `InFlight`, the placeholder that makes same-process duplicates
of an idempotency key wait for the first request instead of racing it to the database; across processes
the store's unique `(tenant, idem_digest)` answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tenure.contracts.errors import StoreUnavailable, TenureError
from tenure.contracts.store import Store
from tenure.contracts.types import Enqueued, idempotent_replay


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


class Gate:
    """Checks one admission against the shared counts. Raises `QueueFull` or `CircuitOpen`."""

    def __init__(self, store: Store, config: GateConfig | None = None) -> None:
        self.store = store
        self.config = config or GateConfig()

    async def check(self, tenant: str, agent: str) -> None:
        cfg = self.config
        circuit = await self.store.circuit_state(
            f"agent:{agent}", cfg.breaker_threshold, cfg.breaker_window_s, cfg.breaker_open_s
        )
        if circuit.open_for_s > 0:
            raise CircuitOpen(
                f"agent {agent!r} timed out {circuit.failures} times in the last {cfg.breaker_window_s:g}s; "
                f"new jobs are refused for {circuit.open_for_s:.0f}s more",
                retry_after_s=max(1, int(circuit.open_for_s + 0.999)),
            )
        total, mine = await self.store.queue_depth(tenant)
        if total >= cfg.max_queued:
            raise QueueFull(f"{total} jobs are waiting to start; the limit is {cfg.max_queued}", cfg.retry_after_s)
        if mine >= cfg.max_queued_per_tenant:
            raise QueueFull(
                f"tenant {tenant!r} has {mine} jobs waiting to start; the limit is {cfg.max_queued_per_tenant}",
                cfg.retry_after_s,
            )


class InFlight:
    """Same-process duplicates of one idempotency digest share the first request's future."""

    def __init__(self) -> None:
        self._pending: dict[bytes, tuple[bytes, asyncio.Future[Enqueued]]] = {}

    async def run(self, digest: bytes, fingerprint: bytes, submit: Callable[[], Awaitable[Enqueued]]) -> Enqueued:
        held = self._pending.get(digest)
        if held is not None:
            first_fingerprint, fut = held
            result = await asyncio.shield(fut)
            return idempotent_replay(result.job_id, first_fingerprint, fingerprint)
        fut = asyncio.get_running_loop().create_future()
        self._pending[digest] = (fingerprint, fut)
        try:
            result = await submit()
        except BaseException as exc:
            # A leader that was cancelled (its client went away) answers its waiters "retry": the store
            # decides whether the job was created, and a retry with the same key gets that answer.
            fut.set_exception(
                exc
                if isinstance(exc, Exception)
                else StoreUnavailable("the first request with this idempotency key was abandoned; retry")
            )
            fut.exception()  # retrieved: waiters (if any) re-raise it; nobody is warned of an orphan
            raise
        else:
            fut.set_result(result)
            return result
        finally:
            del self._pending[digest]

    def __len__(self) -> int:
        return len(self._pending)
