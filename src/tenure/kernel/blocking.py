"""Bounded offload of blocking calls: seed 000's `BlockingStoreAdapter`, generalised to any callable.

A synchronous call made on the event loop freezes every task of the process (heartbeats, streams, claims).
Moving it to a thread is not enough on its own: without a bound, the pile-up moves from the loop to the
executor queue, and memory, file descriptors and upstream connections run out instead. The adapters here
keep the three promises of seed 000 and close the gaps it leaves open:

1. **One place to offload.** Callers `await adapter.run(fn, *args)`; they never pick an executor.
2. **A bound on calls in flight that follows the operation, not the caller.** A slot is taken before the
   call is handed to a thread and given back in the operation task's done callback, when the thread call
   has really returned. A caller that is cancelled gets `CancelledError` at once, but its slot stays taken
   until the thread returns, so no phantom slot lets an extra call in. The operation task is shielded and
   never exposed; if it is cancelled anyway (for instance by the loop's own shutdown), nobody can prove the
   thread has ended, so the adapter **fails closed**: the slot is written off for good, `failed_closed`
   grows and `on_background_error` is told.
3. **No overstated completion.** `run` returning proves the callable returned; whether an upstream write is
   durable is that upstream's contract.

Beyond the seed: a bounded wait queue (`max_queued`, rejection at once when full), a queue timeout
(`queue_timeout_s`), both as `AdapterOverloaded`; an orderly `close()` (stop admitting, drain, report what
is still running); and counters for metrics. Each adapter owns its executor sized to `max_in_flight`, so
the bound on slots is also a bound on threads (or processes, for `ProcessAdapter`).

An adapter belongs to one event loop, and its state is only touched on that loop's thread.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import contextvars
import functools
import itertools
import logging
import multiprocessing
import multiprocessing.context
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from tenure.contracts.errors import AdapterClosed, AdapterOverloaded, AdapterSlotLost, ConfigError, HandlerAborted
from tenure.contracts.text import describe_error

__all__ = ["BlockingAdapter", "ProcessAdapter"]

P = ParamSpec("P")
T = TypeVar("T")

logger = logging.getLogger("tenure.blocking")


def _log_background_error(exc: BaseException) -> None:
    """Default `on_background_error`: an error nobody is waiting for must still be seen."""
    logger.error("offloaded call failed with no caller waiting for it: %r", exc, exc_info=exc)


class _BoundedOffload:
    """The admission, slot and shutdown logic shared by the thread and the process adapters.

    Slots are counted by hand rather than with `asyncio.Semaphore` because the adapter needs what the
    semaphore hides: the number of live waiters (to bound the queue), a way to hand a freed slot straight
    to the oldest waiter (FIFO, no barging), and a way to turn every waiter away at once on `close()`.
    """

    def __init__(
        self,
        name: str,
        max_in_flight: int,
        max_queued: int,
        queue_timeout_s: float,
        on_background_error: Callable[[BaseException], None] | None,
        make_executor: Callable[[], concurrent.futures.Executor],
    ) -> None:
        if max_in_flight < 1:
            raise ConfigError(f"adapter {name!r}: max_in_flight must be at least 1, got {max_in_flight}")
        if max_queued < 0:
            raise ConfigError(f"adapter {name!r}: max_queued must not be negative, got {max_queued}")
        if not queue_timeout_s > 0:
            raise ConfigError(f"adapter {name!r}: queue_timeout_s must be positive, got {queue_timeout_s}")
        self._name = name
        self._max_in_flight = max_in_flight
        self._max_queued = max_queued
        self._queue_timeout_s = queue_timeout_s
        self._on_background_error = on_background_error or _log_background_error
        self._executor = make_executor()  # only once the settings are known to be sane
        self._loop: asyncio.AbstractEventLoop | None = None
        self._free = max_in_flight
        # Futures of callers waiting for a slot, oldest first. A freed slot is handed to the oldest live one.
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        # The operation tasks whose call has not been seen to end. Internal: a task in here must never be
        # cancelled (see the module docstring). Tests reach into it on purpose to prove the fail-closed path.
        self._running: set[asyncio.Task[Any]] = set()
        # Operation tasks whose caller left (was cancelled): their errors go to `on_background_error`.
        self._abandoned: set[asyncio.Task[Any]] = set()
        self._closing = False
        self._sequence = itertools.count(1)
        self._failed_closed = 0
        self._completed = 0
        self._rejected_queue_full = 0
        self._rejected_queue_timeout = 0

    # -- introspection (for metrics) -------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The adapter's name, used in thread names, error messages and the `adapter` metric label."""
        return self._name

    @property
    def max_in_flight(self) -> int:
        """The configured bound on calls in flight (and the size of the executor)."""
        return self._max_in_flight

    @property
    def max_queued(self) -> int:
        """The configured bound on callers waiting for a slot."""
        return self._max_queued

    @property
    def in_flight(self) -> int:
        """Slots held now: calls running in the executor, plus callers that were just granted a slot.

        Written-off slots are not counted (see `failed_closed`), so
        `in_flight + free_slots + failed_closed == max_in_flight` always holds.
        """
        return self._max_in_flight - self._free - self._failed_closed

    @property
    def free_slots(self) -> int:
        """Slots nobody holds now."""
        return self._free

    @property
    def queued(self) -> int:
        """Callers waiting for a slot now."""
        return sum(1 for waiter in self._waiters if not waiter.done())

    @property
    def failed_closed(self) -> int:
        """Slots written off because an operation task was cancelled (never given back)."""
        return self._failed_closed

    @property
    def completed(self) -> int:
        """Calls whose executor call ended (returned or raised) and whose slot came back."""
        return self._completed

    @property
    def rejected_queue_full(self) -> int:
        """Calls rejected at once because `max_queued` callers were already waiting."""
        return self._rejected_queue_full

    @property
    def rejected_queue_timeout(self) -> int:
        """Calls rejected because they waited longer than `queue_timeout_s` for a slot."""
        return self._rejected_queue_timeout

    @property
    def closing(self) -> bool:
        """True once `close()` has been called: no new call is admitted."""
        return self._closing

    # -- the call path ---------------------------------------------------------------------------------

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run `fn(*args, **kwargs)` in the executor, within the bound, and return its result.

        Raises `AdapterOverloaded` if the wait queue is full or the wait for a slot exceeds
        `queue_timeout_s`, `AdapterClosed` once `close()` was called, and `AdapterSlotLost` if this call's
        operation task was cancelled under it (the caller itself was not). An exception raised by `fn`
        propagates unchanged. If the caller is cancelled, the call keeps running and keeps its slot until it
        returns; an error it raises then goes to `on_background_error`.
        """
        loop = self._bind_loop()
        await self._acquire_slot(loop)
        try:
            if self._closing:
                # close() began while this caller was being granted its slot.
                raise AdapterClosed(f"adapter {self._name!r} is closed")
            call = self._prepare(functools.partial(fn, *args, **kwargs))
            operation = loop.create_task(self._operate(loop, call), name=f"tenure-{self._name}-{next(self._sequence)}")
        except BaseException:
            self._give_back_slot()
            raise
        self._running.add(operation)
        operation.add_done_callback(self._operation_done)
        try:
            # The shield is what keeps the slot honest: cancelling the caller must not cancel the operation.
            return await asyncio.shield(operation)
        except asyncio.CancelledError:
            self._caller_left(operation)
            raise

    def _caller_left(self, operation: asyncio.Task[Any]) -> None:
        """Bookkeeping for a caller that got `CancelledError` from the shield (raises instead if unasked)."""
        if operation.cancelled():
            caller = asyncio.current_task()
            if caller is not None and caller.cancelling() == 0:
                # Nobody cancelled this caller: its operation was cancelled under it. Say so, instead of
                # leaking a CancelledError that a TaskGroup would mistake for a cancellation of the caller.
                raise AdapterSlotLost(
                    f"adapter {self._name!r}: the operation task was cancelled; its slot is written off"
                ) from None
            return
        if operation.done():
            # It ended in the same loop iteration as the cancellation: its outcome now has no reader.
            exc = operation.exception()
            if exc is not None:
                self._report(exc)
        else:
            self._abandoned.add(operation)

    async def _operate(self, loop: asyncio.AbstractEventLoop, call: Callable[[], T]) -> T:
        """The operation task's body: hand `call` to the executor and wait for it. A call that raised SystemExit
        or KeyboardInterrupt failed, nothing more: raised as is inside a task, asyncio would re-raise it out of
        the event loop and end the process."""
        try:
            return await loop.run_in_executor(self._executor, call)
        except (SystemExit, KeyboardInterrupt, GeneratorExit) as exc:
            raise HandlerAborted(describe_error(exc)) from None

    def _prepare(self, call: Callable[[], T]) -> Callable[[], T]:
        """Adapt the call before it is submitted (the thread adapter carries context variables)."""
        return call

    def _operation_done(self, operation: asyncio.Task[Any]) -> None:
        """Done callback of an operation task: the only place a slot of a started call comes back."""
        self._running.discard(operation)
        abandoned = operation in self._abandoned
        self._abandoned.discard(operation)
        if operation.cancelled():
            # Fail closed: the executor call may still be running, and a slot given back now could let
            # max_in_flight + 1 calls run at once. Capacity shrinks by one instead, visibly.
            self._failed_closed += 1
            self._report(
                AdapterSlotLost(
                    f"adapter {self._name!r}: operation task {operation.get_name()!r} was cancelled; "
                    f"its slot is written off ({self._failed_closed} so far)"
                )
            )
            return
        self._completed += 1
        self._give_back_slot()
        # Always retrieve the exception, so an abandoned failure is not also logged as "never retrieved".
        exc = operation.exception()
        if exc is not None and abandoned:
            self._report(exc)

    def _report(self, exc: BaseException) -> None:
        """Tell `on_background_error`; a failing callback is logged, never let to break the bookkeeping."""
        try:
            self._on_background_error(exc)
        except Exception:
            logger.exception("on_background_error of adapter %r raised", self._name)

    # -- slots -----------------------------------------------------------------------------------------

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        """Return the running loop, binding the adapter to it on first use."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            # A programming error, reported like asyncio's own primitives do: the slot state is loop-local.
            raise RuntimeError(f"adapter {self._name!r} is bound to a different event loop")
        return loop

    async def _acquire_slot(self, loop: asyncio.AbstractEventLoop) -> None:
        """Take a slot, waiting in the bounded FIFO queue if none is free."""
        if self._closing:
            raise AdapterClosed(f"adapter {self._name!r} is closed")
        # A freed slot goes straight to a live waiter, so a free slot means nobody live is waiting.
        if self._free > 0:
            self._free -= 1
            return
        waiting = self.queued
        if waiting >= self._max_queued:
            self._rejected_queue_full += 1
            raise AdapterOverloaded(
                f"adapter {self._name!r} is overloaded: {self.in_flight} calls in flight and {waiting} "
                f"waiting (max_queued={self._max_queued}); queue full, rejected at once",
                reason="queue_full",
            )
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(self._queue_timeout_s):
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                # The slot was handed over in the same instant this caller left: pass it on, not lose it.
                self._give_back_slot()
            else:
                waiter.cancel()
            if isinstance(exc, TimeoutError):
                self._rejected_queue_timeout += 1
                raise AdapterOverloaded(
                    f"adapter {self._name!r} is overloaded: waited {self._queue_timeout_s} s for a slot "
                    f"(queue_timeout_s) with {self.in_flight} calls in flight; queue timeout, rejected",
                    reason="queue_timeout",
                ) from None
            raise
        finally:
            with contextlib.suppress(ValueError):  # already popped if it was granted or closed
                self._waiters.remove(waiter)

    def _give_back_slot(self) -> None:
        """Hand a slot to the oldest live waiter, or mark it free."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1

    # -- shutdown --------------------------------------------------------------------------------------

    async def close(self, timeout_s: float) -> int:
        """Stop admitting, wait up to `timeout_s` for calls in flight, shut the executor down.

        New calls and callers still waiting for a slot get `AdapterClosed`. Calls already in the executor
        are not interrupted (a thread cannot be); their callers still get their results. Returns how many
        were still running when the wait ended (0 means a clean drain). Calling it again is harmless.
        """
        self._closing = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(AdapterClosed(f"adapter {self._name!r} closed while this call waited"))
        try:
            pending = {operation for operation in self._running if not operation.done()}
            if pending:
                # asyncio.wait never cancels what it waits for, even if close() itself is cancelled.
                await asyncio.wait(pending, timeout=timeout_s)
            return sum(1 for operation in self._running if not operation.done())
        finally:
            self._shutdown_executor()

    def _shutdown_executor(self) -> None:
        """Release the executor without blocking the loop: running calls finish on their own."""
        self._executor.shutdown(wait=False, cancel_futures=True)


class BlockingAdapter(_BoundedOffload):
    """Bounded offload of blocking calls to a dedicated thread pool (seed 000's adapter).

    Use one per kind of blocking boundary (object store, sync HTTP SDK, file I/O, …), sized for what that
    boundary can take. `ctx.to_thread` and plain `def` handlers go through one. Context variables of the
    caller are visible in the thread, as with `asyncio.to_thread`.

    The callable must be safe to run from several threads at once (up to `max_in_flight`); if a shared
    client is not, use one client per thread or per call, or `max_in_flight=1`.
    """

    def __init__(
        self,
        name: str,
        max_in_flight: int,
        max_queued: int,
        queue_timeout_s: float,
        on_background_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        """Create the adapter and its own `ThreadPoolExecutor` of `max_in_flight` threads named `tenure-NAME`.

        `on_background_error` is called on the loop thread with errors nobody is waiting for: those of calls
        whose caller was cancelled, and `AdapterSlotLost` when an operation task is cancelled. It defaults
        to logging them on the `tenure.blocking` logger.
        """
        super().__init__(
            name,
            max_in_flight,
            max_queued,
            queue_timeout_s,
            on_background_error,
            lambda: concurrent.futures.ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix=f"tenure-{name}"),
        )

    def _prepare(self, call: Callable[[], T]) -> Callable[[], T]:
        """Run the call in a copy of the caller's context, so context variables (job ids in logs) follow."""
        context = contextvars.copy_context()
        return functools.partial(context.run, call)


def _default_process_context() -> multiprocessing.context.BaseContext:
    """`forkserver` where it exists, else `spawn`; never `fork`.

    The process that creates the pool is multi-threaded (blocking adapters, the lag watchdog, the driver's
    threads): forking it can copy a lock held by another thread and deadlock the child.
    """
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    return multiprocessing.get_context(method)


class ProcessAdapter(_BoundedOffload):
    """Bounded offload of CPU-bound work to a dedicated process pool (`ctx.to_process`).

    Threads only help with calls that release the GIL (blocking I/O, most C extensions); Python code that
    holds the GIL for long must leave the process, or it still slows the loop. Same admission rules as
    `BlockingAdapter`. The callable and its arguments and result must pickle; context variables do not
    cross the process boundary. If a worker process dies, the pool is broken and every later call raises
    `concurrent.futures.process.BrokenProcessPool`: close the adapter and make a new one.
    """

    def __init__(
        self,
        name: str,
        max_in_flight: int,
        max_queued: int,
        queue_timeout_s: float,
        on_background_error: Callable[[BaseException], None] | None = None,
        mp_context: multiprocessing.context.BaseContext | None = None,
    ) -> None:
        """Create the adapter; its own `ProcessPoolExecutor` of at most `max_in_flight` processes comes later.

        `mp_context` defaults to `forkserver` (or `spawn` where that is missing), see
        `_default_process_context`. `on_background_error` is as for `BlockingAdapter`.
        """
        # Everything a process pool does outside the worker processes blocks: creating it (semaphores, the
        # resource tracker), submitting (it may start a process, and the first time the fork server) and
        # shutting it down (a pipe write). None of it may run on the loop, so all of it runs on one small
        # "submitter" thread, which alone touches the pool: the base class's executor is that thread.
        super().__init__(
            name,
            max_in_flight,
            max_queued,
            queue_timeout_s,
            on_background_error,
            lambda: concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"tenure-{name}-submit"),
        )
        self._mp_context = mp_context
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None  # created on first use

    def _submit(self, call: Callable[[], T]) -> concurrent.futures.Future[T]:
        """On the submitter thread: create the pool if needed and hand it the call."""
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=self._max_in_flight, mp_context=self._mp_context or _default_process_context()
            )
        return self._pool.submit(call)

    def _shutdown_pool(self) -> None:
        """On the submitter thread: let the pool wind down; running calls finish on their own."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    async def _operate(self, loop: asyncio.AbstractEventLoop, call: Callable[[], T]) -> T:
        """Submit from the submitter thread, then wait for the worker process's result on the loop."""
        future = await loop.run_in_executor(self._executor, self._submit, call)
        return await asyncio.wrap_future(future)

    def _shutdown_executor(self) -> None:
        """Queue the pool's shutdown behind any submission in progress, then release the submitter thread."""
        self._executor.submit(self._shutdown_pool)
        self._executor.shutdown(wait=False)
