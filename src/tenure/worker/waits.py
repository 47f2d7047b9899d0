"""How one execution pauses and resumes: `ctx.next_input`, `ctx.approval` and a coordinator's wait for its
children (worker/children.py), as the worker provides them to the handler's `Context`.

A waiting job holds no worker slot and no quota lease (seed 003: pause / resume); it reads its commands (persisted
by the gateway before delivery) or its children once per poll interval, growing from `_WAIT_POLL_MIN_S` to
`_WAIT_POLL_MAX_S`, woken early by the control loop when a command or a cancel arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

from tenure.contracts.errors import StoreUnavailable
from tenure.contracts.store import JobStore
from tenure.contracts.text import dumps
from tenure.contracts.types import Command, Fence, NewEvent
from tenure.worker.slots import Slots

log = logging.getLogger("tenure.worker")
T = TypeVar("T")

_WAIT_POLL_MIN_S = 0.05
_WAIT_POLL_MAX_S = 1.0


class _Env(Protocol):
    store: JobStore
    slots: Slots


class Execution(Protocol):
    """What of its execution a wait needs (worker/execution.py: its fence, sequence and stop)."""

    @property
    def env(self) -> _Env: ...

    fence: Fence
    execution_id: str
    seq: int
    paused: bool

    def check(self) -> None: ...

    def lose(self) -> None: ...

    async def flush(self) -> None: ...

    async def pause_quotas(self) -> None: ...

    async def resume_quotas(self) -> None: ...


class ExecutionWaits:
    """The commands and waits of one execution (made on its first wait)."""

    def __init__(self, execution: Execution) -> None:
        self._x = execution
        self.command_seq = 0  # the last command read from the store
        self.commands: list[Command] = []  # read, not yet consumed (another kind than the one awaited)
        self.ready = asyncio.Event()  # set by the control loop when a new command is persisted

    def _take_command(self, kind: str) -> Command | None:
        for i, c in enumerate(self.commands):
            if c.kind == kind:
                return self.commands.pop(i)
        return None

    async def _read_commands(self) -> None:
        new = await self._x.env.store.read_commands(self._x.fence.job_id, self.command_seq)
        if new:
            self.command_seq = new[-1].seq
            self.commands.extend(new)

    async def _set_waiting(self, waiting: bool, payload: dict[str, Any]) -> None:
        x = self._x
        await x.flush()  # the history stays in order: everything emitted before goes first
        x.seq += 1
        x.paused = x.paused or waiting
        event = NewEvent(x.fence, x.execution_id, x.seq, "job.waiting" if waiting else "job.resumed", dumps(payload))
        if not await x.env.store.set_waiting(event, waiting):
            x.lose()
            x.check()

    async def wait_command(self, kind: str, prompt: Any) -> Any:
        self._x.check()
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
        x = self._x
        await self._set_waiting(True, why)
        await x.pause_quotas()  # waiting holds no quota lease either (seed 003: pause / resume)
        x.env.slots.free()  # waiting holds no worker slot
        resumed: dict[str, Any] = {}
        try:
            yield resumed
        finally:
            x.env.slots.take()  # a slot back (briefly over the limit at worst: no new claims)
        await x.resume_quotas()  # the leases are taken back before the handler continues
        await self._set_waiting(False, resumed)

    async def poll(self, ready: Callable[[], Awaitable[T | None]]) -> T:
        """`await ready()` until it answers something, woken by the control loop (NOTIFY / polling hint: a new
        command or a cancel) or by a growing poll, the floor (`_WAIT_POLL_MIN_S` to `_WAIT_POLL_MAX_S`): a
        waiting job costs one read per interval, never a busy loop. Raises once the execution must stop."""
        delay = _WAIT_POLL_MIN_S
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.ready.wait(), delay)
            self.ready.clear()
            self._x.check()
            try:
                got = await ready()
            except StoreUnavailable as exc:
                log.warning("job %s: reading what it waits for failed: %s", self._x.fence.job_id, exc)
                got = None
            if got is not None:
                return got
            delay = min(delay * 1.5, _WAIT_POLL_MAX_S)
