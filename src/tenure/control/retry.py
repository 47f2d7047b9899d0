"""Retry backoff: exponential with jitter, so failed jobs of one incident do not come back in lockstep."""

from __future__ import annotations

import random


def backoff_s(attempt: int, base_s: float = 1.0, cap_s: float = 300.0, rng: random.Random | None = None) -> float:
    """Delay before the attempt after `attempt` (1-based): base·2^(attempt-1), capped, then "equal jitter"
    (half fixed, half random) so the delay grows but never collapses to zero."""
    delay = min(cap_s, base_s * (2 ** max(0, attempt - 1)))
    r = rng or random
    return float(delay / 2 + r.uniform(0, delay / 2))
