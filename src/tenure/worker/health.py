"""What a worker says of itself in the registry: `active`, `degraded`, `unhealthy`, `draining`, `gone`.

Two things make a worker `degraded`, and it is `active` again once neither holds:

* its event loop lags (the observer's lag-aware liveness, docs/observability.md): it claims nothing new and
  keeps renewing what it holds — blocked is not dead;
* its claims fail (the claim connection lost and not yet back, the database refusing it): it keeps trying,
  but a worker that cannot take work must never look healthy while its heartbeats still get through.

Hard timeouts in a row make it `unhealthy` (seed 002 §6.1; docs/routing.md): the `unhealthy_after`-th (default 3,
TENURE_UNHEALTHY_AFTER) starts a cool-down of `cooldown_s` (60 s, TENURE_UNHEALTHY_COOLDOWN_S) during which it
claims nothing new (it keeps renewing and finishing what it holds); then it is `active` again. Another
`unhealthy_after` timeouts in a row, without a finish of another kind between them, start another cool-down.

`draining` and `gone` are set by the worker's shutdown and left alone here. Every heartbeat carries the state,
and `tenure_worker_state` shows it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from tenure.contracts.errors import StoreUnavailable
from tenure.contracts.states import WorkerState
from tenure.worker.observe import WorkerObserver

log = logging.getLogger("tenure.worker")


class Health:
    """The reported state of one worker incarnation and whether it may claim now."""

    def __init__(
        self,
        observer: WorkerObserver,
        unhealthy_after: int = 3,
        cooldown_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._obs = observer
        self.state = WorkerState.ACTIVE
        self._lag_state = WorkerState.ACTIVE  # the loop-lag half of it
        self.claim_failures = 0  # claim round trips failed in a row
        self._failure_logged = 0.0
        self._unhealthy_after = unhealthy_after
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._unhealthy_until: float | None = None
        self._streak_acted = 0  # timeouts in a row already answered with a cool-down
        self._streak_of = 0  # the streak `_streak_acted` belongs to (Record.streaks_broken)

    def _cooling_down(self) -> bool:
        """Whether hard timeouts in a row keep this worker unhealthy now (starting or ending its cool-down)."""
        record = self._obs.record
        streak = record.consecutive_timeouts
        if record.streaks_broken != self._streak_of:  # another finish ended the streak: a new one counts afresh
            self._streak_of = record.streaks_broken
            self._streak_acted = 0
        now = self._clock()
        if self._unhealthy_until is not None:
            if now < self._unhealthy_until:
                return True
            self._unhealthy_until = None
            log.info("cool-down over after %d hard timeouts in a row: claiming again", self._streak_acted)
        if streak - self._streak_acted >= self._unhealthy_after:
            self._streak_acted = streak
            self._unhealthy_until = now + self._cooldown_s
            log.warning("%d hard timeouts in a row: unhealthy, claiming nothing new for %g s", streak, self._cooldown_s)
            return True
        return False

    def check(self) -> WorkerState:
        """Bring the state up to date (lag, claim failures, hard timeouts) and export it; returns it."""
        if self.state in (WorkerState.ACTIVE, WorkerState.DEGRADED, WorkerState.UNHEALTHY):
            self._lag_state = self._obs.liveness(self._lag_state)
            healthy = self._lag_state is WorkerState.ACTIVE and not self.claim_failures
            self.state = WorkerState.ACTIVE if healthy else WorkerState.DEGRADED
            if self._cooling_down():
                self.state = WorkerState.UNHEALTHY
        self._obs.show_state(self.state)
        return self.state

    def may_claim(self) -> bool:
        """Claim now? Not while the loop lags, unhealthy, draining or gone; a worker degraded by failing claims
        tries."""
        if self.state is WorkerState.UNHEALTHY or self._cooling_down():
            return False
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

    def warming(self) -> None:
        """Running the app's warm-up functions: claims nothing, and `check` leaves the state alone."""
        self.state = WorkerState.WARMING
        self._obs.show_state(self.state)

    def warmed(self) -> None:
        """The warm-up ended: `active` (and whatever `check` finds from now on)."""
        if self.state is WorkerState.WARMING:
            self.state = WorkerState.ACTIVE
        self.check()

    def leave(self, state: WorkerState) -> None:
        """`draining` or `gone`: the lifecycle's end, which liveness no longer changes."""
        self.state = state
        self._obs.show_state(state)
