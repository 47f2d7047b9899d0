"""The `Context` a handler receives: its identity, its event stream, and the offload adapter.

Everything an execution writes goes through its `ExecutionPort`, which the worker implements with the
execution's fence: once the job is no longer owned by this (epoch, token), nothing more is written and
every call raises `OwnershipLost`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeVar

from tenure.contracts.text import clean_text, dumps
from tenure.kernel.audit import JournalPort, ToolCall, check_name
from tenure.kernel.children import ChildHandle, ChildrenPort, gather

T = TypeVar("T")


class ExecutionPort(ChildrenPort, Protocol):
    """What the worker provides to one execution's Context (`spawn` and `wait_children`: see ChildrenPort)."""

    async def emit(self, type: str, payload_json: str) -> None:
        """Queue one event for the durable history (fenced); waits only when the buffer is full."""
        ...

    async def flush(self) -> None:
        """Wait until every queued event of this execution is durable."""
        ...

    def check(self) -> None:
        """Raise OwnershipLost or JobCancelled if the execution must stop."""
        ...

    async def to_thread(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run a blocking callable through the worker's bounded adapter."""
        ...

    async def to_process(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run a CPU-bound callable in the worker's process pool."""
        ...

    def record_usage(self, counts: dict[str, float], model: str | None = None) -> None:
        """Add token / cost counters to this execution's usage record, and queue one usage record for its audit."""
        ...

    @property
    def journal(self) -> JournalPort:
        """The audit chain and the effect journal of this execution (docs/audit.md, docs/journal.md)."""
        ...

    def record_external(self, kind: str, seconds: float) -> None:
        """Record one timed external call (model, tool) of this execution (`tenure_external_seconds`)."""

    async def wait_command(self, kind: str, prompt: Any) -> Any:
        """Wait for the next persisted command of `kind` (`input`, `approve`) and return its payload. While it
        waits the job is `waiting` and the execution holds no worker slot."""

    # -- global quotas (docs/quotas.md) -----------------------------------------------------------------------------
    def quota(self, key: str, wait: bool, timeout_s: float | None) -> AbstractAsyncContextManager[object]:
        """One slot of the named global quota `key` for the duration of an `async with` block."""
        ...

    async def pause_quotas(self) -> None:
        """Release every quota lease of this execution while it waits (approval, input)."""
        ...

    async def resume_quotas(self) -> None:
        """Take back the released quota slots before the execution continues."""
        ...


class Context:
    """Handed to every handler: `await ctx.emit(...)`, `await ctx.to_thread(...)`, `ctx.usage(...)`,
    `ctx.tool_call(...)`, `await ctx.evidence(...)`, `await ctx.step(...)`, `await ctx.spawn(...)`."""

    __slots__ = ("_port", "agent", "attempt", "epoch", "execution_id", "job_id", "log", "mode", "tenant", "worker_id")

    def __init__(
        self,
        port: ExecutionPort,
        *,
        job_id: str,
        execution_id: str,
        epoch: int,
        attempt: int,
        agent: str,
        tenant: str,
        worker_id: str,
        mode: str | None = None,
    ) -> None:
        self._port = port
        self.job_id = job_id
        self.execution_id = execution_id
        self.epoch = epoch
        self.attempt = attempt
        self.agent = agent
        self.tenant = tenant
        self.worker_id = worker_id
        self.mode = mode  # the mode it runs in (mode_effective) when its agent declares modes=, else None
        self.log = logging.getLogger(f"tenure.agent.{agent}")

    async def emit(self, type: str, payload: Any = None) -> None:
        """Append an event to this job's durable history (then to live subscribers).

        Events are buffered and written in batches; `emit` returns once the event is queued and waits only
        when this execution has too many unwritten events. Raises `OwnershipLost` once the job is no longer
        owned by this execution.
        """
        if not isinstance(type, str) or not type or len(type) > 200 or clean_text(type) != type:
            raise ValueError(f"an event type is a non-empty string of at most 200 characters, not {type!r}")
        await self._port.emit(type, dumps(payload))

    async def flush(self) -> None:
        """Wait until every event emitted so far is durable."""
        await self._port.flush()

    def check(self) -> None:
        """Raise if this execution should stop (ownership lost or job cancelled)."""
        self._port.check()

    async def to_thread(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run blocking code (sync I/O, sync SDKs) off the event loop, bounded by the worker's adapter."""
        return await self._port.to_thread(fn, *args, **kwargs)

    async def to_process(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Run CPU-bound code in a process pool (the callable and arguments must pickle)."""
        return await self._port.to_process(fn, *args, **kwargs)

    @contextlib.asynccontextmanager
    async def external(self, kind: str) -> AsyncIterator[None]:
        """Time an external call (a model or tool call) as `tenure_external_seconds{agent, kind}`:

            async with ctx.external("model"):
                reply = await client.chat(...)

        The time is recorded whether the call returns or raises. Only the wall time of the block is
        measured: wrap the await of the call, not the processing of its result.
        """
        began = time.monotonic()
        try:
            yield
        finally:
            self._port.record_external(kind, time.monotonic() - began)

    def usage(self, model: str | None = None, **counts: float) -> None:
        """Record usage (e.g. `ctx.usage(model="gpt-4o", input_tokens=812, output_tokens=95)`) on this execution.

        Each call adds to the execution's usage totals and queues one usage record for the job's audit (written
        with the next batch of events, no round trip of its own). `cost_usd` is computed from `TENURE_PRICES`
        when the model has a price there and the counts carry no `cost_usd` of their own (docs/audit.md)."""
        self._port.record_usage(counts, None if model is None else check_name(model, "a model name"))

    # -- the audit chain (docs/audit.md) -----------------------------------------------------------------------------
    def tool_call(self, name: str, args: Any = None) -> ToolCall:
        """Record one tool call in the job's audit:

            async with ctx.tool_call("search", {"q": q}) as call:
                call.result(await search(q))

        One record when the block ends (name, arguments, result or error, start, end, duration), written with
        the execution's events; an exception inside is recorded as the error and re-raised."""
        return ToolCall(self._port.journal, name, args)

    async def evidence(self, kind: str, content: Any) -> None:
        """Keep an intermediate output or the final report in the job's audit, under `kind` ("source",
        "report", ...). Returns once it is durable; raises `OwnershipLost` if the job is no longer ours."""
        await self._port.journal.audit("evidence", check_name(kind, "an evidence kind"), dumps(content), None, None, True)

    # -- the effect journal (docs/journal.md) ------------------------------------------------------------------------
    async def step(self, key: str, fn: Callable[..., Awaitable[T]] | Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` at most once for this job and `key`; its JSON result is stored before `step` returns,
        and a later attempt of the job gets the stored result without running `fn` (a plain function runs
        through the blocking adapter). A step an earlier attempt began and never ended raises `StepUnknown`:
        look at the effect and record what you decided with `resolve_step`. If `fn` raises, nothing is recorded
        and the error goes on (a later call runs it again)."""
        result: T = await self._port.journal.step(check_name(key, "a step key"), fn, args)
        return result

    async def resolve_step(self, key: str, result: Any = None) -> None:
        """Record `result` for the step `key` that an earlier attempt began and never ended (after `StepUnknown`):
        later attempts get it from `step` as if the step had returned it."""
        await self._port.journal.resolve_step(check_name(key, "a step key"), dumps(result))

    # -- pause and resume: human input and approval ---------------------------------------------------------------
    async def next_input(self) -> Any:
        """Wait for the next input sent to this job (`POST /v1/jobs/{id}/input`, `tenure.client`) and return it.

        While waiting the job is `waiting` and frees its worker slot; it takes one back before returning.
        Inputs are persisted before delivery, so one sent before this call is returned at once, in order."""
        return await self._port.wait_command("input", None)

    async def approval(self, prompt: str) -> bool:
        """Ask for an approval (`POST /v1/jobs/{id}/approve`, `tenure approve ID`) and wait for the answer.

        `prompt` travels in the `job.waiting` event. Returns True when approved, False when rejected."""
        answer = await self._port.wait_command("approve", prompt)
        return bool(answer.get("approved", False)) if isinstance(answer, dict) else bool(answer)

    # -- global quotas (docs/quotas.md) -----------------------------------------------------------------------------
    def quota(self, key: str, *, wait: bool = True, timeout_s: float | None = None) -> AbstractAsyncContextManager[object]:
        """Hold one slot of the global quota `key` (configured in TENURE_QUOTAS or tenure.toml) for a block:

            async with ctx.quota("llm:gpt-4o"):
                ...  # call the model

        `wait=False` raises `QuotaExhausted` at once when every slot is held; `wait=True` waits in a FIFO line
        shared by all workers, up to `timeout_s` (None: no limit). If the lease is lost (not renewed in time),
        the block is cancelled and raises `LeaseLost`: the upstream call must not continue on it. When the
        lease backend is down, a fail-closed key raises `QuotaUnavailable`; a fail-open key runs unleased.
        """
        return self._port.quota(key, wait, timeout_s)

    # -- coordinators (docs/coordinators.md) ----------------------------------------------------------------------
    async def spawn(
        self,
        agent: str,
        input: Any = None,
        *,
        key: str,
        priority: int | None = None,
        max_attempts: int | None = None,
        deadline_s: float | None = None,
    ) -> ChildHandle:
        """Admit a child job of agent `agent` with `input`, through the same admission door as any job (queue
        caps, known agents, budgets), in this job's tenant, and answer its handle at once (the child runs on any
        worker). Idempotent per this job and `key`: a later attempt of this job that spawns `key` again gets the
        same child (the same `key` with another input is `IdempotencyConflict`)."""
        if not isinstance(key, str) or not key:
            raise ValueError(f"a spawn key is a non-empty string, not {key!r}")
        options = {"priority": priority, "max_attempts": max_attempts, "deadline_s": deadline_s}
        job_id, created = await self._port.spawn(agent, input, key, options)
        return ChildHandle(job_id, agent, key, created, self._port)

    async def gather(self, *handles: ChildHandle, return_exceptions: bool = False) -> list[Any]:
        """Wait until every child is terminal and answer their results in order. The wait is one: the job is
        `waiting` meanwhile and holds no worker slot and no quota lease (like `approval`). A child that ended
        other than `succeeded` raises `ChildFailed` (the first one, in order) after all have ended; with
        `return_exceptions=True` its `ChildFailed` takes its place in the list instead."""
        return await gather(handles, return_exceptions)
