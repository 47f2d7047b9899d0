"""Backoff with jitter, in one place: the delay before a failed job's next attempt, before a worker's next
registration attempt (a store or Redis not reachable yet), and before `tenure up` restarts a child that died.

All three are "equal jitter": base·2^(attempt-1), capped, then multiplied by a random factor in [0.5, 1.0], so the
delay grows but never collapses to zero, and the processes of one incident do not come back in lockstep.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenure.contracts.errors import StoreUnavailable

T = TypeVar("T")

REGISTER_FIRST_S = 1.0
"""A worker's first wait after a failed registration (the store or Redis not reachable yet)."""
REGISTER_CAP_S = 30.0
"""... doubling up to this."""


def backoff_s(attempt: int, base_s: float = 1.0, cap_s: float = 300.0, rng: random.Random | None = None) -> float:
    """Delay before the attempt after `attempt` (1-based): base·2^(attempt-1), capped, then "equal jitter"
    (half fixed, half random: × a factor in [0.5, 1.0]) so the delay grows but never collapses to zero."""
    delay = min(cap_s, base_s * (2 ** max(0, min(attempt - 1, 62))))
    r = rng or random
    return float(delay / 2 + r.uniform(0, delay / 2))


async def keep_trying(
    op: Callable[[], Awaitable[T]],
    *,
    what: str,
    log: logging.Logger,
    stop: asyncio.Event | None = None,
    first_s: float = REGISTER_FIRST_S,
    cap_s: float = REGISTER_CAP_S,
    rng: random.Random | None = None,
) -> T | None:
    """Run `op` until it does not raise `StoreUnavailable`, waiting `backoff_s` between attempts and logging each
    failed one (its number, the wait, the error). Returns its answer, or None when `stop` was set while waiting.
    Any other error is not a reason to wait: it is raised."""
    attempt = 0
    while True:
        attempt += 1
        try:
            return await op()
        except StoreUnavailable as exc:
            wait = backoff_s(attempt, first_s, cap_s, rng)
            log.warning(
                "%s: attempt %d failed, next attempt in %.2f s: %s",
                what,
                attempt,
                wait,
                exc,
                extra={"attempt": attempt, "wait_s": round(wait, 3), "error": str(exc)},
            )
        if stop is None:
            await asyncio.sleep(wait)
            continue
        try:
            await asyncio.wait_for(stop.wait(), wait)
            return None
        except TimeoutError:
            pass
