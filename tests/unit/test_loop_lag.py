"""The loop-lag sampler and its watchdog (`tenure.kernel.lag`), and seed 000's experiment.

The experiment: one event loop runs four tasks that each make a 200 ms blocking call, while an unrelated
20 ms ticker records how late it wakes up. Made directly on the loop, the calls freeze the ticker and the
sampler catches the culprit's stack; made through the bounded adapter, the ticker barely notices.
Assertions compare relations with wide margins (the machine has 2 shared cores), never absolute speeds.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from tenure.contracts.errors import ConfigError
from tenure.kernel.blocking import BlockingAdapter
from tenure.kernel.lag import LagSampler, StallReport

T = TypeVar("T")

BLOCK_S = 0.2
TICK_S = 0.02


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run one test body on a fresh event loop."""
    return asyncio.run(coro)


async def wait_until(predicate: Callable[[], bool], within_s: float = 5.0) -> None:
    """Poll `predicate` on the loop until it holds; fail the test if it does not within `within_s`."""
    deadline = time.monotonic() + within_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within_s} s")
        await asyncio.sleep(0.002)


async def ticker(stop: asyncio.Event, lateness: list[float]) -> None:
    """An unrelated heartbeat: sleep TICK_S again and again and record how late each wake-up is."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        due = loop.time() + TICK_S
        await asyncio.sleep(TICK_S)
        lateness.append(max(0.0, loop.time() - due))


def blocking_upload_on_the_loop() -> None:
    """Stands for a sync SDK call: 200 ms of blocking I/O."""
    time.sleep(BLOCK_S)


async def persist_artifact_directly() -> None:
    """Seed 000's mistake: a sync call inside `async def`, on the loop."""
    blocking_upload_on_the_loop()


class Experiment:
    """A sampler, a ticker and their recordings, running on the current loop."""

    def __init__(self) -> None:
        self.stalls: list[StallReport] = []
        self.samples: list[float] = []
        self.lateness: list[float] = []
        self.sampler = LagSampler(
            interval_s=0.05, threshold_s=0.1, on_sample=self.samples.append, on_stall=self.stalls.append
        )

    async def __call__(self, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        stop = asyncio.Event()
        sampler_task = asyncio.create_task(self.sampler.run())
        ticker_task = asyncio.create_task(ticker(stop, self.lateness))
        try:
            # Both are measuring before the work starts.
            await wait_until(lambda: self.sampler.sample_count >= 2 and len(self.lateness) >= 2)
            await work()
            # A couple more ticks, so the ticker has recorded the wake-up that came after the work.
            ticks = len(self.lateness)
            await wait_until(lambda: len(self.lateness) >= ticks + 2)
        finally:
            stop.set()
            await ticker_task
            sampler_task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await sampler_task


def test_blocking_calls_on_the_loop_freeze_it_and_the_sampler_names_the_culprit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> Experiment:
        experiment = Experiment()

        async def four_blocking_tasks() -> None:
            await asyncio.gather(*(persist_artifact_directly() for _ in range(4)))
            # The stall is reported once the loop runs again; wait for it rather than hope.
            await wait_until(lambda: bool(experiment.stalls))

        with caplog.at_level(logging.INFO, logger="tenure.lag"):
            await experiment(four_blocking_tasks)
        return experiment

    experiment = run(main())

    assert max(experiment.lateness) >= 0.15
    assert experiment.sampler.max_lag_window() >= 0.1
    assert max(experiment.samples) >= 0.1
    caught = [stall for stall in experiment.stalls if stall.stack is not None]
    assert caught, f"no stall was caught in the act: {experiment.stalls}"
    stall = caught[0]
    assert "blocking_upload_on_the_loop" in (stall.stack or "")
    assert stall.coroutine is not None and "persist_artifact_directly" in stall.coroutine
    assert stall.duration_s >= 0.1
    # One WARNING per stall, with the stack, on the tenure.lag logger — enough to find the call from logs.
    warnings = [r for r in caplog.records if r.name == "tenure.lag" and r.levelno == logging.WARNING]
    assert len([r for r in warnings if "blocking_upload_on_the_loop" in r.getMessage()]) == 1


def test_the_same_calls_through_the_adapter_leave_the_loop_responsive() -> None:
    async def main() -> Experiment:
        experiment = Experiment()
        adapter = BlockingAdapter("upload", max_in_flight=4, max_queued=4, queue_timeout_s=10.0)

        async def four_offloaded_tasks() -> None:
            await asyncio.gather(*(adapter.run(blocking_upload_on_the_loop) for _ in range(4)))

        try:
            await experiment(four_offloaded_tasks)
        finally:
            await adapter.close(5.0)
        return experiment

    experiment = run(main())
    assert max(experiment.lateness) < 0.05
    assert not any(stall.stack is not None and "blocking_upload_on_the_loop" in stall.stack for stall in experiment.stalls)


def test_each_stall_is_reported_once_with_its_duration() -> None:
    async def main() -> tuple[LagSampler, list[StallReport]]:
        stalls: list[StallReport] = []
        sampler = LagSampler(interval_s=0.02, threshold_s=0.05, on_stall=stalls.append)
        task = asyncio.create_task(sampler.run())
        await wait_until(lambda: sampler.sample_count >= 2)
        time.sleep(0.3)  # one long stall: the watchdog wakes many times during it  # noqa: ASYNC251
        await wait_until(lambda: bool(stalls))
        await wait_until(lambda: sampler.sample_count >= 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return sampler, stalls

    sampler, stalls = run(main())
    long_ones = [s for s in stalls if s.duration_s >= 0.2]
    assert len(long_ones) == 1
    assert long_ones[0].stack is not None
    caught_after = long_ones[0].caught_after_s
    assert caught_after is not None and caught_after < long_ones[0].duration_s + 0.1
    assert sampler.stall_count == len(stalls)
    assert sampler.last_stall is stalls[-1]


def test_the_culprit_task_is_named_in_the_report() -> None:
    def hash_a_big_file() -> None:
        time.sleep(0.25)

    async def checksum() -> None:
        await asyncio.sleep(0)
        hash_a_big_file()

    async def main() -> list[StallReport]:
        stalls: list[StallReport] = []
        sampler = LagSampler(interval_s=0.02, threshold_s=0.05, on_stall=stalls.append)
        task = asyncio.create_task(sampler.run())
        await wait_until(lambda: sampler.sample_count >= 2)
        await asyncio.create_task(checksum(), name="the-culprit")
        await wait_until(lambda: any(s.stack for s in stalls))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return stalls

    stalls = run(main())
    caught = next(s for s in stalls if s.stack)
    assert caught.task_name == "the-culprit"
    assert caught.coroutine is not None and caught.coroutine.endswith("checksum")
    assert "hash_a_big_file" in (caught.stack or "")


def test_a_frozen_loop_is_visible_from_another_thread_while_it_lasts() -> None:
    seen: dict[str, Any] = {}
    sampler = LagSampler(interval_s=0.02, threshold_s=0.05, window_s=5.0)

    def probe(release: threading.Event) -> None:
        # Runs while the loop is blocked: this is how a liveness endpoint on its own thread sees it.
        deadline = time.monotonic() + 5.0
        while sampler.current_lag < 0.2 and time.monotonic() < deadline:
            time.sleep(0.005)
        seen["current"] = sampler.current_lag
        seen["max"] = sampler.max_lag_window()
        seen["degraded"] = sampler.degraded(threshold_s=0.05, for_s=0.1)
        seen["not_yet"] = sampler.degraded(threshold_s=0.05, for_s=4.0)
        release.set()

    async def main() -> None:
        task = asyncio.create_task(sampler.run())
        await wait_until(lambda: sampler.sample_count >= 2)
        assert not sampler.degraded(threshold_s=0.05, for_s=0.1)
        release = threading.Event()
        thread = threading.Thread(target=probe, args=(release,))
        thread.start()
        release.wait(5.0)  # block the loop until the probe has looked
        await wait_until(lambda: not thread.is_alive())
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main())
    assert seen["current"] >= 0.2
    assert seen["max"] >= 0.2
    assert seen["degraded"] is True
    assert seen["not_yet"] is False


def test_a_healthy_loop_is_not_degraded_and_has_a_small_lag() -> None:
    async def main() -> LagSampler:
        sampler = LagSampler(interval_s=0.01, threshold_s=0.5)
        task = asyncio.create_task(sampler.run())
        await wait_until(lambda: sampler.sample_count >= 10)
        assert sampler.running
        assert not sampler.degraded(threshold_s=0.5, for_s=0.05)
        assert sampler.max_lag_window() < 0.5
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return sampler

    sampler = run(main())
    assert not sampler.running
    assert sampler.current_lag == 0.0
    assert not sampler.degraded(threshold_s=0.0001, for_s=0.0)
    assert sampler.stall_count == 0


def test_repeated_late_ticks_count_as_degraded_but_one_spike_does_not() -> None:
    async def main() -> tuple[bool, bool]:
        sampler = LagSampler(interval_s=0.01, threshold_s=1.0, window_s=5.0)
        task = asyncio.create_task(sampler.run())
        await wait_until(lambda: sampler.sample_count >= 2)
        time.sleep(0.1)  # one spike  # noqa: ASYNC251
        await wait_until(lambda: sampler.last_lag < 0.05)
        after_spike = sampler.degraded(threshold_s=0.05, for_s=0.2)
        # Now the loop is blocked 60 ms out of every iteration, so every tick comes late, for over 0.4 s.
        count = sampler.sample_count
        started = time.monotonic()
        while time.monotonic() - started < 0.45 or sampler.sample_count < count + 2:
            time.sleep(0.06)  # noqa: ASYNC251
            await asyncio.sleep(0)
        sustained = sampler.degraded(threshold_s=0.05, for_s=0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return after_spike, sustained

    after_spike, sustained = run(main())
    assert after_spike is False
    assert sustained is True


def test_nonsensical_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        LagSampler(interval_s=0)
    with pytest.raises(ConfigError):
        LagSampler(threshold_s=-1)
    with pytest.raises(ConfigError):
        LagSampler(interval_s=1.0, window_s=0.5)
    with pytest.raises(ConfigError):
        LagSampler(window_s=1.0).degraded(threshold_s=0.1, for_s=2.0)
