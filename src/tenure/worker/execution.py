"""One started execution: its fence, its event sequence, its handler's own task, and its finish.

An `Execution` is the `ExecutionPort` its handler's `Context` writes through. Every write carries the fence
(job, epoch, token); once the job is no longer owned by this execution, or the execution has ended, nothing
more is written and every `ctx` call raises `OwnershipLost`. It receives what it needs (`Env`: the store, the
completer, the slots, the observer, the adapters, the quotas) and holds no reference to the worker.

`run()` never raises (but for the cancellation of the worker's own task group): whatever a handler does —
raise an exception whose `str()` raises, raise SystemExit, KeyboardInterrupt or GeneratorExit, ignore its
cancellation, return a value no store can hold — ends its own job, never the worker or another execution.
What an end writes is `outcome_of`'s table.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

from tenure.contracts.artifacts import ArtifactStore, looks_like_stub
from tenure.contracts.errors import (
    ConfigError,
    HandlerAborted,
    JobCancelled,
    OwnershipLost,
    PermanentError,
    StoreUnavailable,
)
from tenure.contracts.states import JobState
from tenure.contracts.store import Store
from tenure.contracts.text import describe_error, dumps
from tenure.contracts.types import Claim, Command, Finish, Job, NewEvent, Started
from tenure.control.admission import Admission
from tenure.control.quota_blocks import ExecutionQuotas
from tenure.control.quotas import QuotaManager
from tenure.control.retry import backoff_s
from tenure.kernel.blocking import BlockingAdapter, ProcessAdapter
from tenure.kernel.context import Context
from tenure.kernel.registry import Agent
from tenure.observability.logs import bind_log_context
from tenure.worker.audit import ExecutionAudit
from tenure.worker.byref import by_reference, probably_large
from tenure.worker.children import ExecutionChildren
from tenure.worker.completer import Completer
from tenure.worker.config import WorkerConfig
from tenure.worker.faults import Faults
from tenure.worker.observe import WorkerObserver
from tenure.worker.outcomes import HandlerTimeout, Outcome, outcome_of
from tenure.worker.slots import Slots
from tenure.worker.timeouts import timeouts_for, wait_within

log = logging.getLogger("tenure.worker")
T = TypeVar("T")

# A waiting execution polls the store for its commands (persisted by the gateway before delivery) or its children.
_WAIT_POLL_MIN_S = 0.05
_WAIT_POLL_MAX_S = 1.0


@dataclass(slots=True)
class Env:
    """What every execution of one worker shares."""

    worker_id: str
    config: WorkerConfig
    store: Store
    completer: Completer
    slots: Slots
    observer: WorkerObserver
    faults: Faults
    adapter: BlockingAdapter
    process_adapter: Callable[[], ProcessAdapter]
    quotas: QuotaManager | None
    abandoned: set[asyncio.Task[Any]]
    """Handlers that ignored their cancellation and run on after their execution ended."""
    artifacts: ArtifactStore | None = None
    """Where results and evidence over the threshold go (docs/artifacts.md); None: inline, at most 1 MiB."""
    admission: Admission | None = None
    """The door children come in by (`ctx.spawn`); None (a worker built without one): one built on first use over
    the store, with the default limits, knowing the child agents from the live registry."""


async def _call_handler(agent: Agent, ctx: Context, payload: Any, adapter: BlockingAdapter) -> Any:
    """The handler's call, in its own task. The three exceptions that are not `Exception`s become one here:
    asyncio re-raises SystemExit and KeyboardInterrupt out of any task into the event loop (ending the
    process), and GeneratorExit would escape the execution into the worker's task group."""
    try:
        if agent.is_async:
            return await agent.handler(ctx, payload)
        return await adapter.run(agent.handler, ctx, payload)
    except (SystemExit, KeyboardInterrupt, GeneratorExit) as exc:
        raise HandlerAborted(describe_error(exc)) from None


def _encode(result: Any) -> str:
    try:
        return dumps(result)
    except (TypeError, ValueError, RecursionError) as exc:
        raise PermanentError(f"the result cannot be stored: {describe_error(exc)}") from exc


class Execution:
    """One started execution (see the module docstring)."""

    def __init__(
        self, env: Env, claim: Claim, started: Started, agent: Agent, on_end: Callable[[str], Awaitable[None]]
    ) -> None:
        self.env = env
        self.claim = claim
        self.agent = agent
        self.fence = started.fence
        self.execution_id = started.execution_id
        self.started_at = started.started_at
        self.attempt = started.attempt
        self._on_end = on_end
        self.seq = 1  # seq 1 is execution.started, written by the start CAS
        self.emitted = False  # the handler emitted an event (the first one is timed: tenure_first_event_seconds)
        self.paused = False  # it was `waiting` once: its timeouts are the job's timeout_s alone (worker/timeouts.py)
        self.lost = False
        self.finishing = False
        self.closed = False  # the execution ended (or abandoned its handler): its port writes nothing more
        self.cancel_requested = False
        self.unwritten = 0
        self.usage: dict[str, float] = {}
        self.task: asyncio.Task[None] | None = None  # run()'s task, set by whoever spawned it
        self.handler: asyncio.Task[Any] | None = None  # the handler's own task
        self.command_seq = 0  # the last command read from the store
        self.commands: list[Command] = []  # read, not yet consumed (another kind than the one awaited)
        self.commands_ready = asyncio.Event()  # set by the control loop when a new command is persisted
        self.journal = ExecutionAudit(self, env.config.prices)  # ctx.tool_call / evidence / usage / step
        self.children = ExecutionChildren(self)  # ctx.spawn / gather
        self.quotas: ExecutionQuotas | None = (
            ExecutionQuotas(env.quotas, self.execution_id) if env.quotas is not None else None
        )

    # -- stopped from outside ----------------------------------------------------------------------------------------
    def lose(self) -> None:
        """This worker no longer owns the job: stop, and write nothing more for it."""
        if self.lost or self.finishing:
            return
        self.lost = True
        job_id = self.fence.job_id
        log.warning(
            "job %s: ownership lost (epoch %d); stopping its execution",
            job_id,
            self.fence.epoch,
            extra={
                "state": JobState.LOST.value,
                "error_code": "owner_lost",
                "job_id": job_id,
                "execution_id": self.execution_id,
                "epoch": self.fence.epoch,
                "agent": self.claim.agent,
            },
        )
        if self.task is not None and self.task is not asyncio.current_task():
            self.task.cancel(f"OwnershipLost: job {job_id} epoch {self.fence.epoch}")
        if self.handler is not None and not self.handler.done() and self.handler is not asyncio.current_task():
            # At once, not when the run task gets to _stop_handler: the handler's next step may be a side effect.
            self.handler.cancel(f"OwnershipLost: job {job_id} epoch {self.fence.epoch}")

    def cancel(self) -> None:
        """A cancel request for the job: stop the handler; the finish writes `cancelled`."""
        if self.cancel_requested or self.lost:
            return
        self.cancel_requested = True
        if self.task is not None:
            self.task.cancel(f"JobCancelled: job {self.fence.job_id}")

    # -- the run -----------------------------------------------------------------------------------------------------
    async def run(self, shutting_down: Callable[[], bool]) -> None:
        """Run to the finish CAS. `shutting_down()`: the drain timed out and cancelled this execution."""
        env, claim = self.env, self.claim
        began = time.monotonic()
        bind_log_context(  # this task's own context: every line logged for this job names it
            job_id=claim.fence.job_id,
            execution_id=self.execution_id,
            worker_id=env.worker_id,
            agent=claim.agent,
            epoch=claim.fence.epoch,
        )
        slot_held = True
        try:
            try:
                finish = await self._success(await self._run_handler())
            except asyncio.CancelledError:
                # Stopped from outside: ownership lost, a cancel request, or the drain timed out. Anything else
                # is the cancellation of the worker's own task group, which must go on.
                if not (self.lost or self.cancel_requested or shutting_down()):
                    raise
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
                if self.lost:
                    return
                if self.cancel_requested:
                    finish = self._finish(Outcome(JobState.CANCELLED, "cancelled", "cancelled"))
                else:
                    finish = self._finish(
                        Outcome(JobState.SCHEDULED, "worker_shutdown", "the worker shut down before the job finished")
                    )
            except Exception as exc:
                outcome = outcome_of(exc)
                if outcome is None:
                    return
                if outcome.code == "error":
                    log.info("job %s attempt %d raised %s", claim.fence.job_id, self.attempt, outcome.message)
                finish = self._finish(outcome)
            # The slot is execution capacity: free it now, while the finish waits for its round trip. A handler
            # that ignored its cancellation keeps its slot until it ends (fail closed, like the blocking adapter).
            if self.handler is None or self.handler.done():
                env.slots.free()
                slot_held = False
            if self.lost:
                return
            # From here the finish CAS is the fence: a heartbeat that races it and no longer finds the claim
            # (because the finish just committed) must not cancel us.
            self.finishing = True
            await env.faults.hit("before_finish", {claim.agent})
            matched = await env.completer.finish(finish)
            if matched and finish.state is JobState.CANCELLED:
                await self.children.cancel_unfinished()  # spawned after the cancel's own cascade read them
            env.observer.finished(
                claim, self.execution_id, finish.state, finish.error_code, time.monotonic() - began, matched,
                timed=not self.paused,
            )  # fmt: skip
            if not matched and not self.lost:
                log.warning("finish of job %s matched no row: ownership was lost", claim.fence.job_id)
        except asyncio.CancelledError:
            raise
        except BaseException:  # the last line: a defect of the worker's own, never the task group's end
            log.exception("execution of job %s failed inside the worker", claim.fence.job_id)
        finally:
            self.closed = True
            if slot_held:
                if self.handler is None or self.handler.done():
                    env.slots.free()
                else:
                    self.handler.add_done_callback(lambda _: env.slots.free())
            try:
                await self._on_end(claim.fence.job_id)
            except Exception:
                log.exception("ending the execution of job %s failed", claim.fence.job_id)
            if self.quotas is not None and self.quotas.blocks:
                with contextlib.suppress(Exception):
                    await self.quotas.release_all()

    async def _success(self, result: Any) -> Finish:
        result_json = await asyncio.to_thread(_encode, result) if probably_large(result) else _encode(result)
        result_json = await by_reference(
            self.env.config, self.env.artifacts, self.fence.job_id, result_json, looks_like_stub(result), "result"
        )
        self.seq += 1
        return self._make_finish(JobState.SUCCEEDED, result_json=result_json)

    def _finish(self, outcome: Outcome) -> Finish:
        """The finish of an outcome: a retryable failure goes back to the queue after a backoff while attempts
        remain, else the job is dead."""
        self.seq += 1
        if outcome.state is not JobState.SCHEDULED:
            return self._make_finish(outcome.state, error_code=outcome.code, error=outcome.message)
        if self.attempt < self.claim.max_attempts:
            delay = backoff_s(self.attempt, self.env.config.retry_base_s, self.env.config.retry_cap_s)
            return self._make_finish(JobState.SCHEDULED, error_code=outcome.code, error=outcome.message, delay=delay)
        return self._make_finish(
            JobState.DEAD, error_code=outcome.code, error=f"{outcome.message} (after {self.attempt} attempts)"
        )

    def _make_finish(
        self,
        state: JobState,
        *,
        result_json: str | None = None,
        error_code: str | None = None,
        error: str | None = None,
        delay: float = 0.0,
    ) -> Finish:
        return Finish(
            self.fence,
            self.execution_id,
            self.started_at,
            state,
            self.seq,
            result_json,
            error_code,
            error,
            delay,
            dumps(self.usage) if self.usage else None,
        )

    async def _run_handler(self) -> Any:
        """Run the handler in a task of its own and return its result, or raise its error (`_call_handler`
        makes every error an `Exception`), or `HandlerTimeout`. When this execution is stopped
        (CancelledError) or times out, the handler is cancelled and given `cancel_grace_s` to end; one that
        ignores cancellation is abandoned, so it cannot hold its execution, its finish or a drain hostage."""
        env, claim = self.env, self.claim
        ctx = Context(
            self,
            job_id=claim.fence.job_id,
            execution_id=self.execution_id,
            epoch=claim.fence.epoch,
            attempt=self.attempt,
            agent=claim.agent,
            tenant=claim.tenant,
            worker_id=env.worker_id,
            mode=claim.mode,
        )
        payload = json.loads(claim.input_json)
        handler = asyncio.get_running_loop().create_task(
            _call_handler(self.agent, ctx, payload, env.adapter), name=f"handler-{claim.fence.job_id}"
        )
        self.handler = handler
        window = env.observer.record.durations.get(claim.agent)
        limits = timeouts_for(self.agent.spec, window, claim.timeout_s, env.config.hard_timeout_floor_s)
        try:
            passed = await wait_within(handler, limits, self._soft_timed_out, lambda: self.paused)
        except asyncio.CancelledError:
            await self._stop_handler(handler)
            raise
        if passed is not None:
            env.observer.timed_out()  # counted now, before its slot frees: health acts before the next claim
            stopped = await self._stop_handler(handler)
            raise HandlerTimeout(passed, stopped, env.config.cancel_grace_s)
        return handler.result()

    def _soft_timed_out(self, elapsed_s: float, threshold_s: float) -> None:
        """Past the soft timeout: logged and counted, and an `execution.soft_timeout` event joins the history
        through the batched writer, like the handler's own. The handler goes on."""
        self.env.observer.soft_timed_out(self.claim, self.execution_id, elapsed_s, threshold_s)
        if self.lost or self.closed or self.finishing:
            return
        self.seq += 1
        payload = dumps({"elapsed_s": round(elapsed_s, 3), "threshold_s": round(threshold_s, 3)})
        self.env.completer.append(NewEvent(self.fence, self.execution_id, self.seq, "execution.soft_timeout", payload))

    async def _stop_handler(self, handler: asyncio.Task[Any]) -> bool:
        """Cancel the handler (again every second: cleanup code may swallow one cancellation) until it ends or
        `cancel_grace_s` passed. False: it ignored every cancellation and runs on, abandoned."""
        grace = self.env.config.cancel_grace_s
        deadline = time.monotonic() + grace
        while not handler.done():
            left = deadline - time.monotonic()
            if left <= 0:
                self.env.abandoned.add(handler)
                handler.add_done_callback(self.env.abandoned.discard)
                log.error(
                    "job %s: the handler ignored its cancellation for %.0f s; abandoned (it keeps its slot until it "
                    "ends, and writes nothing more)",
                    self.fence.job_id,
                    grace,
                )
                self.closed = True  # its port refuses every later write
                return False
            handler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({handler}, timeout=min(1.0, left))
        if not handler.cancelled():
            handler.exception()  # retrieved: the outcome is the stop, not what the handler raised meanwhile
        return True

    # -- ExecutionPort -------------------------------------------------------------------------------------------
    def check(self) -> None:
        if self.lost or self.closed:
            raise OwnershipLost(f"job {self.fence.job_id} is no longer owned by epoch {self.fence.epoch}")
        if self.cancel_requested:
            raise JobCancelled(f"job {self.fence.job_id} was cancelled")

    async def emit(self, type: str, payload_json: str) -> None:
        if self.lost or self.closed:
            self.check()
        if not self.emitted:
            self.emitted = True
            self.env.observer.first_event(self.fence.job_id, self.agent.spec.name)
        self.seq += 1
        self.env.completer.append(NewEvent(self.fence, self.execution_id, self.seq, type, payload_json))
        self.unwritten += 1
        if self.unwritten >= self.env.config.event_buffer:
            await self.flush()

    async def flush(self) -> None:
        self.unwritten = 0
        await self.env.completer.flush()
        if self.lost:
            self.check()

    async def to_thread(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        return await self.env.adapter.run(fn, *args, **kwargs)

    async def to_process(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        return await self.env.process_adapter().run(fn, *args, **kwargs)

    def record_usage(self, counts: dict[str, float], model: str | None = None) -> None:
        for k, v in counts.items():
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ValueError(f"usage counts are finite numbers, not {k}={v!r}")
        for k, v in self.journal.usage(counts, model).items():
            self.usage[k] = self.usage.get(k, 0) + v

    def record_external(self, kind: str, seconds: float) -> None:
        self.env.observer.external(self.agent.spec.name, kind, seconds)

    # -- pause and resume (ctx.next_input, ctx.approval) ---------------------------------------------------------------
    def _take_command(self, kind: str) -> Command | None:
        for i, c in enumerate(self.commands):
            if c.kind == kind:
                return self.commands.pop(i)
        return None

    async def _read_commands(self) -> None:
        new = await self.env.store.read_commands(self.fence.job_id, self.command_seq)
        if new:
            self.command_seq = new[-1].seq
            self.commands.extend(new)

    async def _set_waiting(self, waiting: bool, payload: dict[str, Any]) -> None:
        await self.flush()  # the history stays in order: everything emitted before goes first
        self.seq += 1
        event = NewEvent(
            self.fence, self.execution_id, self.seq, "job.waiting" if waiting else "job.resumed", dumps(payload)
        )
        if not await self.env.store.set_waiting(event, waiting):
            self.lose()
            self.check()

    async def wait_command(self, kind: str, prompt: Any) -> Any:
        self.check()
        await self._read_commands()
        command = self._take_command(kind)
        if command is None:
            async with self.waiting({"for": kind, "prompt": prompt}) as resumed:
                command = await self.poll(self._next_command(kind))
                resumed.update(command=kind, seq=command.seq)
        return command.payload

    def _next_command(self, kind: str) -> Callable[[], Awaitable[Command | None]]:
        async def read() -> Command | None:
            await self._read_commands()
            return self._take_command(kind)

        return read

    @contextlib.asynccontextmanager
    async def waiting(self, why: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """The job is `waiting` (event payload `why`) for the block, holding no worker slot and no quota lease;
        both are taken back before the block's end is written as `job.resumed` with the payload the block left
        in the dict it was given. A block that raises leaves the job to its finish."""
        await self._set_waiting(True, why)
        self.paused = True
        await self.pause_quotas()  # waiting holds no quota lease either (seed 003: pause / resume)
        self.env.slots.free()  # waiting holds no worker slot
        resumed: dict[str, Any] = {}
        try:
            yield resumed
        finally:
            self.env.slots.take()  # a slot back (briefly over the limit at worst: no new claims)
        await self.resume_quotas()  # the leases are taken back before the handler continues
        await self._set_waiting(False, resumed)

    async def poll(self, ready: Callable[[], Awaitable[T | None]]) -> T:
        """`await ready()` until it answers something, woken by the control loop (NOTIFY / polling hint: a new
        command or a cancel) or by a growing poll, the floor (`_WAIT_POLL_MIN_S` to `_WAIT_POLL_MAX_S`): a
        waiting job costs one read per interval, never a busy loop. Raises once the execution must stop."""
        delay = _WAIT_POLL_MIN_S
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.commands_ready.wait(), delay)
            self.commands_ready.clear()
            self.check()
            try:
                got = await ready()
            except StoreUnavailable as exc:
                log.warning("job %s: reading what it waits for failed: %s", self.fence.job_id, exc)
                got = None
            if got is not None:
                return got
            delay = min(delay * 1.5, _WAIT_POLL_MAX_S)

    # -- coordinators (docs/coordinators.md, worker/children.py) --------------------------------------------------
    async def spawn(self, agent: str, input: Any, key: str, options: dict[str, Any]) -> tuple[str, bool]:
        return await self.children.spawn(agent, input, key, options)

    async def wait_children(self, job_ids: Sequence[str]) -> list[Job]:
        return await self.children.wait(job_ids)

    def quota(self, key: str, wait: bool, timeout_s: float | None) -> AbstractAsyncContextManager[object]:
        if self.quotas is None:
            raise ConfigError(f"quota {key!r} requested, but this worker has no quota backend")
        return self.quotas.quota(key, wait=wait, timeout_s=timeout_s)

    async def pause_quotas(self) -> None:
        if self.quotas is not None:
            await self.quotas.pause()

    async def resume_quotas(self) -> None:
        if self.quotas is not None:
            await self.quotas.resume()
