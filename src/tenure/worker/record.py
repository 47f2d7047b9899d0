"""A worker's record of its own finishes (docs/routing.md, "The worker profile"), computed in the worker and
written with its heartbeat (no round trip of its own):

    success_rate          an EWMA (weight 0.1 per finish) of 1 for a success, 0 for a failure, a retry or a dead
                          job; cancels are nobody's failure and do not count; None until the first finish
    latency_ms            an EWMA (weight 0.2) of the durations of those finishes, start to finish CAS
    consecutive_timeouts  hard timeouts (the agent's `timeout=`) in a row, counted the moment the handler is
                          stopped (before its slot frees, so that health.py can stop claims first); any other
                          finish resets it
    durations             per agent, a `DurationWindow` of its last 200 successful durations (worker/timeouts.py):
                          the p95 and p99 its soft and derived hard timeouts come from; kept here, not sent

Only finishes whose CAS matched feed the EWMAs: a finish that lost ownership was not this worker's to record.
"""

from __future__ import annotations

from tenure.contracts.profile import WorkerRecord
from tenure.contracts.states import JobState
from tenure.worker.timeouts import DurationWindow

SUCCESS_WEIGHT = 0.1
LATENCY_WEIGHT = 0.2


class Record:
    """The running record of one worker incarnation."""

    def __init__(self) -> None:
        self.success_rate: float | None = None
        self.latency_ms: float | None = None
        self.consecutive_timeouts = 0
        self.finishes = 0  # changes counted (finishes and timeouts), to know when to send the record
        self._sent = -1  # `finishes` when the last snapshot was taken
        self.streaks_broken = 0  # how many times a streak of timeouts was ended by another finish (health.py)
        self.durations: dict[str, DurationWindow] = {}  # by agent: recent successful durations

    def finished(self, state: JobState, error_code: str | None, duration_s: float, agent: str | None = None) -> None:
        """Count one finish that committed (`state` SCHEDULED: failed, a retry was scheduled); a success of
        `agent` also joins its duration window."""
        if state is JobState.CANCELLED:
            return
        self.finishes += 1
        ok = 1.0 if state is JobState.SUCCEEDED else 0.0
        if ok and agent is not None:
            window = self.durations.get(agent)
            if window is None:
                window = self.durations[agent] = DurationWindow()
            window.add(duration_s)
        ms = duration_s * 1000.0
        self.success_rate = (
            ok if self.success_rate is None else self.success_rate + SUCCESS_WEIGHT * (ok - self.success_rate)
        )
        self.latency_ms = ms if self.latency_ms is None else self.latency_ms + LATENCY_WEIGHT * (ms - self.latency_ms)
        if error_code != "timeout" and self.consecutive_timeouts:  # a timeout was counted by `timed_out`
            self.consecutive_timeouts = 0
            self.streaks_broken += 1

    def timed_out(self) -> None:
        """A handler ran past its hard timeout."""
        self.consecutive_timeouts += 1
        self.finishes += 1  # the record changed: the next heartbeat sends it

    def snapshot(self) -> WorkerRecord | None:
        """The record for the next heartbeat, or None when nothing changed since the last one (the row keeps it)."""
        if self.finishes == self._sent:
            return None
        self._sent = self.finishes
        return WorkerRecord(
            None if self.success_rate is None else round(self.success_rate, 4),
            None if self.latency_ms is None else round(self.latency_ms, 2),
            self.consecutive_timeouts,
        )

    def resend(self) -> None:
        """The last snapshot was not delivered: the next one is taken even without a new finish."""
        self._sent = -1
