"""One started execution: its fence, its event sequence, its handler (awaited in the execution's own task), and
its finish.

An `Execution` is the `ExecutionPort` its handler's `Context` writes through. Every write carries the fence
(job, epoch, token); once the job is no longer owned by this execution, or the execution has ended, nothing
more is written and every `ctx` call raises `OwnershipLost`. It receives what it needs (`Env`: the store, the
completer, the slots, the observer, the adapters, the quotas) and holds no reference to the worker.

`run()` never raises (but for the cancellation of the worker's own task group): whatever a handler does —
raise an exception whose `str()` raises, raise SystemExit, KeyboardInterrupt or GeneratorExit, ignore its
cancellation, return a value no store can hold — ends its own job, never the worker or another execution.
What an end writes is `outcome_of`'s table, or, for an execution stopped from outside, the stop's own outcome.

One task per job: the handler runs in the execution's task, its timeouts are loop timers (`Deadlines`). A stop (a
cancel request, the hard timeout, the drain's timeout, a lost claim) cancels that task, again every second while
the handler ignores it; a handler that ignores it for `cancel_grace_s` is abandoned: its finish is handed to a
task of its own (`_finish_abandoned`), so it can hold neither its finish nor a drain hostage, and its task keeps
the slot until it does end (fail closed, like the blocking adapter).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

from tenure.contracts.artifacts import ArtifactStore, looks_like_stub
from tenure.contracts.errors import (
    ConfigError,
    JobCancelled,
    OwnershipLost,
)
from tenure.contracts.states import JobState
from tenure.contracts.store import Store
from tenure.contracts.text import dumps
from tenure.contracts.types import Claim, Finish, Job, NewEvent, Started
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
from tenure.worker.outcomes import HandlerTimeout, Outcome, call_handler, encode_result, outcome_of
from tenure.worker.slots import Slots
from tenure.worker.timeouts import Deadlines, timeouts_for
from tenure.worker.waits import ExecutionWaits

log = logging.getLogger("tenure.worker")
T = TypeVar("T")


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
        self.task: asyncio.Task[None] | None = None  # run()'s task (the handler's too), set by whoever spawned it
        self.in_handler = False  # the task is inside the handler: a stop repeats its cancellation, within the grace
        self.stopping: str | None = None  # why it is being stopped from outside: "cancel", "timeout" or "shutdown"
        self.timed_out_s: float | None = None  # the hard timeout that passed (None: its timeout_s)
        self.abandoned = False  # the handler ignored its stop for cancel_grace_s: another task writes the finish
        self._slot_held = True
        self._deadlines: Deadlines | None = None
        self._again: asyncio.TimerHandle | None = None  # the stop's next cancellation, while the handler ignores it
        self._waits: ExecutionWaits | None = None
        self._journal: ExecutionAudit | None = None
        self._children: ExecutionChildren | None = None
        self._quotas: ExecutionQuotas | None = None
        self.began = time.monotonic()

    # What only some handlers use is made on first use: a no-op job pays for none of it.
    @property
    def journal(self) -> ExecutionAudit:
        """ctx.tool_call / evidence / usage / step (worker/audit.py)."""
        if self._journal is None:
            self._journal = ExecutionAudit(self, self.env.config.prices, self.began)
        return self._journal

    @property
    def children(self) -> ExecutionChildren:
        """ctx.spawn / gather (worker/children.py)."""
        if self._children is None:
            self._children = ExecutionChildren(self)
        return self._children

    @property
    def quotas(self) -> ExecutionQuotas | None:
        """ctx.quota's leases (control/quota_blocks.py); None: this worker has no quota backend."""
        if self._quotas is None and self.env.quotas is not None:
            self._quotas = ExecutionQuotas(self.env.quotas, self.execution_id)
        return self._quotas

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
        # At once: the handler's next step may be a side effect.
        self._stop(f"OwnershipLost: job {job_id} epoch {self.fence.epoch}")

    def cancel(self) -> None:
        """A cancel request for the job: stop the handler; the finish writes `cancelled`."""
        if self.cancel_requested or self.lost:
            return
        self.cancel_requested = True
        self.stopping = self.stopping or "cancel"
        self._stop(f"JobCancelled: job {self.fence.job_id}")

    def shut_down(self) -> None:
        """The drain timed out: stop; the finish puts the job back (`worker_shutdown`)."""
        self.stopping = self.stopping or "shutdown"
        self._stop("worker shutdown")

    def _hard_timed_out(self, timeout_s: float | None) -> None:
        self.env.observer.timed_out()  # counted now, before its slot frees: health acts before the next claim
        self.timed_out_s = timeout_s
        self.stopping = self.stopping or "timeout"
        self._stop("hard timeout")

    def _stop(self, message: str) -> None:
        """Cancel the execution's task (never from inside it: there `check()` raises instead); while it is inside
        the handler, again every second (cleanup code may swallow one cancellation), and once `cancel_grace_s`
        passed, abandon the handler."""
        if self._deadlines is not None:
            self._deadlines.cancel()
        task = self.task
        if task is None or task.done() or task is asyncio.current_task() or self.abandoned:
            return
        task.cancel(message)
        if self.in_handler and self._again is None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.env.config.cancel_grace_s

            def again() -> None:
                self._again = None
                if not self.in_handler or task.done():
                    return
                if loop.time() >= deadline:
                    self._abandon(task)
                    return
                task.cancel(message)
                self._again = loop.call_at(min(deadline, loop.time() + 1.0), again)

            self._again = loop.call_at(min(deadline, loop.time() + 1.0), again)

    def _abandon(self, task: asyncio.Task[None]) -> None:
        """The handler ignored every cancellation for `cancel_grace_s`: it runs on in its task, which keeps the slot
        until it ends and writes nothing more; the finish is written by a task of its own."""
        self.abandoned = True
        self.closed = True  # its port refuses every later write
        self.env.abandoned.add(task)
        task.add_done_callback(self.env.abandoned.discard)
        log.error(
            "job %s: the handler ignored its cancellation for %.0f s; abandoned (it keeps its slot until it ends, and "
            "writes nothing more)",
            self.fence.job_id,
            self.env.config.cancel_grace_s,
        )
        self.task = asyncio.get_running_loop().create_task(self._finish_abandoned(), name=f"finish-{self.fence.job_id}")

    # -- the run -----------------------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Run the handler, then its finish CAS."""
        env, claim = self.env, self.claim
        bind_log_context(  # this task's own context: every line logged for this job names it
            job_id=claim.fence.job_id,
            execution_id=self.execution_id,
            worker_id=env.worker_id,
            agent=claim.agent,
            epoch=claim.fence.epoch,
        )
        try:
            finish = await self._outcome()
            if finish is not None:
                # The slot is execution capacity: free it now, while the finish waits for its round trip.
                self._free_slot()
                await self._write(finish)
        except asyncio.CancelledError:
            raise
        except BaseException:  # the last line: a defect of the worker's own, never the task group's end
            log.exception("execution of job %s failed inside the worker", claim.fence.job_id)
        finally:
            if self.abandoned:
                self._free_slot()  # the handler ended at last; its finish was another task's
            else:
                await self._end()

    async def _finish_abandoned(self) -> None:
        """The finish of an execution whose handler was abandoned (it still holds the slot)."""
        try:
            if not self.lost:
                await self._write(self._finish(self._stopped_outcome()))
        except asyncio.CancelledError:
            raise
        except BaseException:
            log.exception("execution of job %s failed inside the worker", self.fence.job_id)
        finally:
            await self._end()

    async def _outcome(self) -> Finish | None:
        """Run the handler and say what its finish writes (None: nothing, the job is no longer ours). Stopped
        from outside, the stop decides, whatever the handler returned or raised meanwhile; a cancellation that
        is not a stop (the worker's own) goes on."""
        try:
            result = await self._run_handler()
            if not self._stopped:
                return await self._success(result)
        except asyncio.CancelledError:
            if not self._stopped:
                raise
        except Exception as exc:
            if not self._stopped:
                outcome = outcome_of(exc)
                if outcome is None:
                    return None
                if outcome.code == "error":
                    log.info("job %s attempt %d raised %s", self.fence.job_id, self.attempt, outcome.message)
                return self._finish(outcome)
        task = asyncio.current_task()
        while task is not None and task.cancelling():
            task.uncancel()  # our own stop's cancellations, all of them (it may have repeated one)
        if self.lost or self.abandoned:
            return None
        return self._finish(self._stopped_outcome())

    @property
    def _stopped(self) -> bool:
        """Stopped from outside: the stop decides the outcome (nothing, for a lost claim)."""
        return self.stopping is not None or self.lost

    def _stopped_outcome(self) -> Outcome:
        if self.stopping == "cancel":
            return Outcome(JobState.CANCELLED, "cancelled", "cancelled")
        if self.stopping == "timeout":
            grace = self.env.config.cancel_grace_s
            outcome = outcome_of(HandlerTimeout(self.timed_out_s, not self.abandoned, grace))
            assert outcome is not None
            return outcome
        return Outcome(JobState.SCHEDULED, "worker_shutdown", "the worker shut down before the job finished")

    async def _write(self, finish: Finish) -> None:
        """The finish CAS (through the completer's batch), and what follows it."""
        env, claim = self.env, self.claim
        if self.lost:
            return
        # From here the finish CAS is the fence: a heartbeat that races it and no longer finds the claim
        # (because the finish just committed) must not cancel us.
        self.finishing = True
        await env.faults.hit("before_finish", {claim.agent})
        matched = await env.completer.finish(finish)
        if matched and finish.state is JobState.CANCELLED and self._children is not None:
            await self._children.cancel_unfinished()  # spawned after the cancel's own cascade read them
        dt = time.monotonic() - self.began
        env.observer.finished(claim, self.execution_id, finish.state, finish.error_code, dt, matched, not self.paused)
        if not matched and not self.lost:
            log.warning("finish of job %s matched no row: ownership was lost", claim.fence.job_id)

    def _free_slot(self) -> None:
        if self._slot_held:
            self._slot_held = False
            self.env.slots.free()

    async def _end(self) -> None:
        """The execution ended: its port writes nothing more, the worker forgets it, its leases go back."""
        self.closed = True
        if not self.abandoned:
            self._free_slot()
        try:
            await self._on_end(self.fence.job_id)
        except Exception:
            log.exception("ending the execution of job %s failed", self.fence.job_id)
        if self._quotas is not None and self._quotas.blocks:
            with contextlib.suppress(Exception):
                await self._quotas.release_all()

    async def _success(self, result: Any) -> Finish:
        result_json = await asyncio.to_thread(encode_result, result) if probably_large(result) else encode_result(result)
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
        self, state: JobState, *, result_json: str | None = None, error_code: str | None = None, error: str | None = None,
        delay: float = 0.0,
    ) -> Finish:  # fmt: skip
        usage = dumps(self.usage) if self.usage else None
        x = self
        return Finish(x.fence, x.execution_id, x.started_at, state, x.seq, result_json, error_code, error, delay, usage)

    async def _run_handler(self) -> Any:
        """Await the handler in this task, within its timeouts (`Deadlines`: a soft one reported, a hard one
        stopping it), and return its result or raise its error (`call_handler` makes every error an
        `Exception`)."""
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
        window = env.observer.record.durations.get(claim.agent)
        limits = timeouts_for(self.agent.spec, window, claim.timeout_s, env.config.hard_timeout_floor_s)
        if limits.soft_s is not None or limits.hard_s is not None:
            self._deadlines = Deadlines(limits, self._soft_timed_out, self._hard_timed_out, lambda: self.paused)
        self.in_handler = True
        try:
            return await call_handler(self.agent, ctx, payload, env.adapter)
        finally:
            self.in_handler = False
            if self._deadlines is not None:
                self._deadlines.cancel()
            if self._again is not None:
                self._again.cancel()
                self._again = None

    def _soft_timed_out(self, elapsed_s: float, threshold_s: float) -> None:
        """Past the soft timeout: logged, counted, and an `execution.soft_timeout` event joins the history."""
        self.env.observer.soft_timed_out(self.claim, self.execution_id, elapsed_s, threshold_s)
        if self.lost or self.closed or self.finishing:
            return
        self.seq += 1
        payload = dumps({"elapsed_s": round(elapsed_s, 3), "threshold_s": round(threshold_s, 3)})
        self.env.completer.append(NewEvent(self.fence, self.execution_id, self.seq, "execution.soft_timeout", payload))

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

    # -- pause and resume (ctx.next_input, ctx.approval, a coordinator's wait: worker/waits.py) ----------------------
    @property
    def waits(self) -> ExecutionWaits:
        if self._waits is None:
            self._waits = ExecutionWaits(self)
        return self._waits

    def command_arrived(self, seq: int) -> None:
        """The control loop saw command `seq` persisted for this job: wake a wait for it."""
        if self._waits is not None and seq > self._waits.command_seq:
            self._waits.ready.set()

    async def wait_command(self, kind: str, prompt: Any) -> Any:
        return await self.waits.wait_command(kind, prompt)

    def waiting(self, why: dict[str, Any]) -> AbstractAsyncContextManager[dict[str, Any]]:
        return self.waits.waiting(why)

    async def poll(self, ready: Callable[[], Awaitable[T | None]]) -> T:
        return await self.waits.poll(ready)

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
        if self._quotas is not None:
            await self._quotas.pause()

    async def resume_quotas(self) -> None:
        if self._quotas is not None:
            await self._quotas.resume()
