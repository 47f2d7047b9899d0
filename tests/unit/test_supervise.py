"""The restart policy of `tenure up`'s supervisor (no processes here; tests/integration/test_supervise.py
runs real children)."""

from __future__ import annotations

from tenure.supervise import Backoff, Child


def test_a_child_dying_again_and_again_waits_twice_as_long_each_time_up_to_the_cap() -> None:
    backoff = Backoff(first_s=0.5, max_s=10.0, reset_after_s=60.0)
    delays = [backoff.delay_after(uptime_s=1.0) for _ in range(8)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]


def test_a_child_that_ran_long_enough_before_dying_starts_over_from_the_first_delay() -> None:
    backoff = Backoff(first_s=0.5, max_s=10.0, reset_after_s=60.0)
    for _ in range(5):
        backoff.delay_after(uptime_s=0.1)
    assert backoff.delay_after(uptime_s=60.0) == 0.5
    assert backoff.delay_after(uptime_s=0.1) == 1.0


def test_each_child_has_a_backoff_of_its_own() -> None:
    crashing, steady = Child("worker-1", ["true"]), Child("worker-2", ["true"])
    for _ in range(6):
        crashing.backoff.delay_after(uptime_s=0.1)
    assert steady.backoff.delay_after(uptime_s=0.1) == 0.5
