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
    r.finished(JobState.SCHEDULED, "timeout", 0.6)  # a hard timeout, retried
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
