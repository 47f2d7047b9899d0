"""The bounded offload adapter of seed 000 (`tenure.kernel.blocking`).

Each test runs its own event loop with `asyncio.run`. Blocking functions are held on `threading.Event`s and
the loop side waits for conditions with a deadline, so no test depends on how fast the machine is.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pytest

from tenure.contracts.errors import AdapterClosed, AdapterOverloaded, AdapterSlotLost, ConfigError
from tenure.kernel.blocking import BlockingAdapter, ProcessAdapter

T = TypeVar("T")

HOLD_S = 10.0  # how long a held thread waits for its release before giving up (a test failure, not a hang)


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


async def settle(iterations: int = 20) -> None:
    """Let the loop run a number of iterations (for asserting that something does *not* happen)."""
    for _ in range(iterations):
        await asyncio.sleep(0)


class Held:
    """A blocking function whose calls start, then wait on the test's release."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, value: str = "done", fail: bool = False) -> str:
        with self.lock:
            self.calls += 1
        self.started.set()
        if not self.release.wait(HOLD_S):
            raise TimeoutError("the test never released this call")
        if fail:
            raise ValueError(f"failed after release: {value}")
        return value


def adapter(**overrides: Any) -> BlockingAdapter:
    """An adapter with test defaults."""
    options: dict[str, Any] = {
        "name": "test",
        "max_in_flight": 1,
        "max_queued": 4,
        "queue_timeout_s": 5.0,
    }
    options.update(overrides)
    return BlockingAdapter(**options)


async def expect_cancelled(task: Awaitable[Any]) -> None:
    """Await a task that must end cancelled."""
    with pytest.raises(asyncio.CancelledError):
        await task


def test_a_call_returns_its_result_and_propagates_its_error() -> None:
    async def main() -> None:
        blocking = adapter()
        assert await blocking.run(lambda a, b: a + b, 2, b=3) == 5
        with pytest.raises(ZeroDivisionError):
            await blocking.run(lambda: 1 / 0)
        assert blocking.completed == 2
        assert blocking.in_flight == 0
        assert await blocking.close(1.0) == 0

    run(main())


def test_the_call_runs_in_a_named_thread_off_the_loop() -> None:
    async def main() -> None:
        blocking = adapter(name="store")
        name = await blocking.run(lambda: threading.current_thread().name)
        assert name.startswith("tenure-store")
        assert name != threading.current_thread().name
        await blocking.close(1.0)

    run(main())


def test_cancelling_the_caller_does_not_free_the_slot_before_the_thread_returns() -> None:
    async def main() -> None:
        blocking = adapter(max_in_flight=1)
        held = Held()
        caller = asyncio.create_task(blocking.run(held, "first"))
        await wait_until(held.started.is_set)

        caller.cancel()
        await expect_cancelled(caller)
        # The caller is gone, but its thread still runs: the slot must still be taken.
        assert blocking.in_flight == 1
        assert blocking.free_slots == 0

        second = asyncio.create_task(blocking.run(lambda: "second"))
        await wait_until(lambda: blocking.queued == 1)
        await settle()
        assert not second.done(), "a second call got in while the first one's thread was still running"

        held.release.set()
        assert await asyncio.wait_for(second, 5.0) == "second"
        assert blocking.completed == 2
        assert blocking.in_flight == 0
        assert blocking.failed_closed == 0
        assert await blocking.close(1.0) == 0

    run(main())


def test_an_error_of_a_call_whose_caller_left_goes_to_on_background_error() -> None:
    async def main() -> None:
        errors: list[BaseException] = []
        blocking = adapter(on_background_error=errors.append)
        held = Held()
        caller = asyncio.create_task(blocking.run(held, "orphan", fail=True))
        await wait_until(held.started.is_set)
        caller.cancel()
        await expect_cancelled(caller)

        held.release.set()
        await wait_until(lambda: blocking.completed == 1)
        assert len(errors) == 1
        assert isinstance(errors[0], ValueError)
        assert "orphan" in str(errors[0])
        await blocking.close(1.0)

    run(main())


def test_an_error_seen_by_its_caller_is_not_also_reported_in_the_background() -> None:
    async def main() -> None:
        errors: list[BaseException] = []
        blocking = adapter(on_background_error=errors.append)
        held = Held()
        held.release.set()
        with pytest.raises(ValueError):
            await blocking.run(held, "seen", fail=True)
        assert errors == []
        await blocking.close(1.0)

    run(main())


def test_n_plus_one_calls_with_a_bound_of_n_run_at_most_n_at_once() -> None:
    bound = 3
    lock = threading.Lock()
    gate = threading.Event()
    now_running = 0
    max_seen = 0

    def work(i: int) -> int:
        nonlocal now_running, max_seen
        with lock:
            now_running += 1
            max_seen = max(max_seen, now_running)
        try:
            if not gate.wait(HOLD_S):
                raise TimeoutError("the test never opened the gate")
            return i
        finally:
            with lock:
                now_running -= 1

    def running() -> int:
        with lock:
            return now_running

    async def main() -> None:
        blocking = adapter(max_in_flight=bound, max_queued=bound)
        calls = [asyncio.create_task(blocking.run(work, i)) for i in range(bound + 1)]
        # The first N are inside `work` at the same time; the last one must be waiting, not running.
        await wait_until(lambda: running() == bound and blocking.queued == 1)
        await settle()
        assert running() == bound
        assert blocking.in_flight == bound

        gate.set()
        assert await asyncio.wait_for(asyncio.gather(*calls), 5.0) == list(range(bound + 1))
        assert max_seen == bound
        assert blocking.completed == bound + 1
        await blocking.close(1.0)

    run(main())


def test_a_cancelled_operation_task_fails_closed() -> None:
    async def main() -> None:
        errors: list[BaseException] = []
        blocking = adapter(max_in_flight=1, queue_timeout_s=0.05, on_background_error=errors.append)
        held = Held()
        caller = asyncio.create_task(blocking.run(held))
        await wait_until(held.started.is_set)

        # Test-only: reach into the adapter's internal set of operation tasks (documented in blocking.py as
        # the one thing that must never be done in production) to cancel the operation itself.
        (operation,) = blocking._running
        operation.cancel()

        # The caller was not cancelled, so it is told what happened instead of seeing a stray CancelledError.
        with pytest.raises(AdapterSlotLost):
            await caller
        assert blocking.failed_closed == 1
        assert len(errors) == 1 and isinstance(errors[0], AdapterSlotLost)

        # Even after the thread returns, the slot is never given back.
        held.release.set()
        await settle()
        assert blocking.free_slots == 0
        assert blocking.in_flight == 0
        with pytest.raises(AdapterOverloaded) as rejected:
            await blocking.run(lambda: "never runs")
        assert rejected.value.reason == "queue_timeout"
        await blocking.close(1.0)

    run(main())


def test_the_loop_shutting_down_under_a_running_call_fails_closed() -> None:
    """asyncio.run cancels every task left when its main coroutine returns, operation tasks included."""
    errors: list[BaseException] = []
    held = Held()
    blocking = adapter(max_in_flight=1, on_background_error=errors.append)

    async def main() -> None:
        asyncio.create_task(blocking.run(held))  # noqa: RUF006 - left running on purpose
        await wait_until(held.started.is_set)

    try:
        run(main())
        assert blocking.failed_closed == 1
        assert blocking.free_slots == 0
        assert len(errors) == 1 and isinstance(errors[0], AdapterSlotLost)
    finally:
        held.release.set()
        run(blocking.close(1.0))


def test_a_full_queue_rejects_at_once() -> None:
    async def main() -> None:
        blocking = adapter(max_in_flight=1, max_queued=1, queue_timeout_s=5.0)
        held = Held()
        first = asyncio.create_task(blocking.run(held))
        await wait_until(held.started.is_set)
        second = asyncio.create_task(blocking.run(lambda: "second"))
        await wait_until(lambda: blocking.queued == 1)

        third = blocking.run(lambda: "third")
        with pytest.raises(AdapterOverloaded) as rejected:
            # Well under queue_timeout_s: a full queue must not make the caller wait at all.
            await asyncio.wait_for(third, 1.0)
        assert rejected.value.reason == "queue_full"
        assert "queue full" in str(rejected.value)
        assert blocking.rejected_queue_full == 1

        held.release.set()
        assert await asyncio.wait_for(first, 5.0) == "done"
        assert await asyncio.wait_for(second, 5.0) == "second"
        await blocking.close(1.0)

    run(main())


def test_no_queue_at_all_rejects_every_call_beyond_the_bound() -> None:
    async def main() -> None:
        blocking = adapter(max_in_flight=1, max_queued=0)
        held = Held()
        first = asyncio.create_task(blocking.run(held))
        await wait_until(held.started.is_set)
        with pytest.raises(AdapterOverloaded):
            await blocking.run(lambda: None)
        held.release.set()
        await asyncio.wait_for(first, 5.0)
        await blocking.close(1.0)

    run(main())


def test_a_caller_waiting_past_the_queue_timeout_is_rejected() -> None:
    async def main() -> None:
        blocking = adapter(max_in_flight=1, max_queued=4, queue_timeout_s=0.05)
        held = Held()
        first = asyncio.create_task(blocking.run(held))
        await wait_until(held.started.is_set)

        with pytest.raises(AdapterOverloaded) as rejected:
            await asyncio.wait_for(blocking.run(lambda: "late"), 5.0)
        assert rejected.value.reason == "queue_timeout"
        assert "queue timeout" in str(rejected.value)
        assert blocking.rejected_queue_timeout == 1
        assert blocking.queued == 0

        held.release.set()
        await asyncio.wait_for(first, 5.0)
        # The timed-out waiter did not take a slot with it.
        assert blocking.free_slots == 1
        assert await blocking.run(lambda: "after") == "after"
        await blocking.close(1.0)

    run(main())


def test_a_cancelled_waiter_leaves_the_queue_without_taking_a_slot() -> None:
    async def main() -> None:
        blocking = adapter(max_in_flight=1, max_queued=4)
        held = Held()
        first = asyncio.create_task(blocking.run(held))
        await wait_until(held.started.is_set)
        waiter = asyncio.create_task(blocking.run(lambda: "never"))
        await wait_until(lambda: blocking.queued == 1)
        waiter.cancel()
        await expect_cancelled(waiter)
        assert blocking.queued == 0

        held.release.set()
        await asyncio.wait_for(first, 5.0)
        assert blocking.free_slots == 1
        await blocking.close(1.0)

    run(main())


def test_close_drains_calls_in_flight_and_rejects_new_and_waiting_ones() -> None:
    async def main() -> None:
        blocking = adapter(max_in_flight=2, max_queued=4)
        held = Held()
        in_flight = [asyncio.create_task(blocking.run(held, f"call-{i}")) for i in range(2)]
        await wait_until(lambda: blocking.in_flight == 2 and held.calls == 2)
        waiting = asyncio.create_task(blocking.run(lambda: "waiting"))
        await wait_until(lambda: blocking.queued == 1)

        closing = asyncio.create_task(blocking.close(5.0))
        await wait_until(lambda: blocking.closing)
        with pytest.raises(AdapterClosed):
            await waiting
        with pytest.raises(AdapterClosed):
            await blocking.run(lambda: "new")
        await settle()
        assert not closing.done(), "close() returned while calls were still in flight"

        held.release.set()
        assert await asyncio.wait_for(closing, 5.0) == 0
        assert [await call for call in in_flight] == ["call-0", "call-1"]
        assert blocking.completed == 2

    run(main())


def test_close_returns_how_many_calls_were_still_running_at_its_timeout() -> None:
    async def main() -> None:
        blocking = adapter(max_in_flight=2)
        held = Held()
        call = asyncio.create_task(blocking.run(held, "slow"))
        await wait_until(held.started.is_set)
        assert await blocking.close(0.05) == 1
        # The call is not interrupted; its caller still gets the result once the thread returns.
        held.release.set()
        assert await asyncio.wait_for(call, 5.0) == "slow"

    run(main())


def test_an_adapter_belongs_to_one_event_loop() -> None:
    blocking = adapter()
    assert run(blocking.run(lambda: 1)) == 1
    with pytest.raises(RuntimeError, match="different event loop"):
        run(blocking.run(lambda: 2))
    run(blocking.close(1.0))


def test_nonsensical_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError):
        adapter(max_in_flight=0)
    with pytest.raises(ConfigError):
        adapter(max_queued=-1)
    with pytest.raises(ConfigError):
        adapter(queue_timeout_s=0)


def test_context_variables_follow_the_call_into_the_thread() -> None:
    import contextvars

    job_id: contextvars.ContextVar[str] = contextvars.ContextVar("job_id")

    async def main() -> None:
        blocking = adapter()
        job_id.set("job-42")
        assert await blocking.run(job_id.get) == "job-42"
        await blocking.close(1.0)

    run(main())


def test_the_process_adapter_runs_calls_in_another_process_within_the_same_rules() -> None:
    async def main() -> None:
        processes = ProcessAdapter("cpu", max_in_flight=1, max_queued=0, queue_timeout_s=30.0)
        try:
            first = asyncio.create_task(processes.run(os.getpid))
            await wait_until(lambda: processes.in_flight == 1)
            # Bound 1, no queue: a second call while the first is in flight is rejected at once.
            with pytest.raises(AdapterOverloaded):
                await processes.run(os.getpid)
            child = await asyncio.wait_for(first, 30.0)
            assert child != os.getpid()
            assert await asyncio.wait_for(processes.run(pow, 2, 10), 30.0) == 1024
            assert processes.completed == 2
        finally:
            assert await processes.close(30.0) == 0

    run(main())
