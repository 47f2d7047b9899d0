"""One execution's quota blocks: `async with ctx.quota(key):` is a `QuotaBlock` of the execution's
`ExecutionQuotas`, on the process's `QuotaManager` (control/quotas.py, whose module docstring describes the whole).

    ExecutionQuotas     one per execution: hands out holder ids `<execution id>:<slot>`, pauses and resumes
    QuotaBlock          one `async with`: acquire on enter, release on exit, LeaseLost if the lease was lost
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from types import TracebackType
from typing import TYPE_CHECKING

from tenure.contracts.errors import LeaseLost
from tenure.contracts.quotas import QuotaSpec
from tenure.contracts.store import LeaseRef

if TYPE_CHECKING:
    from tenure.control.quotas import QuotaManager


class QuotaBlock:
    """One `async with ctx.quota(key)`: a held slot for the duration of the block.

    A block that ends normally gives its slot back at once; one that ends with an exception or a cancellation
    leaves its lease to expire within one TTL (see `_abandon`). If the lease is lost while the block runs,
    the task running the block is cancelled and the block raises `LeaseLost` instead of `CancelledError`
    (the way `asyncio.timeout` turns its cancellation into `TimeoutError`).
    """

    def __init__(self, owner: ExecutionQuotas, spec: QuotaSpec, *, wait: bool, timeout_s: float | None) -> None:
        self._owner = owner
        self.spec = spec
        self._wait = wait
        self._timeout_s = timeout_s
        self.ref: LeaseRef | None = None
        self.leased = False
        self.lost = False
        self.paused = False
        self._task: asyncio.Task[object] | None = None
        self._cancel_pending = False

    async def __aenter__(self) -> QuotaBlock:
        self._task = asyncio.current_task()
        self.ref = LeaseRef(self.spec.key, self._owner.next_holder())
        await self._take(wait=self._wait, timeout_s=self._timeout_s)
        self._owner.blocks.append(self)
        return self

    async def _take(self, *, wait: bool, timeout_s: float | None) -> None:
        assert self.ref is not None
        manager = self._owner.manager
        valid_until = await manager.acquire_until(self.spec, self.ref.holder, wait=wait, timeout_s=timeout_s)
        self.leased = valid_until is not None
        if valid_until is not None:
            manager._track(self.ref, self._on_lost, valid_until)

    def _on_lost(self) -> None:
        if self.lost or self.paused:
            return
        self.lost = True
        if self._task is not None and not self._task.done():
            self._cancel_pending = True
            assert self.ref is not None
            self._task.cancel(f"LeaseLost: {self.ref.key} {self.ref.holder}")

    async def pause(self) -> None:
        """Give the slot back while the execution waits (for a human, for input)."""
        if self.leased and not self.paused and self.ref is not None:
            self.paused = True
            self.leased = False
            await self._owner.manager.release(self.ref)

    async def resume(self) -> None:
        """Take a slot again before the execution continues (waits in line like any other acquirer)."""
        if self.paused:
            await self._take(wait=True, timeout_s=None)
            self.paused = False

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        with contextlib.suppress(ValueError):
            self._owner.blocks.remove(self)
        if self._cancel_pending and self._task is not None:
            self._cancel_pending = False
            if exc_type is None or not issubclass(exc_type, asyncio.CancelledError):
                # Our cancellation has not been delivered yet: take it here, so it does not hit a later await.
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(0)
            if self._task.uncancel() > 0:
                self._abandon()
                return False  # someone else cancelled the task too: let that cancellation through
        if exc_type is None or self.lost:
            await self._give_back()
        else:
            self._abandon()
        if self.lost:
            assert self.ref is not None
            cause = None if exc_type is None or issubclass(exc_type, asyncio.CancelledError) else exc
            raise LeaseLost(
                f"the lease on quota {self.ref.key!r} was lost while in use", self.ref.key, self.ref.holder
            ) from cause
        return False

    def _abandon(self) -> None:
        """The block ended abnormally (an exception, a cancellation): the upstream call it guarded may still
        be running on the other side — a closed connection is noticed by the server only later. Giving the
        slot back now could let the next holder in before the server has counted this call out, and the
        server would answer 429. So the lease is only no longer renewed: it expires within one TTL."""
        if self.ref is not None and self.leased:
            self.leased = False
            self._owner.manager._untrack(self.ref)

    async def _give_back(self) -> None:
        if self.ref is None:
            return
        if self.leased or self.lost:
            self.leased = False
            await self._owner.manager.release(self.ref)


class ExecutionQuotas:
    """The quota blocks of one execution, and the pause / resume hooks of `ctx.approval()` and
    `ctx.next_input()` (which release every lease while waiting and take them back before continuing)."""

    def __init__(self, manager: QuotaManager, execution_id: str) -> None:
        self.manager = manager
        self.execution_id = execution_id
        self.blocks: list[QuotaBlock] = []
        self._slots = itertools.count()

    def next_holder(self) -> str:
        """A holder id no other block of this execution uses: `<execution id>:<slot>`."""
        return f"{self.execution_id}:{next(self._slots)}"

    def quota(self, key: str, *, wait: bool = True, timeout_s: float | None = None) -> QuotaBlock:
        """`async with quotas.quota(key):` holds one slot of `key` for the block."""
        if timeout_s is not None and timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0, got {timeout_s}")
        return QuotaBlock(self, self.manager.spec(key), wait=wait, timeout_s=timeout_s)

    async def pause(self) -> None:
        """Release every lease this execution holds (it keeps its blocks open)."""
        for block in list(self.blocks):
            await block.pause()

    async def resume(self) -> None:
        """Take back a slot for every paused block, oldest block first."""
        for block in list(self.blocks):
            await block.resume()

    async def release_all(self) -> None:
        """The execution ended: release whatever its blocks still hold (a safety net: blocks release on
        exit)."""
        for block in list(self.blocks):
            await block._give_back()
        self.blocks.clear()
