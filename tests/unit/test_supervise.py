"""The restart policy of `tenure up`'s supervisor (no processes here; tests/integration/test_supervise.py
runs real children)."""

from __future__ import annotations

import random

from tenure.supervise import Backoff, Child


def test_a_child_dying_again_and_again_waits_twice_as_long_each_time_up_to_the_cap_with_jitter() -> None:
    backoff = Backoff(reset_after_s=60.0, rng=random.Random(7))
    delays = [backoff.delay_after(uptime_s=1.0) for _ in range(9)]
    ceilings = [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0, 30.0]  # 1 s doubling to 30 s
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True)), delays
    assert len({round(d / c, 6) for d, c in zip(delays, ceilings, strict=True)}) > 1  # jittered, not lockstep


def test_a_child_that_ran_long_enough_before_dying_starts_over_from_the_first_delay() -> None:
    backoff = Backoff(reset_after_s=60.0)
    for _ in range(5):
        backoff.delay_after(uptime_s=0.1)
    assert 0.5 <= backoff.delay_after(uptime_s=60.0) <= 1.0
    assert 1.0 <= backoff.delay_after(uptime_s=0.1) <= 2.0


def test_each_child_has_a_backoff_of_its_own() -> None:
    crashing, steady = Child("worker-1", ["true"]), Child("worker-2", ["true"])
    for _ in range(6):
        crashing.backoff.delay_after(uptime_s=0.1)
    assert 0.5 <= steady.backoff.delay_after(uptime_s=0.1) <= 1.0
