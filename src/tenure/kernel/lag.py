"""Event-loop lag: how late the shared scheduler runs, and which code made it late (seed 000, first layer).

Two halves work together:

* **The sampler coroutine** (on the loop) sleeps `interval_s` again and again and measures, with
  `loop.time()`, how much later than asked it woke up. That lateness is the lag: the scheduling debt of
  the loop. Each sample goes to `on_sample` (a Prometheus histogram, `event_loop_lag_seconds`) and into a
  window from which `max_lag_window()` and `degraded()` are answered (`event_loop_lag_max_seconds`,
  lag-aware liveness).
* **The watchdog thread** finds the culprit. While the loop is blocked, no coroutine runs, so the sampler
  cannot see who blocks it; it only learns *that* it was blocked once the block is over. The watchdog
  wakes every `interval_s` and looks at when the loop last ticked. Once the silence passes
  `interval_s + threshold_s`, it takes the loop thread's Python stack with `sys._current_frames()` and
  finds the running task by matching frames (see `_task_running_on`), then logs **one WARNING** on the
  `tenure.lag` logger with both, while the loop is still blocked, so a loop that never recovers is still
  explained by the log alone. When the next tick arrives it measures the stall's duration (that tick's
  lag) and calls `on_stall` once, on the loop thread, with a `StallReport`.

The three pitfalls of seed 000 still apply: keep one curve per process and alert on the max across
workers, never the mean; a `/metrics` endpoint served by the same loop freezes with it (so `up == 0` is an
alert too); and high lag proves only that the loop ran late (GC, CPU throttling and GIL-holding threads
raise it as well), which is why the stack is captured, not guessed.

The loop side and the watchdog share no lock: the loop publishes immutable beats (one attribute store and
one `deque.append`, both atomic under the GIL) and the watchdog alone keeps the stall state. So the
sampler never waits for the watchdog, and never blocks the loop it measures.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from tenure.contracts.errors import ConfigError

__all__ = ["LagSampler", "StallReport"]

logger = logging.getLogger("tenure.lag")


@dataclass(frozen=True, slots=True)
class StallReport:
    """One stall of the event loop: a tick that came more than `threshold_s` late.

    `stack` and the task fields are filled when the watchdog caught the loop while it was still blocked
    (always the case for stalls longer than `threshold_s + 2 * interval_s`); a shorter stall may be seen
    only afterwards, from the late tick, and then they are `None`.
    """

    stall_id: int
    """Sequence number of the stall in this sampler; the WARNING logged at detection carries the same id."""
    duration_s: float
    """How late the tick that ended the stall was, measured with the loop's own clock."""
    threshold_s: float
    """The sampler's threshold when the stall happened."""
    task_name: str | None
    """Name of the task that was running on the loop when the stack was taken (None: a plain callback)."""
    coroutine: str | None
    """Qualified name of that task's coroutine."""
    stack: str | None
    """The loop thread's Python stack at that moment, formatted like a traceback (most recent call last)."""
    caught_after_s: float | None
    """How long the loop had been silent when the stack was taken."""


@dataclass(frozen=True, slots=True)
class _Beat:
    """One tick of the sampler, published by the loop for the watchdog and for readers on other threads."""

    seq: int
    monotonic: float
    lag_s: float


@dataclass(frozen=True, slots=True)
class _Evidence:
    """What the watchdog saw during a stall that has not ended yet."""

    stall_id: int
    silent_for_s: float
    task_name: str | None
    coroutine: str | None
    stack: str


class _StopSignal:
    """Asks the watchdog to exit: a plain attribute, read once per interval.

    Not a `threading.Event`: setting one takes a lock that the waiting watchdog may hold at that instant,
    which would make the loop wait on the thread (and trip the tests' blocking-call guard).
    """

    __slots__ = ("requested",)

    def __init__(self) -> None:
        self.requested = False


def _task_running_on(loop: asyncio.AbstractEventLoop, frames: list[FrameType]) -> asyncio.Task[Any] | None:
    """The task of `loop` whose coroutine frame is on the loop thread's stack, if any.

    Why this way: `asyncio.current_task(loop)` is only meant for the loop's own thread, and a hook that
    records the current task on every step (`sys.setprofile`, a task factory) taxes every step of every
    task for the sake of a rare event. Instead, on a stall only: `asyncio.all_tasks(loop)` is written to be
    called from other threads (it copies the task set and retries if it changes meanwhile), and a running
    task's outermost coroutine frame (`cr_frame`) is one of the frames on the loop thread's stack, since a
    coroutine's frame is linked below the frames it awaits while it runs. Matching by identity is exact. If
    no frame matches, the loop is blocked in a plain callback, not in a task.
    """
    on_stack = {id(frame) for frame in frames}
    try:
        tasks = asyncio.all_tasks(loop)
    except RuntimeError:  # the task set kept changing under us; the stack alone still tells the story
        return None
    for task in tasks:
        coro = task.get_coro()
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None and id(frame) in on_stack:
            return task
    return None


class LagSampler:
    """Measures the event loop's lag, keeps a window of it, and catches long stalls in the act.

    Run it as a background task of each process (`tg.create_task(sampler.run())`). Callbacks run on the
    loop thread. The read-side API (`last_lag`, `current_lag`, `max_lag_window`, `degraded`, the counters)
    may be called from any thread, for example a metrics or liveness endpoint that must keep answering
    while the loop is frozen.
    """

    def __init__(
        self,
        *,
        interval_s: float = 0.05,
        threshold_s: float = 0.1,
        window_s: float = 10.0,
        on_sample: Callable[[float], None] | None = None,
        on_stall: Callable[[StallReport], None] | None = None,
    ) -> None:
        """Configure the sampler; nothing runs until `run()`.

        `interval_s` is both the sampling period and the watchdog's period. A stall is a tick more than
        `threshold_s` late. `window_s` is how much history `max_lag_window` and `degraded` can look at.
        `on_sample(lag_s)` is called for every tick, `on_stall(report)` once per stall, after it ended.
        """
        if not interval_s > 0:
            raise ConfigError(f"lag sampler: interval_s must be positive, got {interval_s}")
        if not threshold_s > 0:
            raise ConfigError(f"lag sampler: threshold_s must be positive, got {threshold_s}")
        if not window_s >= interval_s:
            raise ConfigError(f"lag sampler: window_s ({window_s}) must be >= interval_s ({interval_s})")
        self._interval_s = interval_s
        self._threshold_s = threshold_s
        self._window_s = window_s
        self._on_sample = on_sample
        self._on_stall = on_stall
        # Loop side writes, any thread reads: (monotonic time, lag) of the samples in the window.
        self._samples: collections.deque[tuple[float, float]] = collections.deque()
        # The latest tick; replaced whole, so a reader on another thread sees one consistent beat.
        self._last_beat: _Beat | None = None
        # The watchdog's inbox: every tick, in order. Bounded so a dead watchdog cannot grow it forever.
        self._beats: collections.deque[_Beat] = collections.deque(maxlen=4096)
        # Finished stalls waiting to be handed to `on_stall` on the loop thread.
        self._reports: collections.deque[StallReport] = collections.deque()
        self._running = False
        self._sample_count = 0
        self._stall_count = 0
        self._last_stall: StallReport | None = None
        # Only the watchdog thread draws from it; kept here so ids stay unique if run() is started again.
        self._stall_ids = itertools.count(1)

    # -- read side (any thread) ------------------------------------------------------------------------

    @property
    def interval_s(self) -> float:
        """The sampling (and watchdog) period."""
        return self._interval_s

    @property
    def threshold_s(self) -> float:
        """A tick later than this is a stall."""
        return self._threshold_s

    @property
    def window_s(self) -> float:
        """How far back `max_lag_window` and `degraded` can see."""
        return self._window_s

    @property
    def running(self) -> bool:
        """True while `run()` is running."""
        return self._running

    @property
    def sample_count(self) -> int:
        """Ticks measured since the sampler was created."""
        return self._sample_count

    @property
    def stall_count(self) -> int:
        """Stalls that have ended (each one is, or is about to be, reported to `on_stall`)."""
        return self._stall_count

    @property
    def last_stall(self) -> StallReport | None:
        """The most recent stall that has ended."""
        return self._last_stall

    @property
    def last_lag(self) -> float:
        """The lag of the latest tick, in seconds (0.0 before the first)."""
        beat = self._last_beat
        return beat.lag_s if beat is not None else 0.0

    @property
    def current_lag(self) -> float:
        """How overdue the next tick is right now: above 0 only while the loop is late, e.g. blocked.

        The samples only arrive once the loop runs again; this is how a reader on another thread sees a
        stall that is still going on.
        """
        beat = self._last_beat
        if beat is None or not self._running:
            return 0.0
        return max(0.0, time.monotonic() - beat.monotonic - self._interval_s)

    def max_lag_window(self, window_s: float | None = None) -> float:
        """The largest lag over the last `window_s` seconds (default: all the window), ongoing stall included.

        This is the value to export as the gauge `event_loop_lag_max_seconds`.
        """
        window = self._window_s if window_s is None else window_s
        since = time.monotonic() - window
        # tuple() copies the deque in one C call, so a concurrent append on the loop thread cannot break it.
        recent = [lag for at, lag in tuple(self._samples) if at >= since]
        return max([self.current_lag, *recent])

    def degraded(self, threshold_s: float, for_s: float) -> bool:
        """True when the lag has stayed above `threshold_s` for at least the last `for_s` seconds.

        Lag-aware liveness: a loop frozen for long, or one that keeps coming back too late tick after tick,
        is degraded; a single spike is not. The answer counts a stall still in progress and is at most one
        interval stale. `for_s` may not exceed `window_s`.
        """
        if for_s > self._window_s:
            raise ConfigError(f"degraded(): for_s ({for_s}) exceeds the sampler window ({self._window_s} s)")
        beat = self._last_beat
        if beat is None or not self._running:
            return False
        now = time.monotonic()
        # Walk back from the present for as long as the lag is above the threshold; `over_since` ends up as
        # the moment the lag first crossed it in this run of late ticks.
        over_since: float | None = None
        if now - beat.monotonic - self._interval_s > threshold_s:
            over_since = beat.monotonic + self._interval_s + threshold_s
        for at, lag in reversed(tuple(self._samples)):
            if lag <= threshold_s:
                break
            # The tick at `at` was due at `at - lag`, so it was more than `threshold_s` late from then on.
            over_since = at - lag + threshold_s
        return over_since is not None and now - over_since >= for_s

    # -- loop side ---------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Sample the lag until cancelled, with the watchdog thread running beside it."""
        if self._running:
            raise RuntimeError("this LagSampler is already running")
        loop = asyncio.get_running_loop()
        self._last_beat = _Beat(seq=0, monotonic=time.monotonic(), lag_s=0.0)
        self._beats.clear()
        self._running = True
        stop = _StopSignal()
        exited = asyncio.Event()
        watchdog = threading.Thread(
            target=self._watch,
            args=(loop, threading.get_ident(), stop, exited),
            name="tenure-lag-watchdog",
            daemon=True,  # never hold the interpreter open; it exits within two intervals of `stop`
        )
        watchdog.start()
        seq = 0
        expected = loop.time() + self._interval_s
        try:
            while True:
                expected = loop.time() + self._interval_s
                await asyncio.sleep(self._interval_s)
                seq += 1
                self._record(seq, max(0.0, loop.time() - expected))
        finally:
            # Cancelled mid-sleep: if the sleep was already overdue, that lateness is real (and may be the
            # end of a stall the watchdog is holding evidence for), so publish it before stopping.
            overdue = loop.time() - expected
            if overdue > 0:
                self._record(seq + 1, overdue)
            stop.requested = True
            try:
                await self._wait_for_exit(exited)
            finally:
                self._running = False
                self._deliver_reports()

    def _record(self, seq: int, lag: float) -> None:
        """Keep one sample, tell `on_sample`, then publish the beat (last: callbacks count as loop time)."""
        now = time.monotonic()
        self._samples.append((now, lag))
        horizon = now - self._window_s
        while self._samples and self._samples[0][0] < horizon:
            self._samples.popleft()
        self._sample_count += 1
        if self._on_sample is not None:
            try:
                self._on_sample(lag)
            except Exception:
                logger.exception("on_sample raised")
        beat = _Beat(seq=seq, monotonic=time.monotonic(), lag_s=lag)
        self._last_beat = beat
        self._beats.append(beat)

    async def _wait_for_exit(self, exited: asyncio.Event) -> None:
        """Wait, without blocking the loop (no `join()`), for the watchdog to drain its inbox and exit."""
        try:
            async with asyncio.timeout(max(1.0, 10 * self._interval_s)):
                await exited.wait()
        except TimeoutError:
            logger.warning("the lag watchdog did not stop in time; stalls it still holds may go unreported")

    def _deliver_reports(self) -> None:
        """Hand finished stalls to `on_stall`, on the loop thread."""
        while self._reports:
            report = self._reports.popleft()
            if self._on_stall is None:
                continue
            try:
                self._on_stall(report)
            except Exception:
                logger.exception("on_stall raised")

    # -- watchdog thread ---------------------------------------------------------------------------------

    def _watch(
        self,
        loop: asyncio.AbstractEventLoop,
        loop_thread_id: int,
        stop: _StopSignal,
        exited: asyncio.Event,
    ) -> None:
        """The watchdog's body. It alone owns the stall state, so it needs no lock."""
        try:
            self._watch_until(loop, loop_thread_id, stop)
        finally:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
                loop.call_soon_threadsafe(exited.set)

    def _watch_until(self, loop: asyncio.AbstractEventLoop, loop_thread_id: int, stop: _StopSignal) -> None:
        """Drain ticks and look for stalls every interval until `stop` is requested."""
        stall_ids = self._stall_ids
        last = self._last_beat
        assert last is not None  # run() publishes a first beat before starting this thread
        evidence: _Evidence | None = None
        while True:
            time.sleep(self._interval_s)
            stopping = stop.requested
            # 1. Every tick since the last wake-up, in order. A tick after a caught stall ends that stall;
            #    a late tick with no evidence is a stall too short (or too unlucky) to be caught in the act.
            while self._beats:
                beat = self._beats.popleft()
                if evidence is not None:
                    self._finish(loop, evidence.stall_id, beat, evidence)
                    evidence = None
                elif beat.lag_s > self._threshold_s:
                    self._finish(loop, next(stall_ids), beat, None)
                last = beat
            if stopping:
                return
            # 2. A stall still going on: capture it once, while the loop is still blocked.
            if evidence is None:
                silent_for = time.monotonic() - last.monotonic
                if silent_for > self._interval_s + self._threshold_s:
                    caught = self._capture(loop, loop_thread_id, next(stall_ids), silent_for)
                    # If the loop ticked while we looked, the stack may show the code after the stall:
                    # drop it; the late tick is drained on the next wake-up and reported without a stack.
                    if caught is not None and not self._beats:
                        evidence = caught
                        logger.warning(
                            "event loop blocked for %.3f s so far (threshold %.3f s): stall %d in task %s "
                            "(coroutine %s); loop thread stack, most recent call last:\n%s",
                            silent_for - self._interval_s,
                            self._threshold_s,
                            caught.stall_id,
                            caught.task_name,
                            caught.coroutine,
                            caught.stack,
                            extra={"stall_id": caught.stall_id, "stall_task": caught.task_name},
                        )

    def _capture(
        self, loop: asyncio.AbstractEventLoop, loop_thread_id: int, stall_id: int, silent_for: float
    ) -> _Evidence | None:
        """Take the loop thread's stack and the task it belongs to."""
        top = sys._current_frames().get(loop_thread_id)
        if top is None:  # the loop thread is gone
            return None
        frames: list[FrameType] = []
        frame: FrameType | None = top
        while frame is not None:
            frames.append(frame)
            frame = frame.f_back
        task = _task_running_on(loop, frames)
        summary = traceback.StackSummary.extract((f, f.f_lineno) for f in reversed(frames))
        coro = task.get_coro() if task is not None else None
        evidence = _Evidence(
            stall_id=stall_id,
            silent_for_s=silent_for,
            task_name=task.get_name() if task is not None else None,
            coroutine=getattr(coro, "__qualname__", None) if coro is not None else None,
            stack="".join(summary.format()),
        )
        # Frames hold every local of the loop thread: drop them now rather than keep them alive.
        del top, frames, frame, task, coro
        return evidence

    def _finish(self, loop: asyncio.AbstractEventLoop, stall_id: int, beat: _Beat, evidence: _Evidence | None) -> None:
        """Close a stall with its measured duration, log it, and queue it for `on_stall`."""
        report = StallReport(
            stall_id=stall_id,
            duration_s=beat.lag_s,
            threshold_s=self._threshold_s,
            task_name=evidence.task_name if evidence is not None else None,
            coroutine=evidence.coroutine if evidence is not None else None,
            stack=evidence.stack if evidence is not None else None,
            caught_after_s=evidence.silent_for_s if evidence is not None else None,
        )
        self._stall_count += 1
        self._last_stall = report
        extra = {"stall_id": stall_id, "stall_s": beat.lag_s, "stall_task": report.task_name}
        if evidence is not None:
            # The WARNING with the stack was logged at detection; this line only closes it.
            logger.info("event loop stall %d ended after %.3f s", stall_id, beat.lag_s, extra=extra)
        else:
            logger.warning(
                "event loop stall %d of %.3f s (threshold %.3f s), seen only after it ended: no stack",
                stall_id,
                beat.lag_s,
                self._threshold_s,
                extra=extra,
            )
        self._reports.append(report)
        try:
            loop.call_soon_threadsafe(self._deliver_reports)
        except RuntimeError:  # the loop is closed; run()'s own exit path delivers what is queued
            pass
