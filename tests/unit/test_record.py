"""A worker's own record (worker/record.py): the EWMAs and the timeouts in a row it sends with its heartbeats."""

from __future__ import annotations

import pytest

from tenure.contracts.profile import WorkerRecord
from tenure.contracts.states import JobState
from tenure.worker.record import Record


def test_the_record_follows_the_finishes_and_is_sent_only_when_it_changed() -> None:
    r = Record()
    assert r.snapshot() == WorkerRecord(None, None, 0)  # the first heartbeat writes the empty record
    assert r.snapshot() is None  # nothing new: the row keeps its own
    r.finished(JobState.SUCCEEDED, None, 0.1)
    assert r.snapshot() == WorkerRecord(1.0, 100.0, 0)
    r.timed_out()  # a hard timeout, counted when the handler is stopped ...
    assert r.consecutive_timeouts == 1 and r.snapshot() == WorkerRecord(1.0, 100.0, 1)
    r.finished(JobState.SCHEDULED, "timeout", 0.6)  # ... then its finish (retried)
    r.timed_out()
    r.finished(JobState.DEAD, "timeout", 0.6)
    snap = r.snapshot()
    assert snap is not None and snap.consecutive_timeouts == 2
    assert snap.success_rate == pytest.approx(0.81) and snap.latency_ms == pytest.approx(100 + 0.2 * 500 + 0.2 * 400)
    r.finished(JobState.CANCELLED, "cancelled", 5.0)  # nobody's failure: not counted
    assert r.snapshot() is None
    r.finished(JobState.FAILED, "bad_input", 0.1)  # another failure ends the timeouts in a row
    snap = r.snapshot()
    assert snap is not None and snap.consecutive_timeouts == 0 and snap.success_rate == pytest.approx(0.729)
    r.resend()  # that heartbeat failed: the next one sends it again
    assert r.snapshot() == snap


def test_hard_timeouts_in_a_row_stop_claims_for_the_cool_down_then_it_takes_as_many_again() -> None:
    from tenure.worker.health import Health
    from tenure.worker.observe import WorkerObserver

    obs = WorkerObserver(
        "w", heartbeat_s=1, lag_interval_s=0.05, stall_threshold_s=0.25, degraded_lag_s=0.5, degraded_for_s=2
    )
    now = [0.0]
    health = Health(obs, unhealthy_after=3, cooldown_s=60.0, clock=lambda: now[0])
    try:
        for _ in range(2):
            obs.record.timed_out()
        assert health.may_claim()
        obs.record.timed_out()
        assert not health.may_claim()
        now[0] = 59.9
        assert not health.may_claim()
        now[0] = 60.0
        assert health.may_claim()  # the cool-down is over, although the streak is still 3
        obs.record.timed_out()
        obs.record.timed_out()
        assert health.may_claim()  # 5 in a row: only 2 since the last cool-down
        obs.record.finished(JobState.SUCCEEDED, None, 0.1)  # the streak is broken ...
        for _ in range(3):
            obs.record.timed_out()
        assert not health.may_claim()  # ... and three new ones start a cool-down again
    finally:
        obs.close()
