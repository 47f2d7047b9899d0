"""What a worker says of itself in the registry: `active`, `degraded`, `draining`, `gone`.

Two things make a worker `degraded`, and it is `active` again once neither holds:

* its event loop lags (the observer's lag-aware liveness, docs/observability.md): it claims nothing new and
  keeps renewing what it holds — blocked is not dead;
* its claims fail (the claim connection lost and not yet back, the database refusing it): it keeps trying,
  but a worker that cannot take work must never look healthy while its heartbeats still get through.

`draining` and `gone` are set by the worker's shutdown and left alone here. Every heartbeat carries the state,
and `tenure_worker_state` shows it.
"""

from __future__ import annotations

import logging
import time

from tenure.contracts.errors import StoreUnavailable
from tenure.contracts.states import WorkerState
from tenure.worker.observe import WorkerObserver

log = logging.getLogger("tenure.worker")


class Health:
    """The reported state of one worker incarnation and whether it may claim now."""

    def __init__(self, observer: WorkerObserver) -> None:
        self._obs = observer
        self.state = WorkerState.ACTIVE
        self._lag_state = WorkerState.ACTIVE  # the loop-lag half of it
        self.claim_failures = 0  # claim round trips failed in a row
        self._failure_logged = 0.0

    def check(self) -> WorkerState:
        """Bring the state up to date (lag, claim failures) and export it; returns it."""
        if self.state in (WorkerState.ACTIVE, WorkerState.DEGRADED):
            self._lag_state = self._obs.liveness(self._lag_state)
            healthy = self._lag_state is WorkerState.ACTIVE and not self.claim_failures
            self.state = WorkerState.ACTIVE if healthy else WorkerState.DEGRADED
        self._obs.show_state(self.state)
        return self.state

    def may_claim(self) -> bool:
        """Claim now? Not while the loop lags, draining or gone; a worker degraded by failing claims tries."""
        return self._lag_state is WorkerState.ACTIVE and self.state in (WorkerState.ACTIVE, WorkerState.DEGRADED)

    def claim_failed(self, exc: StoreUnavailable) -> None:
        """A claim round trip failed: degraded until one works again (logged once, then every 10 s)."""
        self.claim_failures += 1
        self._obs.claim_failed()
        now = time.monotonic()
        if self.claim_failures == 1 or now - self._failure_logged > 10.0:
            self._failure_logged = now
            log.warning("claim failed (%d in a row; degraded until a claim works): %s", self.claim_failures, exc)
        self.check()

    def claim_worked(self) -> None:
        if self.claim_failures:
            log.info("claims work again after %d failures", self.claim_failures)
            self.claim_failures = 0
            self.check()

    def leave(self, state: WorkerState) -> None:
        """`draining` or `gone`: the lifecycle's end, which liveness no longer changes."""
        self.state = state
        self._obs.show_state(state)
