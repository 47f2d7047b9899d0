"""Soft and hard timeouts (worker/timeouts.py): the percentile window they are learned from, and the clamp."""

from __future__ import annotations

import asyncio

import pytest

from tenure.contracts.errors import ConfigError
from tenure.contracts.states import JobState
from tenure.contracts.types import AgentSpec
from tenure.kernel.registry import Tenure
from tenure.worker.record import Record
from tenure.worker.timeouts import MIN_SAMPLE, WINDOW, Deadlines, DurationWindow, Timeouts, timeouts_for


def window_of(durations: list[float]) -> DurationWindow:
    w = DurationWindow()
    for d in durations:
        w.add(d)
    return w


def test_the_window_answers_nearest_rank_percentiles_only_once_it_holds_the_minimum_sample() -> None:
    assert (WINDOW, MIN_SAMPLE) == (200, 20)
    w = DurationWindow()
    for d in range(1, MIN_SAMPLE):  # 1 .. 19 s, shuffled order does not matter
        w.add(float(d))
    assert len(w) == 19 and w.percentile(0.95) is None and w.percentile(0.99) is None
    w.add(20.0)
    assert w.percentile(0.95) == 19.0  # ceil(0.95 * 20) = 19th smallest
    assert w.percentile(0.99) == 20.0  # ceil(0.99 * 20) = 20th
    assert w.percentile(0.5) == 10.0
    w = window_of([float(d) for d in range(100, 0, -1)])  # 100 durations arriving largest first
    assert w.percentile(0.95) == 95.0 and w.percentile(0.99) == 99.0


def test_the_window_keeps_only_its_most_recent_durations() -> None:
    w = DurationWindow(size=200)
    for _ in range(200):
        w.add(100.0)  # an old slow era ...
    for _ in range(197):
        w.add(1.0)  # ... almost pushed out: 3 of 200 left, the 198th smallest is one of them
    assert len(w) == 200 and w.percentile(0.99) == 100.0
    for _ in range(3):
        w.add(1.0)
    assert len(w) == 200 and w.percentile(0.99) == 1.0 and w.percentile(0.95) == 1.0
    small = DurationWindow(size=3, min_sample=2)
    for d in (5.0, 1.0, 3.0, 2.0):  # 5 drops out
        small.add(d)
    assert small.percentile(1.0) == 3.0 and small.percentile(0.01) == 1.0
    with pytest.raises(ValueError):
        DurationWindow(size=10, min_sample=11)


def test_the_record_feeds_each_agents_window_with_its_successes_only() -> None:
    r = Record()
    r.finished(JobState.SUCCEEDED, None, 0.1, "a")
    r.finished(JobState.SUCCEEDED, None, 0.2, "b")
    r.finished(JobState.SCHEDULED, "timeout", 9.0, "a")  # a timeout must not raise the threshold it broke
    r.finished(JobState.DEAD, "error", 9.0, "a")
    r.finished(JobState.FAILED, "bad_input", 9.0, "a")
    r.finished(JobState.CANCELLED, "cancelled", 9.0, "a")
    assert len(r.durations["a"]) == 1 and len(r.durations["b"]) == 1
    for _ in range(MIN_SAMPLE - 1):
        r.finished(JobState.SUCCEEDED, None, 0.1, "a")
    assert r.durations["a"].percentile(0.99) == 0.1


SPEC = AgentSpec("a")
FAST = window_of([0.1] * 19 + [0.5])  # p95 0.1 s, p99 0.5 s


def test_the_hard_timeout_is_twice_the_p99_within_the_floor_and_the_jobs_timeout() -> None:
    assert timeouts_for(SPEC, FAST, 600.0, 0.2) == Timeouts(0.1, 1.0)  # 2 x p99
    assert timeouts_for(SPEC, FAST, 600.0, 60.0) == Timeouts(0.1, 60.0)  # the floor
    assert timeouts_for(SPEC, FAST, 0.8, 0.2) == Timeouts(0.1, 0.8)  # the ceiling
    assert timeouts_for(SPEC, FAST, 30.0, 60.0) == Timeouts(0.1, 30.0)  # a floor past the ceiling: the ceiling
    # No ceiling: nothing is derived (as before: an agent without timeout= has no hard timeout); the soft one is.
    assert timeouts_for(SPEC, FAST, None, 0.2) == Timeouts(0.1, None)
    # Too few durations yet: no soft timeout, and the hard one is the job's timeout.
    assert timeouts_for(SPEC, window_of([0.1] * 19), 600.0, 0.2) == Timeouts(None, 600.0)
    assert timeouts_for(SPEC, None, 600.0, 0.2) == Timeouts(None, 600.0)
    assert timeouts_for(SPEC, None, None, 0.2) == Timeouts(None, None)


def test_an_agents_own_settings_override_the_learned_timeouts() -> None:
    fixed = AgentSpec("a", soft_timeout_s=5.0, hard_timeout_s=20.0)
    assert timeouts_for(fixed, FAST, 600.0, 0.2) == Timeouts(5.0, 20.0)
    assert timeouts_for(fixed, None, None, 0.2) == Timeouts(5.0, 20.0)  # no sample needed, no ceiling needed
    assert timeouts_for(fixed, None, 10.0, 0.2) == Timeouts(5.0, 10.0)  # a job's own timeout still holds
    assert timeouts_for(fixed, None, 4.0, 0.2) == Timeouts(None, 4.0)  # a soft one at or past the hard one: none
    off = AgentSpec("a", soft_timeout_s=False, hard_timeout_s=False)
    assert timeouts_for(off, FAST, 600.0, 0.2) == Timeouts(None, 600.0)  # only timeout=, as before
    assert timeouts_for(off, FAST, None, 0.2) == Timeouts(None, None)


def test_the_decorator_takes_seconds_zero_none_or_false_and_keeps_hard_within_timeout() -> None:
    app = Tenure()

    @app.agent("a", soft_timeout=0, hard_timeout=None)
    async def a(ctx: object, input: object) -> None: ...

    @app.agent("b", soft_timeout=False, hard_timeout=2, timeout=5)
    async def b(ctx: object, input: object) -> None: ...

    specs = app.specs()
    assert (specs["a"].soft_timeout_s, specs["a"].hard_timeout_s) == (None, None)
    assert (specs["b"].soft_timeout_s, specs["b"].hard_timeout_s) == (False, 2.0)
    for bad in ({"soft_timeout": True}, {"soft_timeout": -1}, {"hard_timeout": "5"}, {"hard_timeout": 9, "timeout": 5}):
        with pytest.raises(ConfigError, match="timeout"):
            app.agent("c", **bad)(b)  # type: ignore[arg-type]


async def test_a_paused_execution_is_not_reported_nor_stopped_before_the_jobs_timeout() -> None:
    # An execution that was `waiting` (an approval, a coordinator's gather) waits on others, not on its work: a
    # derived timeout must not end it, only the job's timeout_s (the ceiling) still does.
    soft: list[float] = []

    async def run(seconds: float, limits: Timeouts, paused: bool) -> float | None:
        """The hard timeout that passed within `seconds` of a handler's run, or None."""
        passed: list[float | None] = []
        deadlines = Deadlines(limits, lambda elapsed, s: soft.append(s), passed.append, lambda: paused)
        try:
            await asyncio.sleep(seconds)  # the handler, running on: the timers fire beside it
        finally:
            deadlines.cancel()
        assert len(passed) <= 1, passed
        return passed[0] if passed else None

    limits = Timeouts(0.02, 0.05, 5.0)
    assert await run(0.3, limits, paused=False) == 0.05 and soft == [0.02]  # soft reported, then the hard one
    soft.clear()
    assert await run(0.3, limits, paused=True) is None and soft == []  # ran on to its end, under the ceiling
    assert await run(0.5, Timeouts(None, 0.02, 0.1), paused=True) == 0.1  # the ceiling still holds
    assert await run(0.5, Timeouts(None, 0.1, 0.1), paused=True) == 0.1  # timeout= itself is the hard one


async def test_the_timers_fire_in_order_each_once_and_a_cancelled_one_never() -> None:
    calls: list[tuple[str, float | None]] = []
    deadlines = Deadlines(
        Timeouts(0.01, 0.03, 0.03), lambda elapsed, s: calls.append(("soft", s)), lambda s: calls.append(("hard", s))
    )
    await asyncio.sleep(0.1)
    assert calls == [("soft", 0.01), ("hard", 0.03)]
    deadlines.cancel()  # after both fired: nothing to undo

    calls.clear()
    ended = Deadlines(
        Timeouts(0.01, 0.03, 0.03), lambda elapsed, s: calls.append(("soft", s)), lambda s: calls.append(("hard", s))
    )
    ended.cancel()  # the handler ended before either
    between = Deadlines(
        Timeouts(0.01, 0.05, 0.05), lambda elapsed, s: calls.append(("soft", s)), lambda s: calls.append(("hard", s))
    )
    await asyncio.sleep(0.03)
    between.cancel()  # ended past its soft timeout, before its hard one
    await asyncio.sleep(0.1)
    assert calls == [("soft", 0.01)]
    # No timer at all without a timeout.
    none = Deadlines(Timeouts(None, None), lambda elapsed, s: calls.append(("soft", s)), lambda s: calls.append(("hard", s)))
    assert none._soft is None and none._hard is None
