"""The `Context` a handler receives: its identity, its event stream, and the offload adapter.

Everything an execution writes goes through its `ExecutionPort`, which the worker implements with the
execution's fence: once the job is no longer owned by this (epoch, token), nothing more is written and
every call raises `OwnershipLost`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeVar

from tenure.contracts.text import clean_text, dumps

T = TypeVar("T")


class ExecutionPort(Protocol):
    """What the worker provides to one execution's Context."""

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

    def record_usage(self, counts: dict[str, float]) -> None:
        """Add token / cost counters to this execution's usage record."""
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
    """Handed to every handler: `await ctx.emit(...)`, `await ctx.to_thread(...)`, `ctx.usage(...)`."""

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

    def usage(self, **counts: float) -> None:
        """Record usage (e.g. input_tokens=812, output_tokens=95, cost_usd=0.01) on this execution."""
        self._port.record_usage(counts)

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
