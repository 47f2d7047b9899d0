"""A worker's execution capacity: `concurrency` slots, taken before a claim is sent and freed when a handler ends.

Seed 003's rule ("hold a slot before you read the queue"): the claim loop asks the store for at most as many
jobs as there are free slots, so nothing is ever claimed that this worker cannot start at once. A waiting
execution (approval, input) gives its slot back and takes it again to continue, briefly over the limit at
worst (the claim loop then claims nothing). A handler that ignored its cancellation keeps its slot until it
really ends: capacity shrinks, visibly, rather than letting one more handler run than the limit allows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class Slots:
    """`capacity` slots: `take`, `free`, and `freed` for the claim loop to wait on."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.busy = 0
        self._freed = asyncio.Event()

    @property
    def available(self) -> int:
        """Slots free now (negative while a resumed execution runs over the limit)."""
        return self.capacity - self.busy

    def take(self, n: int = 1) -> None:
        """Take `n` slots (for claims about to be sent, or an execution resuming from a wait)."""
        self.busy += n

    def free(self) -> None:
        """Give one slot back and wake the claim loop."""
        self.busy -= 1
        self._freed.set()

    def freed(self) -> Coroutine[Any, Any, bool]:
        """Awaitable: done when a slot is freed from now on (the caller re-checks `available`)."""
        self._freed.clear()
        return self._freed.wait()
