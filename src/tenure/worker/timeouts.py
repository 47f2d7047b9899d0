"""An execution's soft and hard timeouts (seed 002 §6.1; docs/routing.md, "Health: soft and hard timeouts").

    soft   the agent's `soft_timeout=` seconds, else the p95 of its recent successful durations on this worker;
           none before `MIN_SAMPLE` of them, or with `soft_timeout=False`. Past it the worker logs the execution
           once, counts it in `tenure_soft_timeouts_total{agent}` and appends an `execution.soft_timeout` event:
           it never interrupts the handler.
    hard   the agent's `hard_timeout=` seconds, else 2 × the p99 of the same durations clamped to
           [`TENURE_HARD_TIMEOUT_FLOOR_S`, the job's `timeout_s`] — the ceiling is the job's timeout (the agent's
           `timeout=` unless the submit set its own), which always holds. Without a ceiling nothing is derived:
           an agent that declares neither `timeout=` nor `hard_timeout=` keeps no hard timeout, as before (a
           p99 learned from a few quick runs must not start killing the one long job nobody bounded). Before
           `MIN_SAMPLE` durations, or with `hard_timeout=False`, the hard timeout is the job's `timeout_s`.
           Past it the handler is cancelled and the attempt fails `timeout`, whatever set it.

An execution that paused (`waiting`: an approval, input, or a coordinator's children) waits on a person or on
other jobs, not on its own work: past its soft timeout it is not reported, past a derived (or `hard_timeout=`)
hard timeout it runs on to the job's `timeout_s`, which still holds, and its duration joins no window.

The durations are a `DurationWindow` per agent (the last `WINDOW` successful finishes whose CAS matched, start to
finish, the same finishes that feed the record's EWMAs; worker/record.py). Only successes count: a timed-out or
failed run must not raise the threshold that judges the next one.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from tenure.contracts.types import AgentSpec

WINDOW = 200
"""Successful durations kept per agent (the most recent)."""
MIN_SAMPLE = 20
"""Durations needed before a percentile is trusted: below it there is no soft timeout and no derived hard one."""
HARD_FACTOR = 2.0
"""The derived hard timeout is this many times the p99."""


class DurationWindow:
    """The last `size` durations (seconds), kept both in arrival order (to drop the oldest) and sorted (so a
    percentile is one index, not a sort per execution). Adding one costs a bisect and a short memmove."""

    def __init__(self, size: int = WINDOW, min_sample: int = MIN_SAMPLE) -> None:
        if size < 1 or not 1 <= min_sample <= size:
            raise ValueError(f"a window of {size} needs 1 <= min_sample <= size, not {min_sample}")
        self.size = size
        self.min_sample = min_sample
        self._order: collections.deque[float] = collections.deque()
        self._sorted: list[float] = []

    def __len__(self) -> int:
        return len(self._order)

    def add(self, duration_s: float) -> None:
        if len(self._order) == self.size:
            oldest = self._order.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, oldest)]
        self._order.append(duration_s)
        bisect.insort(self._sorted, duration_s)

    def percentile(self, q: float) -> float | None:
        """The nearest-rank `q`-quantile (0 < q <= 1) of the window: the smallest duration with at least `q` of
        them at or below it. None while the window holds fewer than `min_sample`."""
        n = len(self._sorted)
        if n < self.min_sample:
            return None
        return self._sorted[max(0, math.ceil(q * n) - 1)]


@dataclass(frozen=True, slots=True)
class Timeouts:
    """The thresholds of one execution, seconds from its start; None: none."""

    soft_s: float | None
    hard_s: float | None
    ceiling_s: float | None = field(default=None, compare=False)  # the input it was clamped to, not a result
    """The job's `timeout_s`: what still holds for an execution that paused (`Deadlines`' `paused`)."""


def timeouts_for(spec: AgentSpec, window: DurationWindow | None, job_timeout_s: float | None, floor_s: float) -> Timeouts:
    """The soft and hard timeout of an execution of `spec`'s agent whose job says `job_timeout_s` (the module
    docstring has the rules). A soft timeout at or past the hard one would never be seen: it is dropped."""
    ceiling = job_timeout_s
    p95 = p99 = None
    if window is not None:
        p95, p99 = window.percentile(0.95), window.percentile(0.99)

    if spec.hard_timeout_s is not False and spec.hard_timeout_s is not None:
        hard: float | None = spec.hard_timeout_s if ceiling is None else min(spec.hard_timeout_s, ceiling)
    elif spec.hard_timeout_s is None and ceiling is not None and p99 is not None:
        hard = min(ceiling, max(floor_s, HARD_FACTOR * p99))
    else:
        hard = ceiling

    if spec.soft_timeout_s is False:
        soft = None
    elif spec.soft_timeout_s is not None:
        soft = spec.soft_timeout_s
    else:
        soft = p95
    if soft is not None and hard is not None and soft >= hard:
        soft = None
    return Timeouts(soft, hard, ceiling)


class Deadlines:
    """The soft and hard timeouts of one running handler, as loop timers: the handler runs in its execution's own
    task, so nothing waits on it. Past the soft timeout `past_soft(elapsed_s, soft_s)` is called once; past the
    hard one `past_hard(timeout_s)` (stopping the handler is the caller's). An execution that `paused()` is neither
    reported past its soft timeout nor stopped before `ceiling_s`. `cancel()` when the handler ends."""

    __slots__ = ("_began", "_hard", "_limits", "_loop", "_past_hard", "_past_soft", "_paused", "_soft")

    def __init__(
        self,
        limits: Timeouts,
        past_soft: Callable[[float, float], None],
        past_hard: Callable[[float | None], None],
        paused: Callable[[], bool] = lambda: False,
    ) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self._limits, self._past_soft, self._past_hard, self._paused = limits, past_soft, past_hard, paused
        self._began = began = loop.time()
        self._soft = None if limits.soft_s is None else loop.call_at(began + limits.soft_s, self._on_soft)
        self._hard = None if limits.hard_s is None else loop.call_at(began + limits.hard_s, self._on_hard)

    def _on_soft(self) -> None:
        self._soft = None
        if not self._paused():
            self._past_soft(self._loop.time() - self._began, self._limits.soft_s)  # type: ignore[arg-type]

    def _on_hard(self) -> None:
        self._hard = None
        limits = self._limits
        if self._paused() and limits.hard_s != limits.ceiling_s:
            if limits.ceiling_s is not None:
                self._hard = self._loop.call_at(self._began + limits.ceiling_s, self._past_hard, limits.ceiling_s)
            return
        self._past_hard(limits.hard_s)

    def cancel(self) -> None:
        """No more calls: the handler ended (or is being stopped)."""
        for timer in (self._soft, self._hard):
            if timer is not None:
                timer.cancel()
        self._soft = self._hard = None
